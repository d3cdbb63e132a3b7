"""Plans left `running` by a process that stopped (kill -9, power loss), on a real database
(SQLite and PostgreSQL): a running plan none of whose hosts has a live lease is closed as
`failed` — pending actions skipped, the running one failed with its outcome unknown, one audit
entry — by the store, by rebalance runs and applies, by a cancel and at API start; a plan whose
executor still holds a lease, and plans not running, are left alone; two closers write once."""

from __future__ import annotations

import re
import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update

from tests.functional.test_executor_sim import crowd, pins, rebalancer, sim  # noqa: F401 - fixtures
from vmplacer.adapters.db.models import AuditRow, HostLeaseRow, utcnow
from vmplacer.adapters.db.plans import STOPPED_BEFORE, SqlLeaseStore, SqlPlanStore
from vmplacer.app.rebalance.rebalancer import PlanStateError, RunOptions, cancel_plan
from vmplacer.lab.rebalance_eval import MemoryPlanStore
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.ports import PlanStore

DEAD = "rebalance@gone:4242:deadbeef"  # the holder of a process that was killed
REPINS = RebalanceSettings(allow_migration=False, max_actions=8)


def _placement(guest: str, host: str, cpu: int) -> Placement:
    return Placement(guest, host, {0: frozenset({cpu})}, memory_kib=256 * 1024)


def _stored(store: SqlPlanStore, state: str = "running") -> Plan:
    """A plan of three actions — a repin that succeeded, a migration h1 → h2 in progress, a repin
    still pending — as a killed executor leaves it (its leases taken before it ran, as the
    executor does); or a plan only `proposed` / `approved`."""
    plan = store.save(Plan((
        Action(0, "repin", "h1", "a", before=_placement("a", "h1", 0), after=_placement("a", "h1", 1)),
        Action(1, "migrate", "h1", "b", target_host="h2", before=_placement("b", "h1", 0),
               after=_placement("b", "h2", 0)),
        Action(2, "repin", "h1", "c", before=_placement("c", "h1", 0), after=_placement("c", "h1", 2),
               depends_on=(1,)),
    ), ("h1", "h2"), summary="3 actions"))
    if state == "proposed":
        return plan
    assert store.transition(plan.id, "proposed", "approved")
    if state == "approved":
        return store.get(plan.id)
    assert SqlLeaseStore(store.sessions).acquire(["h1", "h2"], DEAD, 900)
    assert store.transition(plan.id, "approved", "running")
    store.record_action(plan.id, plan.actions[0].moved_to("running"), started=True)
    store.record_action(plan.id, plan.actions[0].moved_to("running").moved_to("succeeded", "verified on the host"),
                        finished=True)
    store.record_action(plan.id, plan.actions[1].moved_to("running"), started=True)
    return store.get(plan.id)


def _expire(sessions, hosts, seconds_ago: float = 60.0) -> None:
    """Time passes beyond the TTL: the dead holder never renewed its leases."""
    with sessions.begin() as session:
        session.execute(update(HostLeaseRow).where(HostLeaseRow.host.in_(list(hosts)))
                        .values(expires_at=utcnow() - timedelta(seconds=seconds_ago)))


def _interrupted_audit(sessions, plan_id: int) -> list[AuditRow]:
    with sessions() as session:
        return [r for r in session.scalars(select(AuditRow).where(AuditRow.action == "rebalance-interrupted"))
                if r.detail.get("plan_id") == plan_id]


