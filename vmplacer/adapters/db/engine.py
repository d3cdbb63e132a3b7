"""Engine and session factory; SQLite gets WAL and foreign keys, both backends
get the same schema through Alembic."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            # WAL's recommended setting: a commit survives a crash of vmplacer (not of the OS
            # or the power) without an fsync; FULL costs ~4 ms per commit on a shared disk,
            # inside the host lock of every placement (docs/operations.md, "SQLite durability").
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        _one_writer_at_a_time(engine)
        return engine
    return create_engine(url, pool_pre_ping=True)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


WRITES = ("INSERT", "UPDATE", "DELETE", "REPLAC")  # REPLACE


def _one_writer_at_a_time(engine: Engine) -> None:
    """Let one of this process's connections write to a SQLite file at a time.

    SQLite takes one writer at a time anyway; the others wait in its busy handler, which
    sleeps 1, 2, 5 … up to 100 ms between tries, so under concurrent requests a commit that
    takes 1 ms waited tens of ms. Here the next writer wakes as soon as the lock is free.
    The lock is taken at a connection's first write and released when the connection goes
    back to the pool (after its commit or rollback); readers never take it (WAL). Re-entrant:
    a thread writing on a second connection meets SQLite's own lock, as it did before."""
    writer = threading.RLock()

    @event.listens_for(engine, "before_cursor_execute")
    def _take(connection, _cursor, statement, _parameters, _context, _many) -> None:  # type: ignore[no-untyped-def]
        info = connection.info
        if not info.get("vmplacer_writing") and statement.lstrip()[:6].upper() in WRITES:
            writer.acquire()
            info["vmplacer_writing"] = True

    @event.listens_for(engine, "reset")
    def _give_back(_dbapi_connection, record, _state) -> None:  # type: ignore[no-untyped-def]
        if record.info.pop("vmplacer_writing", False):
            writer.release()

    @event.listens_for(engine, "close")
    def _closed(_dbapi_connection, record) -> None:  # type: ignore[no-untyped-def]
        if record is not None and record.info.pop("vmplacer_writing", False):
            writer.release()
