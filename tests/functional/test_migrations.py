"""Alembic migrations on real SQLite and real PostgreSQL: up, down, and no drift from the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from vmplacer.adapters.db import migrate
from vmplacer.adapters.db.engine import make_engine
from vmplacer.adapters.db.models import Base

TABLES = {"hosts", "placements", "cpu_claims", "audit_log"}


def test_upgrade_to_head_then_downgrade_to_base(database_url):
    migrate.upgrade(database_url, "head")
    engine = make_engine(database_url)
    try:
        assert TABLES <= set(inspect(engine).get_table_names())
        assert migrate.current_revision(engine) == migrate.head_revision()
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        assert diff == [], f"models and migrations differ: {diff}"
        migrate.downgrade(database_url, "base")
        remaining = set(inspect(engine).get_table_names()) - {"alembic_version"}
        assert remaining == set()
        assert migrate.current_revision(engine) is None
        migrate.upgrade(database_url, "head")  # and back up again: migrations are repeatable
        assert TABLES <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_sqlite_uses_wal(sqlite_url):
    migrate.upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
    engine.dispose()
