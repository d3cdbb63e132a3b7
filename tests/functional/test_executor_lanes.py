"""A plan's lanes (actions sharing no host) applied at once, on SQLite and PostgreSQL: each
host's trial probes run alongside the other hosts' (they meet at a barrier only all reach
together), the outcome is the one the same plan applied one action after another gives, and a
failure stops every lane and rolls the whole plan back."""

from __future__ import annotations

import threading

from tests.support import SerialisedHost
from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlacementUpdates, SqlPlanStore
from vmplacer.app.apply.executor import ExecutorSettings
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.rebalance.trial import Measured
from vmplacer.core.topology.host import uniform_topology
from vmplacer.lab.simulator import SimCluster

HOSTS = ("h1", "h2", "h3")


def fleet(fail_on: str | None = None) -> tuple[SimCluster, dict[str, SerialisedHost]]:
    cluster = SimCluster(seed=1, noise=0.0)
    gate = threading.Barrier(len(HOSTS), timeout=60) if fail_on else None
    for host in HOSTS:
        cluster.add_host(host, uniform_topology(nodes=1, cores_per_node=4, name=host))
        for guest in "abc":
            cluster.hosts[host].define_domain(f"{guest}{host}", workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    return cluster, {h: SerialisedHost(cluster.hosts[h], fail_pins=h == fail_on, gate=gate) for h in HOSTS}


def pin(guest: str, host: str, cpu: int) -> Placement:
    return Placement(guest, host, {0: frozenset({cpu})}, memory_kib=256 * 1024)


def plan_of(db) -> Plan:
    """On each host: b moves 0 → 1, then a probe confirms it (kept only if measured no worse)."""
    actions = []
    for host in HOSTS:
        weights = {f"{g}{host}": 1.0 for g in "abc"}
        trial = {"kind": "confirm", "weights": weights, "fairness": 0.0, "min_gain": 0.01, "tolerance": 0.02,
                 "from_key": f"x{host}", "to_key": f"t{host}"}
        repin = len(actions)
        actions.append(Action(repin, "repin", host, f"b{host}", before=pin(f"b{host}", host, 0),
                              after=pin(f"b{host}", host, 1), reason="spread"))
        actions.append(Action(repin + 1, "probe", host, depends_on=(repin,),
                              parameters={"seconds": 1.0, "trial": trial}))
    return SqlPlanStore(db).save(Plan(actions=tuple(actions), hosts=HOSTS))


class Probe:
    """Each host measured twice (before its trial, after its moves); h2 measures worse after.
    With `together`, each round of measurements waits until every host is measured at once."""

    def __init__(self, together: bool):
        self.calls: dict[str, int] = {}
        self.gates = [threading.Barrier(len(HOSTS), timeout=60) for _ in range(2)] if together else None
        self.lock = threading.Lock()

    def __call__(self, host: str, seconds: float) -> Measured:
        with self.lock:
            call = self.calls[host] = self.calls.get(host, 0) + 1
        if self.gates is not None:
            self.gates[call - 1].wait()
        before = 0.33
        after = 0.25 if host == "h2" else 0.6
        value = before if call == 1 else after
        return Measured(host, {f"{g}{host}": value for g in "abc"}, {f"{g}{host}": 3 for g in "abc"})


def rebalancer(cluster, hosts, db, probe, *, parallel: int, rollback: bool = False) -> Rebalancer:
    ports = RebalancePorts(hosts=hosts, plans=SqlPlanStore(db), leases=SqlLeaseStore(db), clock=cluster.clock,
                           placements=SqlPlacementUpdates(db, {h: f"sim://{h}" for h in HOSTS}),
                           audit=SqlPlacementStore(db), probe=probe, thread_safe=True)
    return Rebalancer(ports, holder="lanes", settings=RebalanceSettings(parallel_hosts=parallel),
                      executor_settings=ExecutorSettings(on_failure="rollback") if rollback else None)


def cpu_of(cluster, host: str, guest: str) -> int:
    return next(iter(cluster.hosts[host].domain(guest).placement.vcpupin[0]))


def test_hosts_trials_run_at_once_and_end_as_one_after_another(db):
    cluster, hosts = fleet()
    probe = Probe(together=True)
    done = rebalancer(cluster, hosts, db, probe, parallel=len(HOSTS)).apply(plan_of(db).id)
    assert probe.calls == {h: 2 for h in HOSTS}

    serial_cluster, serial_hosts = fleet()
    serial = rebalancer(serial_cluster, serial_hosts, db, Probe(together=False), parallel=1).apply(plan_of(db).id)
    assert [(a.index, a.state) for a in done.actions] == [(a.index, a.state) for a in serial.actions]
    assert [a.state for a in done.actions] == ["succeeded", "succeeded", "rolled_back", "rolled_back",
                                               "succeeded", "succeeded"]
    assert done.state == serial.state == "succeeded"
    assert {h: cpu_of(cluster, h, f"b{h}") for h in HOSTS} == {"h1": 1, "h2": 0, "h3": 1}
    stored = SqlPlanStore(db).get(done.id)
    assert [a.state for a in stored.actions] == [a.state for a in done.actions]


def test_a_failure_in_one_lane_stops_the_others_and_rolls_the_whole_plan_back(db):
    cluster, hosts = fleet(fail_on="h3")
    done = rebalancer(cluster, hosts, db, Probe(together=False), parallel=len(HOSTS), rollback=True).apply(
        plan_of(db).id)
    assert done.actions[4].state == "failed" and "pinning refused" in done.actions[4].message
    # the other lanes' repins went through alongside it (they met it at the gate) and were undone
    assert done.actions[0].state == done.actions[2].state == "rolled_back"
    assert not [a for a in done.actions if a.state == "succeeded"], [(a.index, a.state) for a in done.actions]
    assert {h: cpu_of(cluster, h, f"b{h}") for h in HOSTS} == {h: 0 for h in HOSTS}
    # whatever ran before the failure (a kept trial's probe too) was undone with the plan
    assert done.state == "rolled_back"
