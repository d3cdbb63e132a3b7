"""The plan store's reads of recent actions, on real SQLite and PostgreSQL: the cool-down reads
only the moves of its window, and on SQLite the reads each run and each scrape make go through the
(state, kind, finished_at) index instead of scanning every action of the plans kept."""

from __future__ import annotations

import time

from sqlalchemy import event

from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.plans import SqlPlanStore
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan

INDEX = "ix_plan_actions_state_kind_finished_at"


def pin(guest: str, cpu: int) -> Placement:
    return Placement(guest, "h1", {0: frozenset({cpu})}, memory_kib=256 * 1024)


def finished_repin(store: SqlPlanStore, guest: str, state: str = "succeeded") -> None:
    action = Action(0, "repin", "h1", guest, before=pin(guest, 0), after=pin(guest, 1), reason="test")
    plan = store.save(Plan(actions=(action,), hosts=("h1",)))
    store.record_action(plan.id, Action(0, "repin", "h1", guest, before=action.before, after=action.after,
                                        state=state), started=True, finished=True)


def test_last_moved_since_keeps_only_the_moves_of_the_window(sessions):
    store = SqlPlanStore(sessions)
    finished_repin(store, "a")
    between = time.time()
    time.sleep(0.01)
    finished_repin(store, "b")
    assert set(store.last_moved(["a", "b"])) == {"a", "b"}
    assert set(store.last_moved(["a", "b"], since=between)) == {"b"}
    assert store.last_moved(["a", "b"], since=time.time() + 60.0) == {}


def test_moves_of_the_last_hour_count_an_undone_move_twice(sessions):
    """The per-guest disruption budget's read: moves finished in the window, a move undone (made
    and taken back) counting two, failed ones none, guests outside the list left out."""
    store = SqlPlanStore(sessions)
    finished_repin(store, "a")
    between = time.time()
    time.sleep(0.01)
    finished_repin(store, "a")
    finished_repin(store, "a", state="rolled_back")
    finished_repin(store, "b", state="failed")
    finished_repin(store, "c")
    assert store.moves_since(["a", "b"], between) == {"a": 3}
    assert store.moves_since(None, between) == {"a": 3, "c": 1}
    assert store.moves_since(None, time.time() + 60.0) == {}


def test_the_reads_of_each_run_and_scrape_use_the_recent_actions_index(sqlite_url):
    from vmplacer.adapters.db import migrate

    migrate.upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    statements: list[tuple[str, object]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def remember(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    try:
        store = SqlPlanStore(make_session_factory(engine))
        since = time.time() - 86400.0
        reads = {"trial_counts": lambda: store.trial_counts(since),
                 "trial_outcomes": lambda: store.trial_outcomes(since),
                 "last_moved": lambda: store.last_moved(["a"], since=since),
                 "moves_since": lambda: store.moves_since(["a"], since),
                 "action_counts": store.action_counts}
        for name, read in reads.items():
            statements.clear()
            read()
            assert len(statements) == 1, name
            statement, parameters = statements[0]
            with engine.connect() as connection:
                raw = connection.connection.driver_connection
                plan = " ".join(row[-1] for row in raw.execute("EXPLAIN QUERY PLAN " + statement, parameters))
            assert INDEX in plan, f"{name}: {plan}"
    finally:
        engine.dispose()
