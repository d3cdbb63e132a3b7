"""The in-memory plan store (simulations) keeps the cancel contract of the PlanStore port, so the
executor stops a running plan between actions there as it does on the database."""

from __future__ import annotations

from vmplacer.lab.simulator import SimCluster
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer, cancel_plan
from vmplacer.lab.rebalance_eval import MemoryLeaseStore, MemoryPlanStore
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.topology.host import uniform_topology
from vmplacer.ports import PlanStore


def _crowded() -> SimCluster:
    cluster = SimCluster(seed=1, noise=0.0)
    cluster.add_host("h1", uniform_topology(nodes=1, cores_per_node=4, name="h1"))
    for name in "abcd":
        cluster.hosts["h1"].define_domain(name, workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    return cluster


def test_memory_store_cancels_at_once_and_between_actions():
    cluster = _crowded()
    store = MemoryPlanStore(cluster.clock.now)
    assert isinstance(store, PlanStore)
    run = Rebalancer(
        RebalancePorts(hosts=dict(cluster.hosts), plans=store, leases=MemoryLeaseStore(), clock=cluster.clock),
        settings=RebalanceSettings(allow_migration=False),
    )
    plan = run.make_plan(["h1"])
    assert plan.state == "proposed" and len(plan.actions) >= 2
    assert cancel_plan(store, plan.id, by="sim").status == "cancelled"
    assert {a.state for a in store.get(plan.id).actions} == {"skipped"}

    plan = run.make_plan(["h1"])
    first = plan.actions[0].guest
    inner = cluster.hosts["h1"]

    class Interrupting:
        name = "h1"

        def __getattr__(self, item):
            return getattr(inner, item)

        def pin_vcpu(self, name, vcpu, cpus):
            inner.pin_vcpu(name, vcpu, cpus)
            if name == first:
                assert cancel_plan(store, plan.id, by="sim", reason="stop").status == "cancel-requested"

    run.hosts["h1"] = Interrupting()
    done = run.apply(plan.id)
    assert done.state == "cancelled" and store.get(plan.id).state == "cancelled"
    assert done.actions[0].state == "succeeded"
    assert {a.message for a in done.actions[1:]} == {"cancelled by sim: stop"}
    assert {a.state for a in done.actions[1:]} == {"skipped"}