# ----- the store ------------------------------------------------------------------------------------
def test_a_running_plan_without_a_live_lease_is_closed_as_failed(db):
    store = SqlPlanStore(db)
    plan = _stored(store)
    assert store.close_orphaned("ops") == [], "closed while its executor still holds the leases"
    _expire(db, ["h1", "h2"])
    expired_at = SqlLeaseStore(db).holders(["h1"])["h1"]["expires_at"]
    assert store.close_orphaned("ops", dry_run=True) == [plan.id]
    assert store.get(plan.id).state == "running", "a dry run wrote"

    assert store.close_orphaned("reconcile:ops") == [plan.id]
    closed = store.get(plan.id)
    assert closed.state == "failed"
    assert closed.message.startswith("interrupted: the process applying it stopped (no live lease on its hosts "
                                     "since ")
    assert closed.message.endswith(" UTC)")
    stamp = datetime.fromtimestamp(expired_at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    assert stamp in closed.message
    done, migrating, pending = closed.actions
    assert (done.state, done.message) == ("succeeded", "verified on the host"), "a finished action was rewritten"
    assert migrating.state == "failed"
    assert "the executor stopped during this action: its outcome is unknown" in migrating.message
    assert "b may be on h1 or on h2" in migrating.message and "vmplacer reconcile" in migrating.message
    assert (pending.state, pending.message) == ("skipped", STOPPED_BEFORE)

    entries = _interrupted_audit(db, plan.id)
    assert len(entries) == 1
    entry = entries[0]
    assert (entry.actor, entry.outcome) == ("reconcile:ops", "failed")
    assert entry.detail["skipped"] == [2] and entry.detail["hosts"] == ["h1", "h2"]
    assert entry.detail["unknown"] == [{"action": 1, "kind": "migrate", "guest": "b", "host": "h1",
                                        "target_host": "h2"}]
    assert f"plan {plan.id}: interrupted" in entry.message and "action 1 was running" in entry.message
    # Final now: nothing more to close, applying and cancelling are refused as for any failed plan.
    assert store.close_orphaned("ops") == []
    assert len(_interrupted_audit(db, plan.id)) == 1
    with pytest.raises(PlanStateError, match=f"plan {plan.id} is failed: it is final"):
        cancel_plan(store, plan.id, by="ops")


def test_a_repin_left_running_names_the_guest_and_host_to_check(db):
    store = SqlPlanStore(db)
    plan = store.save(Plan((Action(0, "repin", "h1", "a", before=_placement("a", "h1", 0),
                                   after=_placement("a", "h1", 1)),), ("h1",)))
    assert store.transition(plan.id, "proposed", "approved")
    assert SqlLeaseStore(db).acquire(["h1"], DEAD, 900)
    assert store.transition(plan.id, "approved", "running")
    store.record_action(plan.id, plan.actions[0].moved_to("running"), started=True)
    SqlLeaseStore(db).release(["h1"], DEAD)  # released, yet the plan stayed running: no expiry to name
    assert store.close_orphaned() == [plan.id]
    closed = store.get(plan.id)
    assert re.fullmatch(r"interrupted: the process applying it stopped \(no live lease on its hosts; its last "
                        r"recorded step was at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", closed.message), closed.message
    assert closed.actions[0].state == "failed"
    assert "check a on h1 with `vmplacer reconcile` or virsh" in closed.actions[0].message


def test_live_leases_and_plans_not_running_are_left_alone(db):
    store = SqlPlanStore(db)
    proposed, approved = _stored(store, "proposed"), _stored(store, "approved")
    running = _stored(store)
    _expire(db, ["h1"])  # the source's lease lapsed, the target's is live: the executor may still run
    assert store.close_orphaned() == []
    assert store.get(running.id).state == "running"
    assert store.get(running.id).actions[1].state == "running"
    _expire(db, ["h2"])
    assert SqlLeaseStore(db).acquire(["h2"], "rebalance@elsewhere", 900)  # someone else acts on h2 now
    assert store.close_orphaned() == [], "a live lease by anyone on one of its hosts keeps the plan"
    SqlLeaseStore(db).release(["h2"], "rebalance@elsewhere")
    assert store.close_orphaned() == [running.id]
    assert [store.get(p.id).state for p in (proposed, approved)] == ["proposed", "approved"]
    assert {a.state for a in store.get(approved.id).actions} == {"pending"}


def test_a_lease_taken_after_the_check_keeps_the_plan(db):
    """The close is conditional on the plan still having no live lease, in the same statement."""
    store = SqlPlanStore(db)
    plan = _stored(store)
    _expire(db, ["h1", "h2"])
    found = store._orphaned()
    assert [f[0] for f in found] == [plan.id]
    assert SqlLeaseStore(db).renew(["h1", "h2"], DEAD, 900)  # a stalled executor came back meanwhile
    assert not store._close_interrupted(*found[0], by="ops")
    assert store.get(plan.id).state == "running" and _interrupted_audit(db, plan.id) == []


def test_two_closers_at_once_write_once(db):
    store = SqlPlanStore(db)
    plans = [_stored(store) for _ in range(3)]
    _expire(db, ["h1", "h2"])
    start = threading.Barrier(4)
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def close(n: int) -> None:
        try:
            start.wait(10)
            results.append(SqlPlanStore(db).close_orphaned(f"closer-{n}"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=close, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sorted(i for found in results for i in found) == [p.id for p in plans], "a plan closed twice or never"
    for plan in plans:
        stored = store.get(plan.id)
        assert stored.state == "failed" and [a.state for a in stored.actions] == ["succeeded", "failed", "skipped"]
        assert len(_interrupted_audit(db, plan.id)) == 1


def test_in_memory_plans_are_never_orphaned():
    store = MemoryPlanStore(lambda: 0.0)
    assert isinstance(store, PlanStore) and isinstance(SqlPlanStore(None), PlanStore)
    assert store.close_orphaned("sim") == [] and store.close_orphaned(dry_run=True) == []


# ----- where it runs: rebalance, apply, cancel, the API at start ---------------------------------------
class Killed(BaseException):
    """The process dies in the middle of an action (nothing after it runs, nothing is released)."""


class DiesDuring:
    """A host on which the executor's process is killed while it repins `guest`."""

    def __init__(self, inner, guest: str):
        self.inner, self.name, self.guest = inner, inner.name, guest

    def __getattr__(self, item):
        return getattr(self.inner, item)

    def pin_vcpu(self, name, vcpu, cpus):
        if name == self.guest:
            raise Killed()
        return self.inner.pin_vcpu(name, vcpu, cpus)


class NeverReleases(SqlLeaseStore):
    """A dead process releases nothing: its leases stay until they expire."""

    def release(self, hosts, holder) -> None:
        return None


def _killed_mid_plan(sim, db, names=("a", "b", "c", "d")) -> Plan:  # noqa: F811 - fixtures passed in
    """A real plan applied by a run that is killed during its first action."""
    crowd(sim, names=names)
    run = rebalancer(sim, db, holder=DEAD, settings=REPINS)
    run.leases = NeverReleases(db)
    plan = run.make_plan(["h1"])
    assert len(plan.actions) >= 2
    run.hosts["h1"] = DiesDuring(sim.hosts["h1"], plan.actions[0].guest)
    with pytest.raises(Killed):
        run.apply(plan.id)
    stored = SqlPlanStore(db).get(plan.id)
    assert stored.state == "running" and stored.actions[0].state == "running"
    return stored


def test_a_rebalance_run_closes_a_killed_run_s_plan_and_says_so(sim, db):  # noqa: F811
    plan = _killed_mid_plan(sim, db)
    store = SqlPlanStore(db)
    other = rebalancer(sim, db, holder="run-b", settings=REPINS)
    busy = other.run(RunOptions(hosts=("h1",), dry_run=True))
    assert busy.status == "busy", "the dead run's lease is still live: its hosts stay busy"
    assert store.get(plan.id).state == "running" and not any("closed" in n for n in busy.notes)

    _expire(db, ["h1"])
    report = other.run(RunOptions(hosts=("h1",), dry_run=True))
    assert report.status == "planned"
    closed = store.get(plan.id)
    assert closed.state == "failed" and closed.message.startswith("interrupted: the process applying it stopped")
    assert f"plan {plan.id} closed as failed: {closed.message}" in report.notes
    first = closed.actions[0]
    assert first.state == "failed" and f"check {first.guest} on h1" in first.message
    assert {a.state for a in closed.actions[1:]} == {"skipped"}
    assert pins(sim, "h1", first.guest) == {0: frozenset({0})}, "the killed action never reached the host"
    assert [r["action"] for r in store.audit_rows(plan.id)].count("rebalance-interrupted") == 1


def test_apply_and_cancel_close_a_killed_run_s_plan(sim, db):  # noqa: F811
    plan = _killed_mid_plan(sim, db)
    store = SqlPlanStore(db)
    _expire(db, ["h1"])
    with pytest.raises(PlanStateError, match=(f"plan {plan.id} is failed: it was running, but the process "
                                              "applying it had stopped, so it was closed now; it is final, "
                                              "there is nothing to cancel — interrupted: ")) as refused:
        cancel_plan(store, plan.id, by="ops@desk", reason="stuck")
    assert refused.value.state == "failed" and store.get(plan.id).state == "failed"
    entries = [r for r in store.audit_rows(plan.id) if r["action"] in ("rebalance-interrupted", "rebalance-cancel")]
    assert [r["action"] for r in entries] == ["rebalance-interrupted"]

    again = _killed_mid_plan(sim, db, names=("e", "f", "g", "h"))
    _expire(db, ["h1"])
    later = rebalancer(sim, db, holder="run-c", settings=REPINS).make_plan(["h1"])
    rebalancer(sim, db, holder="run-c", settings=REPINS).apply(later.id)
    assert store.get(again.id).state == "failed"


def test_a_running_plan_whose_executor_lives_is_only_asked_to_cancel(sim, db):  # noqa: F811
    plan = _killed_mid_plan(sim, db)  # its lease is still live: for all anyone can tell it still runs
    outcome = cancel_plan(SqlPlanStore(db), plan.id, by="ops")
    assert outcome.status == "cancel-requested" and outcome.plan.state == "running"


def test_an_executor_whose_plan_was_closed_meanwhile_stops(sim, db):  # noqa: F811
    """A stalled executor (its lease lapsed, another process closed its plan) does not go on
    acting when it wakes up, even though nobody took its lease in between."""
    crowd(sim, names=("a", "b", "c", "d"))
    run = rebalancer(sim, db, holder="run-slow", settings=REPINS)
    plan = run.make_plan(["h1"])
    first = plan.actions[0].guest
    inner = sim.hosts["h1"]
    calls: list[str] = []

    class Stalls:
        name = "h1"

        def __getattr__(self, item):
            return getattr(inner, item)

        def pin_vcpu(self, name, vcpu, cpus):
            calls.append(name)
            if name == first:
                _expire(db, ["h1"])
                assert SqlPlanStore(db).close_orphaned("elsewhere") == [plan.id]
            return inner.pin_vcpu(name, vcpu, cpus)

    run.hosts["h1"] = Stalls()
    done = run.apply(plan.id)
    assert calls == [first], "the executor went on after its plan was closed"
    assert done.state == "failed" and done.message.startswith("interrupted:")
    assert done.actions[0].state == "succeeded", "the action it finished records its real outcome"
    assert {a.state for a in done.actions[1:]} == {"skipped"}
    assert SqlPlanStore(db).get(plan.id) == done


def test_the_api_closes_orphaned_plans_when_it_starts(tmp_path, database_url):
    from tests.functional.test_api_helpers import make_container
    from vmplacer.api.services import ApiOptions, ApiServices

    container = make_container(database_url, tmp_path, [{"name": "h1", "uri": "test:///default"},
                                                        {"name": "h2", "uri": "test:///default"}])
    try:
        store = SqlPlanStore(container.sessions)
        plan = _stored(store)
        _expire(container.sessions, ["h1", "h2"])
        services = ApiServices(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
        services.start()
        services.stop()
        closed = store.get(plan.id)
        assert closed.state == "failed" and closed.message.startswith("interrupted:")
        entries = _interrupted_audit(container.sessions, plan.id)
        assert [e.actor for e in entries] == [f"api:{services.instance}"]
    finally:
        container.close()
