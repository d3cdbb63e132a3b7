"""Rebalancing: plans, their actions, and per-host leases.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plans",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("hosts", sa.JSON(), nullable=False),
        sa.Column("objective_before", sa.Float(), nullable=False),
        sa.Column("objective_after", sa.Float(), nullable=False),
        sa.Column("predicted", sa.JSON(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_plans")),
    )
    op.create_index(op.f("ix_plans_state"), "plans", ["state"])
    op.create_table(
        "plan_actions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(24), nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("guest", sa.String(64), nullable=True),
        sa.Column("target_host", sa.String(64), nullable=True),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("predicted_gain", sa.Float(), nullable=False),
        sa.Column("cost", sa.JSON(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("depends_on", sa.JSON(), nullable=False),
        sa.Column("parameters", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name=op.f("fk_plan_actions_plan_id_plans"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_plan_actions")),
        sa.UniqueConstraint("plan_id", "seq", name=op.f("uq_plan_actions_plan_id_seq")),
    )
    op.create_index(op.f("ix_plan_actions_plan_id"), "plan_actions", ["plan_id"])
    op.create_index(op.f("ix_plan_actions_guest"), "plan_actions", ["guest"])
    op.create_table(
        "host_leases",
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(128), nullable=True),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("host", name=op.f("pk_host_leases")),
    )


def downgrade() -> None:
    op.drop_table("host_leases")
    op.drop_index(op.f("ix_plan_actions_guest"), table_name="plan_actions")
    op.drop_index(op.f("ix_plan_actions_plan_id"), table_name="plan_actions")
    op.drop_table("plan_actions")
    op.drop_index(op.f("ix_plans_state"), table_name="plans")
    op.drop_table("plans")
