"""Engine and session factory; SQLite gets WAL and foreign keys, both backends
get the same schema through Alembic."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


# A pooled server connection used this recently is taken as alive without a round trip.
IDLE_PING_S = 5.0
_clock = time.monotonic


def make_engine(url: str, **pool: Any) -> Engine:
    """The engine for `url`; `pool`: pool settings of a server process (its request threads)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, **pool)

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
    engine = create_engine(url, **pool)
    _ping_when_idle(engine)
    return engine


def _ping_when_idle(engine: Engine, idle_s: float = IDLE_PING_S) -> None:
    """Ping a pooled connection before use only if it sat idle for `idle_s` or more.

    A ping on every checkout (`pool_pre_ping`) is a round trip per session, about a
    dozen per placement. A connection returned moments ago is almost surely alive; if the
    server went away meanwhile, its first statement fails (that request answers 503
    `database-unavailable`), SQLAlchemy discards the pool's connections, and the next
    request connects afresh. A dead connection found by a ping is replaced at once."""

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection, record, _proxy) -> None:  # type: ignore[no-untyped-def]
        last = record.info.get("vmplacer_returned_at")
        if last is not None and _clock() - last < idle_s:
            return
        try:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute("SELECT 1")
            finally:
                cursor.close()
        except Exception as exc:  # noqa: BLE001 - any failure: a connection not worth keeping
            raise DisconnectionError(f"pooled connection is dead: {exc}") from exc

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_connection, record) -> None:  # type: ignore[no-untyped-def]
        if record is not None:
            record.info["vmplacer_returned_at"] = _clock()


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
