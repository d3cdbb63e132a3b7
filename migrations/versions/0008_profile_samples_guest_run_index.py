"""Profile samples: an index on (guest, run_id) for each guest's newest run.

Retention keeps every guest's newest profile run; finding them is a grouped
max over this index instead of a scan of every sample.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-21
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_profile_samples_guest_run_id", "profile_samples", ["guest", "run_id"])


def downgrade() -> None:
    op.drop_index("ix_profile_samples_guest_run_id", table_name="profile_samples")
