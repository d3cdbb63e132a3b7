"""Plans: cancel requests for running plans; plans without actions become `empty`.

Upgrade adds the nullable cancel-request columns and marks stored proposed
plans that have no action `empty` (final: there was never anything to apply).
Downgrade drops the columns and maps the two new states to ones the previous
schema's code reads: `empty` → `proposed`, `cancelled` → `failed` (the
plan's message still says who cancelled it).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_plans = sa.table("plans", sa.column("id", sa.Integer()), sa.column("state", sa.String(16)))
_actions = sa.table("plan_actions", sa.column("plan_id", sa.Integer()))


def upgrade() -> None:
    with op.batch_alter_table("plans") as batch:
        batch.add_column(sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("cancel_requested_by", sa.String(128), nullable=True))
        batch.add_column(sa.Column("cancel_reason", sa.Text(), nullable=True))
    has_actions = sa.exists().where(_actions.c.plan_id == _plans.c.id)
    op.execute(_plans.update().where(_plans.c.state == "proposed", ~has_actions).values(state="empty"))


def downgrade() -> None:
    op.execute(_plans.update().where(_plans.c.state == "empty").values(state="proposed"))
    op.execute(_plans.update().where(_plans.c.state == "cancelled").values(state="failed"))
    with op.batch_alter_table("plans") as batch:
        batch.drop_column("cancel_reason")
        batch.drop_column("cancel_requested_by")
        batch.drop_column("cancel_requested_at")
