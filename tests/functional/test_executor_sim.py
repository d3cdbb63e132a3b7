"""The executor and the rebalancer on simulated hosts with a real database (SQLite and PostgreSQL):
plans stored and applied, drift skipped, failures reverted, placement rows kept true, audit written."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlacementUpdates, SqlPlanStore
from vmplacer.lab.simulator import SimCluster
from vmplacer.app.apply.executor import Executor, ExecutorError, ExecutorSettings
from vmplacer.app.rebalance.rebalancer import RebalanceError, RebalancePorts, Rebalancer, RunOptions
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.topology.host import uniform_topology


@pytest.fixture
def sim():
    cluster = SimCluster(seed=1, noise=0.0)
    cluster.add_host("h1", uniform_topology(nodes=1, cores_per_node=4, name="h1"))
    cluster.add_host("h2", uniform_topology(nodes=1, cores_per_node=4, name="h2"))
    return cluster


def rebalancer(sim, db, holder="run-a", settings=None, executor_settings=None, **ports) -> Rebalancer:
    return Rebalancer(
        RebalancePorts(hosts=dict(sim.hosts), plans=SqlPlanStore(db), leases=SqlLeaseStore(db), clock=sim.clock,
                       wall=lambda: 1_700_000_000.0 + sim.clock.now(),
                       placements=SqlPlacementUpdates(db, {"h1": "sim://h1", "h2": "sim://h2"}),
                       audit=SqlPlacementStore(db),
                       specs=lambda name: (SqlPlacementStore(db).get(name) or {}).get("spec"), **ports),
        holder=holder, settings=settings, executor_settings=executor_settings,
    )


def pins(sim, host: str, guest: str) -> dict[int, frozenset[int]]:
    return sim.hosts[host].domain(guest).placement.vcpupin


def crowd(sim, host="h1", names=("a", "b", "c"), cpu=0) -> None:
    for name in names:
        sim.hosts[host].define_domain(name, workload="spin", vcpupin=[cpu], memory_kib=256 * 1024)


def test_plan_then_apply_spreads_and_keeps_records(sim, db):
    crowd(sim)
    store = SqlPlacementStore(db)
    store.record("h1", "sim://h1", Placement("a", "h1", {0: frozenset({0})}, memory_kib=256 * 1024), {})
    run = rebalancer(sim, db, settings=RebalanceSettings(allow_migration=False))
    plan = run.make_plan(["h1"])
    assert plan.id is not None and plan.state == "proposed"
    assert all(pins(sim, "h1", n) == {0: frozenset({0})} for n in "abc"), "planning changed a host"
    done = run.apply(plan.id)
    assert done.state == "succeeded"
    assert [a.state for a in done.actions] == ["succeeded"] * len(done.actions)
    cpus = {frozenset().union(*pins(sim, "h1", n).values()) for n in "abc"}
    assert cpus != {frozenset({0})}
    stored = SqlPlanStore(db).get(plan.id)
    assert stored.state == "succeeded" and all(a.state == "succeeded" for a in stored.actions)
    moved = {a.guest: a.after for a in done.actions}
    if "a" in moved:
        assert store.get("a")["placement"]["vcpupin"] == {"0": sorted(moved["a"].vcpupin[0])}
    audit = SqlPlanStore(db).audit_rows(plan.id)
    assert {r["guest"] for r in audit if r["action"] == "rebalance-repin"} == set(moved)
    assert any(r["action"] == "rebalance-plan" and r["outcome"] == "ok" for r in audit)
    with pytest.raises(RebalanceError, match="is succeeded"):
        run.apply(plan.id)


def test_drift_between_plan_and_apply_skips_with_the_reason(sim, db):
    crowd(sim, names=("a", "b"))
    sim.hosts["h1"].define_domain("c", workload="spin", vcpupin=[1])
    sim.hosts["h1"].define_domain("d", workload="spin", vcpupin=[1])
    run = rebalancer(sim, db, settings=RebalanceSettings(allow_migration=False))
    plan = run.make_plan(["h1"])
    moved = [a.guest for a in plan.actions]
    assert len(moved) == 2
    drifted = moved[0]
    sim.hosts["h1"].pin_vcpu(drifted, 0, frozenset({3}))  # someone else moved it meanwhile
    done = run.apply(plan.id)
    by_guest = {a.guest: a for a in done.actions}
    assert by_guest[drifted].state == "skipped"
    assert "drift" in by_guest[drifted].message and "0→3" in by_guest[drifted].message
    assert by_guest[moved[1]].state == "succeeded"
    assert done.state == "succeeded"
    assert pins(sim, "h1", drifted) == {0: frozenset({3})}, "the executor overrode the drifted guest"


def test_a_failed_repin_is_reverted_and_rollback_undoes_the_rest(sim, db):
    crowd(sim, names=("a", "b", "c", "d"))
    settings = RebalanceSettings(allow_migration=False, max_actions=8)
    run = rebalancer(sim, db, settings=settings)
    plan = run.make_plan(["h1"])
    assert len(plan.actions) >= 2
    victim = plan.actions[1].guest
    sim.inject_failure("pin_vcpu", victim, retriable=False)
    done = run.apply(plan.id)
    failed = [a for a in done.actions if a.state == "failed"]
    assert [a.guest for a in failed] == [victim] and done.state == "failed"
    assert pins(sim, "h1", victim) == {0: frozenset({0})}
    assert "injected failure" in failed[0].message
    # Same again with rollback: the action done before the failure is undone too.
    for name in "abcd":
        sim.hosts["h1"].pin_vcpu(name, 0, frozenset({0}))
    run = rebalancer(sim, db, settings=settings,
                     executor_settings=ExecutorSettings(on_failure="rollback", retries=0))
    plan = run.make_plan(["h1"])
    sim.inject_failure("pin_vcpu", plan.actions[1].guest, retriable=False)
    done = run.apply(plan.id)
    assert done.state == "rolled_back"
    assert done.actions[0].state == "rolled_back"
    assert all(pins(sim, "h1", n) == {0: frozenset({0})} for n in "abcd")
    assert all(a.state in ("rolled_back", "failed", "skipped") for a in done.actions)


def test_retriable_errors_are_retried(sim, db):
    crowd(sim, names=("a", "b"))
    run = rebalancer(sim, db, settings=RebalanceSettings(allow_migration=False),
                     executor_settings=ExecutorSettings(retries=2, retry_delay_s=0.5))
    plan = run.make_plan(["h1"])
    sim.inject_failure("pin_vcpu", plan.actions[0].guest, retriable=True, times=2)
    before = sim.clock.now()
    done = run.apply(plan.id)
    assert done.state == "succeeded"
    assert sim.clock.now() - before >= 1.0  # two waits of 0.5 s


def test_migration_moves_the_row_and_a_failed_one_leaves_everything_on_the_source(sim, db):
    for name in ("a", "b", "c", "d"):
        sim.hosts["h1"].define_domain(name, workload="spin", vcpupin=[0], memory_kib=512 * 1024)
    store = SqlPlacementStore(db)
    for name in ("a", "b", "c", "d"):
        store.record("h1", "sim://h1", Placement(name, "h1", {0: frozenset({0})}, memory_kib=512 * 1024), {})
    # h1 only has one usable pCPU left for these guests: the others are reserved.
    sim.hosts["h1"]._topology = sim.hosts["h1"].topology().with_reserved({1, 2, 3})
    run = rebalancer(sim, db, executor_settings=ExecutorSettings(migration_timeout_s=60))
    plan = run.make_plan(["h1", "h2"])
    migrations = [a for a in plan.actions if a.kind == "migrate"]
    assert migrations, plan.summary
    done = run.apply(plan.id)
    assert done.state == "succeeded", [(a.describe(), a.state, a.message) for a in done.actions]
    for action in migrations:
        assert action.guest in {d.name for d in sim.hosts["h2"].domains()}
        assert store.get(action.guest)["host"] == "h2"
    stayed = {"a", "b", "c", "d"} - {a.guest for a in migrations}
    assert all(store.get(n)["host"] == "h1" for n in stayed)

    # A migration that times out: the guest keeps running on the source, the row is untouched.
    for name in sorted(n.name for n in sim.hosts["h2"].domains()):
        sim.hosts["h2"].migrate(name, sim.hosts["h1"])
        sim.hosts["h1"].pin_vcpu(name, 0, frozenset({0}))
    store_rows = {n: store.get(n)["host"] for n in "abcd"}
    SqlPlacementUpdates(db).apply([Placement(n, "h1", {0: frozenset({0})}, memory_kib=512 * 1024)
                                   for n, h in store_rows.items() if h != "h1"])
    run = rebalancer(sim, db, holder="run-b",
                     executor_settings=ExecutorSettings(migration_timeout_s=0.01, retries=1, retry_delay_s=0.1))
    sim.clock.sleep(3600)  # past the cool-down
    plan = run.make_plan(["h1", "h2"])
    migrations = [a for a in plan.actions if a.kind == "migrate"]
    assert migrations
    done = run.apply(plan.id)
    assert done.state == "failed"
    for action in migrations:
        result = done.actions[action.index]
        assert result.state == "failed" and "timed out" in result.message
        assert "stays on the source" in result.message
        assert action.guest in {d.name for d in sim.hosts["h1"].domains()}
        assert action.guest not in {d.name for d in sim.hosts["h2"].domains()}
        assert store.get(action.guest)["host"] == "h1"
        follow = [a for a in done.actions if action.index in a.depends_on]
        assert all(a.state == "skipped" and "depends on action" in a.message for a in follow)
    assert SqlPlanStore(db).get(plan.id).state == "failed"


def test_verify_catches_a_host_that_ignores_the_change(sim, db):
    crowd(sim, names=("a", "b"))

    class Deaf:
        """A host whose pin calls return without doing anything."""

        def __init__(self, inner):
            self.inner = inner
            self.name = inner.name

        def __getattr__(self, item):
            return getattr(self.inner, item)

        def pin_vcpu(self, name, vcpu, cpus):
            return None

    run = rebalancer(sim, db, settings=RebalanceSettings(allow_migration=False))
    plan = run.make_plan(["h1"])
    run.hosts["h1"] = Deaf(sim.hosts["h1"])
    done = run.apply(plan.id)
    assert done.state == "failed"
    assert "verify: pinning read back as" in done.actions[0].message


def test_an_executor_runs_only_approved_plans_once(sim, db):
    crowd(sim, names=("a", "b"))
    run = rebalancer(sim, db, settings=RebalanceSettings(allow_migration=False))
    plan = run.make_plan(["h1"])
    executor = Executor(dict(sim.hosts), clock=sim.clock, plans=SqlPlanStore(db))
    with pytest.raises(ExecutorError, match="only an approved plan"):
        executor.run(plan)
    assert SqlPlanStore(db).transition(plan.id, "proposed", "approved")
    approved = SqlPlanStore(db).get(plan.id)
    assert executor.run(approved).state == "succeeded"
    with pytest.raises(ExecutorError, match="no longer approved"):
        executor.run(approved)  # a second runner with a stale copy loses
    # Applying the same moves again (a fresh plan object of the old actions) is a no-op.
    again = replace(approved, id=None, state="approved",
                    actions=tuple(replace(a, state="pending", message="") for a in approved.actions))
    result = Executor(dict(sim.hosts), clock=sim.clock).run(again)
    assert all(a.message == "already in the target state" for a in result.actions)


def test_run_loop_reports_steps_and_dry_run_changes_nothing(sim, db):
    crowd(sim, names=("a", "b"))
    run = rebalancer(sim, db, settings=RebalanceSettings(allow_migration=False))
    report = run.run(RunOptions(hosts=("h1",), dry_run=True, profile_seconds=5))
    assert report.status == "planned"
    assert [s.name for s in report.steps][:2] == ["profile", "learn"]
    assert report.steps[0].status == "skipped" and "no profiler" in report.steps[0].message
    assert any("linear predictor" in n for n in report.notes)
    assert pins(sim, "h1", "a") == {0: frozenset({0})} and pins(sim, "h1", "b") == {0: frozenset({0})}
    report = run.run(RunOptions(hosts=("h1",)))
    assert report.status == "applied" and report.plan.state == "succeeded"
    report = run.run(RunOptions(hosts=("h1",)))
    assert report.status == "nothing-to-do"


class MemoryHost:
    """A host that can move a running guest's memory between nodes (and fail to, on demand)."""

    name = "m1"

    def __init__(self):
        self.placement = Placement("g", "m1", {0: frozenset({2})}, memory_nodes=frozenset({0}),
                                   memory_kib=1024 * 1024)
        self.fail = False
        self.calls: list[frozenset[int]] = []

    def domain(self, name):
        from vmplacer.ports import DomainGone, DomainInfo

        if name != "g":
            raise DomainGone(f"no {name}", host=self.name, domain=name)
        return DomainInfo("g", "u-1", "running", None, 1, self.placement.memory_kib, self.placement)

    def domains(self):
        return [self.domain("g")]

    def topology(self):
        from vmplacer.core.topology.host import uniform_topology

        return uniform_topology(nodes=2, cores_per_node=2, threads_per_core=1, memory_mib_per_node=4096, name="m1")

    def set_memory_nodes(self, name, nodes):
        from vmplacer.ports import HypervisorError

        self.calls.append(nodes)
        if self.fail:
            raise HypervisorError("numatune: cannot change memory nodes live with memnode pinning", host=self.name)
        self.placement = replace(self.placement, memory_nodes=frozenset(nodes))


