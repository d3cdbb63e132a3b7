"""`vmplacer reconcile`, `vmplacer rebalance` and `vmplacer plans cancel` close a plan a killed
process left `running` and say so — through the real console script, against libvirt's
built-in test driver and a SQLite database. (The store itself, on SQLite and PostgreSQL:
tests/functional/test_plan_orphans.py.)"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import update

from tests.functional.test_rebalance_cli import config, vmplacer  # noqa: F401 - fixture
from vmplacer.adapters.db import migrate
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.models import HostLeaseRow, utcnow
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlanStore
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan

DEAD = "rebalance@gone:4242:deadbeef"


def _orphan(config: Path, *, expired: bool = True) -> int:  # noqa: F811
    """A plan of two no-op repins of the test driver's guest, left by a killed run: the first
    action running, the second pending, the run's lease on t1 expired (or still live)."""
    url = config.read_text().splitlines()[0].split(": ", 1)[1]
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        sessions = make_session_factory(engine)
        store = SqlPlanStore(sessions)
        live = Placement("test", "t1", {0: frozenset(), 1: frozenset()})
        plan = store.save(Plan(tuple(Action(i, "repin", "t1", "test", before=live, after=live, reason="test")
                                     for i in range(2)), ("t1",), summary="2 no-op repins"))
        assert store.transition(plan.id, "proposed", "approved")
        assert SqlLeaseStore(sessions).acquire(["t1"], DEAD, 900)
        assert store.transition(plan.id, "approved", "running")
        store.record_action(plan.id, plan.actions[0].moved_to("running"), started=True)
        if expired:
            with sessions.begin() as session:
                session.execute(update(HostLeaseRow).where(HostLeaseRow.host == "t1")
                                .values(expires_at=utcnow() - timedelta(minutes=1)))
        return plan.id
    finally:
        engine.dispose()


def test_reconcile_closes_and_reports_an_orphaned_plan(config):  # noqa: F811
    plan_id = _orphan(config)
    code, dry, err = vmplacer(config, "reconcile", "--dry-run", "--format", "json")
    assert code == 0, err
    assert [p["id"] for p in dry["closed_plans"]] == [plan_id]
    assert "would be closed as failed" in dry["closed_plans"][0]["message"]
    assert vmplacer(config, "plans", "show", str(plan_id), "--format", "json")[1]["plan"]["state"] == "running"

    code, data, err = vmplacer(config, "reconcile", "--format", "json")
    assert code == 0, err
    assert data["status"] == "complete"
    closed = data["closed_plans"]
    assert [p["id"] for p in closed] == [plan_id]
    # The dry run took and released t1's lease: the expiry is gone, the plan's last step is what is known.
    assert closed[0]["message"].startswith("interrupted: the process applying it stopped (no live lease on its "
                                           "hosts; its last recorded step was at ")
    code, shown, _ = vmplacer(config, "plans", "show", str(plan_id), "--format", "json")
    plan = shown["plan"]
    assert plan["state"] == "failed" and plan["message"] == closed[0]["message"]
    assert [a["state"] for a in plan["actions"]] == ["failed", "skipped"]
    assert "outcome is unknown" in plan["actions"][0]["message"]
    assert plan["actions"][1]["message"] == "the executor stopped before this action"

    code, data, err = vmplacer(config, "reconcile", "--format", "json")
    assert code == 0 and data["closed_plans"] == [], err

    again = _orphan(config)
    code, out, err = vmplacer(config, "reconcile")
    assert code == 0, err
    assert f"plan {again}: closed as failed: interrupted: the process applying it stopped" in out["text"]


def test_rebalance_closes_an_orphaned_plan_and_notes_it(config):  # noqa: F811
    live = _orphan(config, expired=False)
    code, report, err = vmplacer(config, "rebalance", "--profile-seconds", "0", "--format", "json")
    assert code == 0, err
    assert report["status"] == "busy", "the killed run's lease is live yet: its host stays busy"
    assert not any("closed as failed" in n for n in report["notes"])

    with make_engine(config.read_text().splitlines()[0].split(": ", 1)[1]).begin() as connection:
        connection.execute(update(HostLeaseRow).values(expires_at=utcnow() - timedelta(minutes=1)))
    code, report, err = vmplacer(config, "rebalance", "--profile-seconds", "0", "--format", "json")
    assert code == 0, err
    assert report["status"] == "nothing-to-do"
    notes = [n for n in report["notes"] if "closed as failed" in n]
    assert len(notes) == 1 and notes[0].startswith(f"plan {live} closed as failed: interrupted:")
    code, shown, _ = vmplacer(config, "plans", "show", str(live), "--format", "json")
    assert shown["plan"]["state"] == "failed"


def test_cancelling_an_orphaned_plan_closes_it_and_says_it_is_final(config):  # noqa: F811
    plan_id = _orphan(config)
    code, _, err = vmplacer(config, "plans", "cancel", str(plan_id), "--reason", "stuck")
    assert code == 2
    assert f"plan {plan_id} is failed: it was running, but the process applying it had stopped" in err
    code, shown, _ = vmplacer(config, "plans", "show", str(plan_id), "--format", "json")
    assert shown["plan"]["state"] == "failed" and shown["plan"]["cancel_request"] is None
