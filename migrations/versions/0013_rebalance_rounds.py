"""Rebalance rounds: several instances share one round, each host planned once per round.

`rebalance_rounds` holds a round per selection of hosts (open while `open_key`
is set: unique, so instances starting together join one round);
`rebalance_round_hosts` says which host is done, by whom, with which plan.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rebalance_rounds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("open_key", sa.String(64), nullable=True),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("opened_by", sa.String(128), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rebalance_rounds")),
        sa.UniqueConstraint("open_key", name=op.f("uq_rebalance_rounds_open_key")),
    )
    op.create_index("ix_rebalance_rounds_key_finished_at", "rebalance_rounds", ["key", "finished_at"])
    op.create_table(
        "rebalance_round_hosts",
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("claimed_by", sa.String(128), nullable=True),
        sa.Column("done_by", sa.String(128), nullable=True),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("plan_id", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.String(32), nullable=True),
        sa.ForeignKeyConstraint(["round_id"], ["rebalance_rounds.id"],
                                name=op.f("fk_rebalance_round_hosts_round_id_rebalance_rounds"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("round_id", "host", name=op.f("pk_rebalance_round_hosts")),
    )


def downgrade() -> None:
    op.drop_table("rebalance_round_hosts")
    op.drop_index("ix_rebalance_rounds_key_finished_at", table_name="rebalance_rounds")
    op.drop_table("rebalance_rounds")
