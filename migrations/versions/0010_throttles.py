"""Throttles: CPU bandwidth limits vmplacer set on guests, with the protected guest each serves.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "throttles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("guest", sa.String(64), nullable=False),
        sa.Column("bandwidth", sa.JSON(), nullable=False),
        sa.Column("original", sa.JSON(), nullable=False),
        sa.Column("protects", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_throttles")),
        sa.UniqueConstraint("host", "guest", name=op.f("uq_throttles_host_guest")),
    )


def downgrade() -> None:
    op.drop_table("throttles")
