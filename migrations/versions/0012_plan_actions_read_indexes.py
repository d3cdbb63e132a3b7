"""Plan actions: an index on (state, kind, finished_at) for the reads of every run and scrape.

Every rebalance run reads the last day's finished trial probes (the trials'
memory) and the moves that succeeded within the cool-down; every /metrics
scrape counts the last day's trials and all actions by state. Without the index
each read scans every action of the plans kept (a month by default); with it,
the recent reads are ranges of the index (state and kind equal, finished_at
from the window's start) and the count by state reads the index alone.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

INDEX = "ix_plan_actions_state_kind_finished_at"


def upgrade() -> None:
    op.create_index(INDEX, "plan_actions", ["state", "kind", "finished_at"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="plan_actions")
