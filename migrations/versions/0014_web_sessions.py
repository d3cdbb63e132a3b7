"""Web view sign-ins kept on the server: `web_sessions` holds one row per signed-in browser.

The cookie carries a random id; the row holds its SHA-256, the token's owner and scope (never
the token), when it began, when it was last used and when it ends. Revoking the token deletes
its rows (ON DELETE CASCADE).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id_hash", sa.String(64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("token_scope", sa.String(8), nullable=False),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["token_id"], ["api_tokens.id"],
                                name=op.f("fk_web_sessions_token_id_api_tokens"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_web_sessions")),
    )
    op.create_index(op.f("ix_web_sessions_token_id"), "web_sessions", ["token_id"])
    op.create_index(op.f("ix_web_sessions_expires_at"), "web_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_web_sessions_expires_at"), table_name="web_sessions")
    op.drop_index(op.f("ix_web_sessions_token_id"), table_name="web_sessions")
    op.drop_table("web_sessions")
