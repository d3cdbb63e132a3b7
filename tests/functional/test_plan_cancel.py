"""Empty plans and cancellation on simulated hosts with a real database (SQLite and PostgreSQL):
a plan with no actions is final at once, a proposed or approved plan is cancelled at once, a
running one stops between actions (never inside one) and keeps what it already did."""

from __future__ import annotations

import pytest

from tests.functional.test_executor_sim import crowd, pins, rebalancer, sim  # noqa: F401 - fixtures
from vmplacer.adapters.db.plans import SqlPlanStore
from vmplacer.app.rebalance.rebalancer import PlanNotFound, PlanStateError, RunOptions, cancel_plan
from vmplacer.core.rebalance.plan import PLAN_FINAL_STATES
from vmplacer.core.rebalance.state import RebalanceSettings

REPINS = RebalanceSettings(allow_migration=False, max_actions=8)


class CancelDuring:
    """A host that, while the executor repins `guest`, has an operator ask to cancel the plan."""

    def __init__(self, inner, guest: str, cancel):
        self.inner = inner
        self.name = inner.name
        self.guest = guest
        self.cancel = cancel
        self.calls: list[str] = []

    def __getattr__(self, item):
        return getattr(self.inner, item)

    def pin_vcpu(self, name, vcpu, cpus):
        self.calls.append(name)
        if name == self.guest:
            self.cancel()  # mid-action: the repin must still complete and be verified
        return self.inner.pin_vcpu(name, vcpu, cpus)