def test_memory_nodes_move_live_or_fail_cleanly_and_probes_run(sim):
    from vmplacer.core.rebalance.plan import Action, Plan

    host = MemoryHost()
    before = host.placement
    after = replace(before, memory_nodes=frozenset({1}))
    plan = Plan((Action(0, "set_memory_nodes", "m1", "g", None, before, after, reason="follow the vCPUs"),
                 Action(1, "probe", "m1", depends_on=(0,), parameters={"seconds": 2.0})), ("m1",),
                state="approved")
    probed: list[tuple[str, float]] = []
    executor = Executor({"m1": host}, clock=sim.clock, probe=lambda h, s: probed.append((h, s)) or "ok")
    done = executor.run(plan)
    assert [a.state for a in done.actions] == ["succeeded", "succeeded"]
    assert host.placement.memory_nodes == {1} and probed == [("m1", 2.0)]
    # Refused by the host: the action fails, nothing changed, the probe that depends on it is skipped.
    host.placement, host.fail = before, True
    done = Executor({"m1": host}, clock=sim.clock, probe=lambda h, s: "ok").run(plan)
    assert done.actions[0].state == "failed" and "memnode" in done.actions[0].message
    assert done.actions[1].state == "skipped" and host.placement.memory_nodes == {0}
    # A host adapter without live NUMA tuning: skipped with the reason, never attempted.
    class Untuned(MemoryHost):
        set_memory_nodes = None

    untuned = Untuned()
    done = Executor({"m1": untuned}, clock=sim.clock).run(plan)
    assert done.actions[0].state == "skipped" and "no live NUMA tuning" in done.actions[0].message


