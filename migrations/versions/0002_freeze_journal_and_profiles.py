"""Freeze'nSense: the freeze journal, profiling runs and their samples.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "freeze_journal",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("domains", sa.JSON(), nullable=False),
        sa.Column("owner", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_freeze_journal")),
    )
    op.create_index(op.f("ix_freeze_journal_host"), "freeze_journal", ["host"])
    op.create_table(
        "profile_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("metric", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("parameters", sa.JSON(), nullable=False),
        sa.Column("results", sa.JSON(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_profile_runs")),
    )
    op.create_index(op.f("ix_profile_runs_host"), "profile_runs", ["host"])
    op.create_table(
        "profile_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("guest", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("metric", sa.String(16), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("window_s", sa.Float(), nullable=False),
        sa.Column("t_m_ms", sa.Float(), nullable=False),
        sa.Column("freeze_ms", sa.Float(), nullable=True),
        sa.Column("neighbours", sa.JSON(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["profile_runs.id"], name=op.f("fk_profile_samples_run_id_profile_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_profile_samples")),
    )
    op.create_index(op.f("ix_profile_samples_run_id"), "profile_samples", ["run_id"])
    op.create_index(op.f("ix_profile_samples_guest"), "profile_samples", ["guest"])


def downgrade() -> None:
    op.drop_index(op.f("ix_profile_samples_guest"), table_name="profile_samples")
    op.drop_index(op.f("ix_profile_samples_run_id"), table_name="profile_samples")
    op.drop_table("profile_samples")
    op.drop_index(op.f("ix_profile_runs_host"), table_name="profile_runs")
    op.drop_table("profile_runs")
    op.drop_index(op.f("ix_freeze_journal_host"), table_name="freeze_journal")
    op.drop_table("freeze_journal")
