"""Throttle and release actions through the executor and the rebalancer's apply, on simulated hosts
with a real database (SQLite and PostgreSQL): precheck, execute, verify by reading back, revert,
the throttle ledger, the audit log; and the libvirt adapter against libvirt's test driver."""

from __future__ import annotations

import pytest

from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlanStore
from vmplacer.adapters.db.throttles import SqlThrottleLedger
from vmplacer.lab.simulator import SimCluster
from vmplacer.app.apply.executor import Executor
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer
from vmplacer.core.placement.bandwidth import CpuBandwidth, throttled_to
from vmplacer.core.rebalance.plan import Action, Plan, PlanError
from vmplacer.core.topology.host import uniform_topology
from vmplacer.ports import HypervisorError

UNLIMITED = CpuBandwidth()


@pytest.fixture
def sim():
    cluster = SimCluster(seed=1, noise=0.0)
    host = cluster.add_host("h1", uniform_topology(nodes=1, cores_per_node=2, name="h1"))
    host.define_domain("web", workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    host.define_domain("batch", workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    return cluster


def action(kind: str, before: CpuBandwidth, after: CpuBandwidth, guest: str = "batch", index: int = 0) -> Action:
    return Action(index=index, kind=kind, host="h1", guest=guest, reason="web below its floor",
                  parameters={"bandwidth_before": before.to_dict(), "bandwidth_after": after.to_dict(),
                              "protects": "web"})


def apply(sim, db, *actions: Action) -> Plan:
    plans = SqlPlanStore(db)
    plan = plans.save(Plan(actions=tuple(actions), hosts=("h1",)), created_by="test")
    run = Rebalancer(
        RebalancePorts(hosts=dict(sim.hosts), plans=plans, leases=SqlLeaseStore(db), clock=sim.clock,
                       audit=SqlPlacementStore(db), throttles=SqlThrottleLedger(db)),
        holder="protect",
    )
    return run.apply(plan.id)


def test_throttle_is_applied_verified_recorded_and_audited_then_released(sim, db):
    host = sim.hosts["h1"]
    shared = host.true_performance("web")
    done = apply(sim, db, action("throttle", UNLIMITED, throttled_to(0.25)))
    assert done.state == "succeeded", done.actions[0].message
    assert host.cpu_bandwidth("batch").share == pytest.approx(0.25)
    assert host.true_performance("web") > shared + 0.2  # the neighbour now leaves it most of the pCPU
    (record,) = SqlThrottleLedger(db).current("h1")
    assert (record.guest, record.protects, record.bandwidth.share, record.original) == ("batch", "web", 0.25,
                                                                                        UNLIMITED)
    audit = SqlPlanStore(db).audit_rows(done.id)
    throttle_rows = [r for r in audit if r["action"] == "rebalance-throttle"]
    assert throttle_rows[0]["outcome"] == "ok" and throttle_rows[0]["detail"]["after"].startswith("share 0.25")
    released = apply(sim, db, action("release", throttled_to(0.25), UNLIMITED))
    assert released.state == "succeeded" and not host.cpu_bandwidth("batch").limited
    assert SqlThrottleLedger(db).current() == []


def test_a_second_throttle_keeps_the_first_original(sim, db):
    apply(sim, db, action("throttle", UNLIMITED, throttled_to(0.8)))
    apply(sim, db, action("throttle", throttled_to(0.8), throttled_to(0.6)))
    (record,) = SqlThrottleLedger(db).current()
    assert record.bandwidth.share == pytest.approx(0.6) and record.original == UNLIMITED


def test_drift_is_skipped_and_done_counts_as_done(sim, db):
    sim.hosts["h1"].set_cpu_bandwidth("batch", throttled_to(0.5))  # someone else changed it
    drift = apply(sim, db, action("throttle", UNLIMITED, throttled_to(0.8)))
    assert drift.actions[0].state == "skipped" and "drift: batch has CPU bandwidth share 0.50" in drift.actions[0].message
    assert sim.hosts["h1"].cpu_bandwidth("batch").share == pytest.approx(0.5)
    again = apply(sim, db, action("throttle", UNLIMITED, throttled_to(0.5)))
    assert again.actions[0].state == "succeeded" and again.actions[0].message == "already in the target state"


def test_a_failed_verify_reverts_to_the_previous_bandwidth(sim, db):
    host = sim.hosts["h1"]
    real_set = host.set_cpu_bandwidth
    calls: list[float] = []

    def half_applied(name: str, bandwidth: CpuBandwidth) -> None:
        calls.append(bandwidth.share)
        real_set(name, throttled_to(0.9) if len(calls) == 1 else bandwidth)  # the first write lands wrong

    host.set_cpu_bandwidth = half_applied  # type: ignore[method-assign]
    done = apply(sim, db, action("throttle", UNLIMITED, throttled_to(0.3)))
    failed = done.actions[0]
    assert failed.state == "failed" and "read back as share 0.90" in failed.message
    assert "reverted" in failed.message and not host.cpu_bandwidth("batch").limited
    assert calls == [pytest.approx(0.3), 1.0]
    assert SqlThrottleLedger(db).current() == []


def test_rollback_restores_bandwidth_and_the_ledger(sim, db):
    from vmplacer.app.apply.executor import ExecutorSettings

    plans = SqlPlanStore(db)
    plan = plans.save(Plan(actions=(action("throttle", UNLIMITED, throttled_to(0.5)),
                                    action("throttle", UNLIMITED, throttled_to(0.5), guest="ghost", index=1)),
                           hosts=("h1",)), created_by="test")
    run = Rebalancer(
        RebalancePorts(hosts=dict(sim.hosts), plans=plans, leases=SqlLeaseStore(db), clock=sim.clock,
                       audit=SqlPlacementStore(db), throttles=SqlThrottleLedger(db)),
        holder="protect", executor_settings=ExecutorSettings(on_failure="rollback"),
    )
    sim.hosts["h1"].set_cpu_bandwidth = _fail_for("ghost", sim.hosts["h1"].set_cpu_bandwidth)  # type: ignore
    sim.hosts["h1"].define_domain("ghost", workload="spin", vcpupin=[1])
    done = run.apply(plan.id)
    assert [a.state for a in done.actions] == ["rolled_back", "failed"]
    assert not sim.hosts["h1"].cpu_bandwidth("batch").limited
    assert SqlThrottleLedger(db).current() == []


def _fail_for(name: str, real):
    def set_cpu_bandwidth(guest: str, bandwidth: CpuBandwidth) -> None:
        if guest == name:
            raise HypervisorError(f"host h1, domain {guest}: refused", host="h1", domain=guest)
        real(guest, bandwidth)
    return set_cpu_bandwidth


def test_a_host_without_bandwidth_control_skips_with_the_reason(sim):
    class NoBandwidth:
        def __init__(self, host):
            self.host = host
            self.name = host.name

        def domain(self, name):
            return self.host.domain(name)

    plan = Plan(actions=(action("throttle", UNLIMITED, throttled_to(0.5)),), hosts=("h1",), state="approved")
    done = Executor({"h1": NoBandwidth(sim.hosts["h1"])}, clock=sim.clock).run(plan)  # type: ignore[dict-item]
    assert done.actions[0].state == "skipped" and "no CFS quota control" in done.actions[0].message


@pytest.mark.parametrize(("kind", "before", "after", "message"), [
    ("throttle", throttled_to(0.5), throttled_to(0.8), "the share must go down"),
    ("release", throttled_to(0.5), throttled_to(0.3), "the share must go up"),
])
def test_a_throttle_that_goes_the_wrong_way_is_not_an_action(kind, before, after, message):
    with pytest.raises(PlanError, match=message):
        action(kind, before, after)


def test_bandwidth_actions_need_their_parameters():
    with pytest.raises(PlanError, match="parameters.bandwidth_after is required"):
        Action(index=0, kind="throttle", host="h1", guest="b", parameters={"bandwidth_before": {}})


def test_libvirt_test_driver_refuses_bandwidth_with_a_clear_error():
    from vmplacer.adapters.libvirt_host import LibvirtHost
    from vmplacer.config import HostSettings

    host = LibvirtHost(HostSettings("t", "test:///default"))
    try:
        with pytest.raises(HypervisorError, match="host t, domain test: CPU bandwidth control is not supported"):
            host.cpu_bandwidth("test")
        with pytest.raises(HypervisorError, match="CPU bandwidth control is not supported"):
            host.set_cpu_bandwidth("test", throttled_to(0.5))
    finally:
        host.close()


def test_reconcile_reports_throttles_gone_changed_and_not_ours(sim, db):
    from vmplacer.app.observe.reconcile import Reconciler

    host = sim.hosts["h1"]
    host.define_domain("other", workload="spin", vcpupin=[1])
    apply(sim, db, action("throttle", UNLIMITED, throttled_to(0.5)))
    reconciler = Reconciler(dict(sim.hosts), SqlPlacementStore(db), SqlLeaseStore(db), "reconcile-test",
                            throttles=SqlThrottleLedger(db))
    assert reconciler.run().hosts[0].throttles == []  # ledger and libvirt agree
    host.set_cpu_bandwidth("other", throttled_to(0.3))  # someone else's throttle
    host.set_cpu_bandwidth("batch", throttled_to(0.7))  # ours, changed by hand
    found = {(t.guest, t.kind) for t in reconciler.run().hosts[0].throttles}
    assert found == {("other", "throttle-unrecorded"), ("batch", "throttle-changed")}
    host.set_cpu_bandwidth("batch", UNLIMITED)  # ours, lifted by hand
    report = reconciler.run().to_dict()
    kinds = {t["guest"]: t["kind"] for t in report["hosts"][0]["throttles"]}
    assert kinds == {"other": "throttle-unrecorded", "batch": "throttle-gone"}
    assert host.cpu_bandwidth("other").share == pytest.approx(0.3)  # reported, never changed


def test_metrics_show_each_throttle_and_whom_it_protects(sim, db):
    from prometheus_client import CollectorRegistry, generate_latest

    from vmplacer.api.metrics import DatabaseGauges, throttle_gauges

    apply(sim, db, action("throttle", UNLIMITED, throttled_to(0.25)))
    registry = CollectorRegistry()
    registry.register(DatabaseGauges([throttle_gauges(SqlThrottleLedger(db).current)]))
    text = generate_latest(registry).decode()
    assert 'vmplacer_throttle_share{guest="batch",host="h1",protects="web"} 0.25' in text
    assert 'vmplacer_throttle_age_seconds{guest="batch",host="h1",protects="web"}' in text
