"""Guest names up to libvirt's limit: every column holding a domain name is 255 characters.

A persistent domain's configuration is the file NAME.xml, so libvirt takes
names up to 251 bytes; the API accepts them (profiling targets, guests found
on a host), and plans, samples, throttles and the audit log store them.

SQLite rebuilds each table (it cannot alter a column in place). Foreign keys
are switched off around the rebuild, as SQLite's documented procedure says:
dropping the old `placements` would otherwise cascade to its CPU claims.
A downgrade refuses (PostgreSQL: value too long) while longer names are stored.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# table -> its columns holding a domain name
GUEST_COLUMNS: dict[str, tuple[str, ...]] = {
    "placements": ("guest",),
    "audit_log": ("guest",),
    "throttles": ("guest", "protects"),
    "profile_samples": ("guest",),
    "plan_actions": ("guest",),
}
NULLABLE = {("audit_log", "guest"), ("plan_actions", "guest")}


def _resize(old: int, new: int) -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        _foreign_keys(False)
    for table, columns in GUEST_COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            for column in columns:
                batch.alter_column(column, existing_type=sa.String(old), type_=sa.String(new),
                                   existing_nullable=(table, column) in NULLABLE)
    if sqlite:
        broken = op.get_bind().exec_driver_sql("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise RuntimeError(f"foreign keys broken by the table rebuild: {broken}")
        _foreign_keys(True)


def _foreign_keys(on: bool) -> None:
    """PRAGMA foreign_keys takes effect only outside a transaction."""
    with op.get_context().autocommit_block():
        op.get_bind().exec_driver_sql(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")


def upgrade() -> None:
    _resize(64, 255)


def downgrade() -> None:
    _resize(255, 64)
