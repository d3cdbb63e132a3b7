"""SQLite: this process's writers take turns (no busy-handler sleeps), a rolled-back or
failed writer lets the next one in, and commits use WAL's synchronous=NORMAL."""

from __future__ import annotations

import threading

from sqlalchemy import func, select, text

from vmplacer.adapters.db import migrate
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.models import AuditRow
from vmplacer.adapters.db.repositories import record_audit

THREADS = 8
WRITES = 25
JOIN_S = 60.0


def _sessions(url: str):  # type: ignore[no-untyped-def]
    migrate.upgrade(url)
    engine = make_engine(url)
    return engine, make_session_factory(engine)


def _count(sessions) -> int:  # type: ignore[no-untyped-def]
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(AuditRow)))


def test_concurrent_writers_all_commit_and_rolled_back_ones_leave_nothing(sqlite_url):
    engine, sessions = _sessions(sqlite_url)
    errors: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            for i in range(WRITES):
                with sessions() as session:
                    record_audit(session, actor="test", action="write", outcome="ok", message=f"{worker}-{i}")
                    if i % 5 == 4:
                        session.rollback()  # written, then given up: must release the writer's turn
                    else:
                        session.commit()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), "a writer never got its turn"
    assert errors == []
    assert _count(sessions) == THREADS * WRITES * 4 // 5
    engine.dispose()


def test_a_writer_that_fails_midway_lets_the_next_one_in(sqlite_url):
    engine, sessions = _sessions(sqlite_url)
    try:
        with sessions() as session:
            record_audit(session, actor="test", action="write", outcome="ok")
            session.flush()  # its INSERT ran: this connection holds the writer's turn
            raise RuntimeError("the request failed")
    except RuntimeError:
        pass
    done = threading.Event()

    def other() -> None:
        with sessions() as session:
            record_audit(session, actor="test", action="other", outcome="ok")
            session.commit()
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(JOIN_S)
    assert done.is_set(), "the failed writer kept its turn"
    assert _count(sessions) == 1
    engine.dispose()


def test_wal_commits_without_fsync(sqlite_url):
    engine, _ = _sessions(sqlite_url)
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
    engine.dispose()