def test_a_plan_with_nothing_to_do_is_stored_empty_and_cannot_be_applied(sim, db):
    sim.hosts["h1"].define_domain("a", workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    run = rebalancer(sim, db, settings=REPINS)
    plan = run.make_plan(["h1"])
    assert plan.state == "empty" and plan.actions == () and "empty" in PLAN_FINAL_STATES
    assert SqlPlanStore(db).get(plan.id).state == "empty"
    with pytest.raises(PlanStateError, match=f"plan {plan.id} is empty: nothing worth doing was found"):
        run.apply(plan.id)
    with pytest.raises(PlanStateError, match=f"plan {plan.id} is empty: it is final"):
        cancel_plan(SqlPlanStore(db), plan.id, by="ops")
    report = run.run(RunOptions(hosts=("h1",)))
    assert report.status == "nothing-to-do" and report.plan.state == "empty"
    states = [p["state"] for p in SqlPlanStore(db).recent(10)]
    assert states == ["empty", "empty"]
    assert SqlPlanStore(db).recent(10, states=["proposed", "running"]) == []


def test_cancelling_a_proposed_or_approved_plan_skips_every_action(sim, db):
    crowd(sim, names=("a", "b", "c"))
    run = rebalancer(sim, db, settings=REPINS)
    store, audit = SqlPlanStore(db), run.auditor
    for approve in (False, True):
        plan = run.make_plan(["h1"])
        assert plan.state == "proposed" and len(plan.actions) >= 2
        if approve:
            assert store.transition(plan.id, "proposed", "approved")
        outcome = cancel_plan(store, plan.id, by="ops@desk", reason="maintenance", audit=audit)
        assert outcome.status == "cancelled"
        stored = store.get(plan.id)
        assert stored.state == "cancelled" and stored.message == "cancelled by ops@desk: maintenance"
        assert all(a.state == "skipped" and a.message == "cancelled by ops@desk: maintenance"
                   for a in stored.actions)
        assert outcome.plan == stored
        assert all(pins(sim, "h1", n) == {0: frozenset({0})} for n in "abc"), "a cancel changed a host"
        entries = [r for r in store.audit_rows(plan.id) if r["action"] == "rebalance-cancel"]
        assert [(r["outcome"], r["detail"]["from_state"]) for r in entries] == [
            ("ok", "approved" if approve else "proposed")]
        with pytest.raises(PlanStateError, match=f"plan {plan.id} is cancelled"):
            run.apply(plan.id)
        with pytest.raises(PlanStateError, match=f"plan {plan.id} is cancelled: it is final") as refused:
            cancel_plan(store, plan.id, by="ops")
        assert refused.value.state == "cancelled"
    with pytest.raises(PlanNotFound, match="plan 999 does not exist"):
        cancel_plan(store, 999, by="ops")


def test_cancelling_a_running_plan_stops_it_between_actions(sim, db):
    crowd(sim, names=("a", "b", "c", "d"))
    run = rebalancer(sim, db, settings=REPINS)
    store = SqlPlanStore(db)
    plan = run.make_plan(["h1"])
    assert len(plan.actions) >= 2 and all(a.kind == "repin" for a in plan.actions)
    first = plan.actions[0]
    requests = []

    def cancel():
        requests.append(cancel_plan(store, plan.id, by="ops@desk", reason="maintenance", audit=run.auditor))

    host = CancelDuring(sim.hosts["h1"], first.guest, cancel)
    run.hosts["h1"] = host
    done = run.apply(plan.id)
    assert [r.status for r in requests] == ["cancel-requested"]
    assert requests[0].plan.state == "running" and requests[0].plan.cancel_request.by == "ops@desk"
    # The action in progress completed and stays applied; the rest never started.
    assert done.state == "cancelled"
    assert done.actions[0].state == "succeeded"
    assert pins(sim, "h1", first.guest) == first.after.vcpupin
    rest = done.actions[1:]
    assert all(a.state == "skipped" and a.message == "cancelled by ops@desk: maintenance" for a in rest)
    assert host.calls == [first.guest], "the executor repinned after the cancel request"
    assert all(pins(sim, "h1", a.guest) == {0: frozenset({0})} for a in rest)
    stored = store.get(plan.id)
    assert stored.state == "cancelled" and [a.state for a in stored.actions] == [a.state for a in done.actions]
    assert stored.message.startswith("cancelled by ops@desk: maintenance (1 succeeded")
    assert "done actions stay applied" in stored.message
    assert stored.cancel_request.reason == "maintenance" and stored.cancel_request.at is not None
    audit = store.audit_rows(plan.id)
    assert ("rebalance-cancel", "requested") in [(r["action"], r["outcome"]) for r in audit]
    assert [r["outcome"] for r in audit if r["action"] == "rebalance-plan"] == ["cancelled"]
    with pytest.raises(PlanStateError, match="is cancelled: it is final"):
        cancel_plan(store, plan.id, by="ops")


def test_a_cancel_during_the_last_action_comes_too_late(sim, db):
    crowd(sim, names=("a", "b"))
    run = rebalancer(sim, db, settings=REPINS)
    store = SqlPlanStore(db)
    plan = run.make_plan(["h1"])
    assert len(plan.actions) == 1
    run.hosts["h1"] = CancelDuring(sim.hosts["h1"], plan.actions[0].guest,
                                   lambda: cancel_plan(store, plan.id, by="ops", reason="late"))
    done = run.apply(plan.id)
    assert done.state == "succeeded" and done.actions[0].state == "succeeded"
    assert "the cancel request (cancelled by ops: late) came after the last action had started" in done.message
    assert store.get(plan.id).state == "succeeded"


def test_a_run_cancelled_while_applying_reports_cancelled(sim, db):
    crowd(sim, names=("a", "b", "c", "d"))
    run = rebalancer(sim, db, settings=REPINS)
    store = SqlPlanStore(db)
    planned = run.make_plan(["h1"])  # only to learn which guest the run's plan moves first
    assert cancel_plan(store, planned.id, by="ops").status == "cancelled"

    def cancel():
        running = [p["id"] for p in store.recent(5, states=["running"])]
        assert len(running) == 1
        cancel_plan(store, running[0], by="ops", reason="enough")

    run.hosts["h1"] = CancelDuring(sim.hosts["h1"], planned.actions[0].guest, cancel)
    report = run.run(RunOptions(hosts=("h1",)))
    assert report.status == "cancelled" and report.plan.state == "cancelled"
    assert report.steps[-1].name == "apply" and report.steps[-1].status == "skipped"
    assert "cancelled by ops: enough" in report.steps[-1].message