class Owning:
    """A simulated host on which guest "own" holds pCPU 0 exclusively (the simulator has no
    exclusive pins of its own)."""

    def __init__(self, host):
        self.host = host
        self.name = host.name

    def __getattr__(self, attr):
        return getattr(self.host, attr)

    def _owned(self, info):
        if info.name != "own" or info.placement is None:
            return info
        return replace(info, placement=replace(info.placement, dedicated=True, exclusive_cpus=frozenset({0}),
                                               emulatorpin=frozenset({0})))

    def domain(self, name):
        return self._owned(self.host.domain(name))

    def domains(self):
        return [self._owned(d) for d in self.host.domains()]


def test_a_plan_that_leaves_a_guest_on_another_s_exclusive_pcpu_is_reported_and_audited(sim, db):
    from vmplacer.core.rebalance.plan import Action, Plan

    sim.hosts["h1"].define_domain("own", workload="spin", vcpupin=[0])
    sim.hosts["h1"].define_domain("f", workload="spin", vcpupin={0: [1, 2]})
    host = Owning(sim.hosts["h1"])
    before = host.domain("f").placement
    after = replace(before, vcpupin={0: frozenset({0, 1})}, emulatorpin=frozenset({1}))
    plan = Plan(actions=(Action(index=0, kind="repin", host="h1", guest="f", before=before, after=after),),
                hosts=("h1",), state="approved")
    store = SqlPlacementStore(db)
    done = Executor({"h1": host}, clock=sim.clock, audit=store).run(plan)
    assert done.actions[0].state == "succeeded"
    assert "isolation broken after the plan" in done.message and "exclusive to guest own" in done.message
    from sqlalchemy import select

    from vmplacer.adapters.db.models import AuditRow

    with db() as session:
        rows = session.scalars(select(AuditRow).where(AuditRow.action == "isolation")).all()
    assert [(r.guest, r.outcome) for r in rows] == [("f", "failed")]
