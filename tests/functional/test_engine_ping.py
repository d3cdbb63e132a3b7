"""Pooled PostgreSQL connections: pinged only after sitting idle, and a dead one never sticks
(a real server; its backends terminated as a restart would)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from vmplacer.adapters.db import engine as module


def _terminate(url: str, pid: int) -> None:
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            assert connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
    finally:
        admin.dispose()


def _backend(engine) -> int:  # type: ignore[no-untyped-def]
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT pg_backend_pid()")).scalar())


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(module, "_clock", lambda: now[0])
    return now


def test_a_dead_connection_idle_long_enough_is_found_by_the_ping_and_replaced(postgres_url, clock):
    engine = module.make_engine(postgres_url, pool_size=1, max_overflow=0)
    try:
        first = _backend(engine)
        assert _backend(engine) == first  # returned moments ago: the same connection, reused
        _terminate(postgres_url, first)
        clock[0] += module.IDLE_PING_S
        assert _backend(engine) != first  # the ping failed, a new connection answered
    finally:
        engine.dispose()


def test_a_dead_connection_used_moments_ago_fails_once_then_the_pool_reconnects(postgres_url, clock):
    engine = module.make_engine(postgres_url, pool_size=1, max_overflow=0)
    try:
        first = _backend(engine)
        _terminate(postgres_url, first)
        with pytest.raises(OperationalError):  # no ping within the idle window: the statement finds out
            _backend(engine)
        assert _backend(engine) != first
    finally:
        engine.dispose()
