"""Hosts: maintenance mode (no new guests, no migrations in) with who, when and why.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("maintenance_since", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("maintenance_by", sa.String(128), nullable=True))
        batch.add_column(sa.Column("maintenance_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("maintenance_reason")
        batch.drop_column("maintenance_by")
        batch.drop_column("maintenance_since")
