"""A server's SQLite pool keeps every connection a burst opened: a returned overflow
connection would be closed, and the next burst would open (and set up) one per request."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import event

from vmplacer.bootstrap.container import SERVER_POOL_OVERFLOW, SERVER_POOL_SIZE, ServerContainer
from vmplacer.config import settings_from_mapping

BURST = SERVER_POOL_SIZE + SERVER_POOL_OVERFLOW // 2  # more than the pool a PostgreSQL server keeps


def _server_engine(url: str, data_dir: Path):  # type: ignore[no-untyped-def]
    settings = settings_from_mapping({"data_dir": str(data_dir), "database_url": url}, "test", environ={})
    return ServerContainer(settings).engine


def _burst(engine) -> None:  # type: ignore[no-untyped-def]
    held = [engine.connect() for _ in range(BURST)]
    for connection in held:
        connection.close()


def test_a_second_burst_of_requests_reuses_the_first_bursts_sqlite_connections(tmp_path):
    engine = _server_engine(f"sqlite:///{tmp_path / 'vmplacer.db'}", tmp_path)
    opened: list[object] = []
    event.listen(engine, "connect", lambda dbapi_connection, _record: opened.append(dbapi_connection))
    try:
        _burst(engine)
        assert len(opened) == BURST
        _burst(engine)
        assert len(opened) == BURST  # each request of the second burst found a kept connection
    finally:
        engine.dispose()


def test_a_postgresql_server_keeps_only_its_share_of_max_connections(tmp_path):
    engine = _server_engine("postgresql+psycopg://nobody@127.0.0.1:1/none", tmp_path)
    try:  # the pool's sizes only: no connection is made
        assert engine.pool.size() == SERVER_POOL_SIZE and engine.pool._max_overflow == SERVER_POOL_OVERFLOW
    finally:
        engine.dispose()
