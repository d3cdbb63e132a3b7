"""Migrations in flight (`rebalance.disruption.max_migrations_in_flight`), through the executor's
lanes on simulated hosts: on random plans of migrations between random hosts, applied with
random numbers of lanes and limits, no more migrations than the limit ever run at once in the
process, and no host is ever in two at once (its lane and the lease see to that); a limit of 2
really lets two run together; a plan's recorded limit is checked."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmplacer.app.apply.executor import Executor, ExecutorError, ExecutorSettings
from vmplacer.app.apply.migration_slots import MigrationSlots, migration_limit
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.topology.host import uniform_topology
from vmplacer.lab.simulator import SimCluster

HOSTS = tuple(f"h{n}" for n in range(6))
MEMORY_KIB = 64 * 1024


class Flights:
    """Migrations running now, fleet-wide and per host, and the most ever seen."""

    def __init__(self, gate: threading.Barrier | None = None):
        self.lock = threading.Lock()
        self.fleet = 0
        self.hosts: dict[str, int] = {}
        self.peak = 0
        self.host_peak = 0
        self.gate = gate
        self.gated = gate.parties if gate is not None else 0  # the first migrations wait there

    def take_gate(self) -> threading.Barrier | None:
        with self.lock:
            if self.gated <= 0:
                return None
            self.gated -= 1
            return self.gate

    def enter(self, *hosts: str) -> None:
        with self.lock:
            self.fleet += 1
            self.peak = max(self.peak, self.fleet)
            for host in hosts:
                self.hosts[host] = self.hosts.get(host, 0) + 1
                self.host_peak = max(self.host_peak, self.hosts[host])

    def leave(self, *hosts: str) -> None:
        with self.lock:
            self.fleet -= 1
            for host in hosts:
                self.hosts[host] -= 1


class FlightHost:
    """A simulated host (one lock for the whole simulator: it is not thread safe) whose
    migrations are counted while they run, and last long enough for lanes to overlap."""

    sim_lock = threading.Lock()

    def __init__(self, inner, flights: Flights):  # type: ignore[no-untyped-def]
        self.inner, self.name, self.flights = inner, inner.name, flights

    def migrate(self, name, destination, **kwargs):  # type: ignore[no-untyped-def]
        self.flights.enter(self.name, destination.name)
        try:
            gate = self.flights.take_gate()
            if gate is not None:
                gate.wait()  # the first migrations meet here: they run at once or never pass
            time.sleep(0.002)
            with self.sim_lock:
                return self.inner.migrate(name, destination.inner, **kwargs)
        finally:
            self.flights.leave(self.name, destination.name)

    def __getattr__(self, item):  # type: ignore[no-untyped-def]
        attr = getattr(self.inner, item)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            with self.sim_lock:
                return attr(*args, **kwargs)
        return call


def fleet_and_plan(moves: list[tuple[int, int]], flights: Flights, plan_settings: dict | None = None):
    cluster = SimCluster(seed=1, noise=0.0)
    for host in HOSTS:
        cluster.add_host(host, uniform_topology(nodes=1, cores_per_node=4, name=host))
    actions = []
    for index, (source, step) in enumerate(moves):
        src, dst = HOSTS[source], HOSTS[(source + step) % len(HOSTS)]
        guest = f"g{index}"
        cluster.hosts[src].define_domain(guest, workload="spin", vcpupin=[0], memory_kib=MEMORY_KIB)
        before = Placement(guest, src, {0: frozenset({0})}, memory_kib=MEMORY_KIB)
        actions.append(Action(index, "migrate", src, guest, before=before,
                              after=Placement(guest, dst, {0: frozenset({0})}, memory_kib=MEMORY_KIB),
                              target_host=dst, reason="spread"))
    plan = Plan(actions=tuple(actions), hosts=HOSTS, state="approved", settings=plan_settings or {})
    hosts = {name: FlightHost(cluster.hosts[name], flights) for name in HOSTS}
    return cluster, hosts, plan


moves_strategy = st.lists(st.tuples(st.integers(0, len(HOSTS) - 1), st.integers(1, len(HOSTS) - 1)),
                          min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(moves=moves_strategy, lanes=st.integers(1, 6), limit=st.integers(1, 4))
def test_no_more_migrations_than_the_limit_run_at_once_and_a_host_is_in_one(moves, lanes, limit):
    flights = Flights()
    cluster, hosts, plan = fleet_and_plan(moves, flights)
    pool = MigrationSlots()
    executor = Executor(hosts, clock=cluster.clock, lanes=lanes, migration_slots=pool,
                        settings=ExecutorSettings(max_migrations_in_flight=limit))
    done = executor.run(plan)
    assert [a.state for a in done.actions] == ["succeeded"] * len(moves), [a.message for a in done.actions]
    assert flights.peak <= limit and pool.peak <= limit
    assert flights.host_peak == 1
    assert pool.in_flight == 0 and flights.fleet == 0


def test_a_limit_of_two_runs_two_migrations_together():
    # four migrations between four disjoint pairs of hosts: four lanes
    moves = [(0, 1), (2, 1), (4, 1), (0, 1)]
    flights = Flights(gate=threading.Barrier(2, timeout=30))
    cluster, hosts, plan = fleet_and_plan(moves[:3], flights)
    pool = MigrationSlots()
    done = Executor(hosts, clock=cluster.clock, lanes=3, migration_slots=pool,
                    settings=ExecutorSettings(max_migrations_in_flight=2)).run(plan)
    assert flights.gate is not None and not flights.gate.broken
    assert pool.peak == 2 and flights.peak == 2
    assert pool.waits >= 1  # the third waited for a slot
    assert all(a.state == "succeeded" for a in done.actions)


def test_the_plans_own_limit_applies_and_a_bad_one_is_refused():
    assert migration_limit(Plan(actions=(), hosts=(), settings={"max_migrations_in_flight": 3}), None) == 3
    assert migration_limit(Plan(actions=(), hosts=(), settings={}), None) == RebalanceSettings().max_migrations_in_flight
    assert migration_limit(Plan(actions=(), hosts=(), settings={"max_migrations_in_flight": 3}), 1) == 1
    flights = Flights()
    cluster, hosts, plan = fleet_and_plan([(0, 1), (2, 1), (4, 1)], flights,
                                          plan_settings={"max_migrations_in_flight": 1})
    pool = MigrationSlots()
    Executor(hosts, clock=cluster.clock, lanes=3, migration_slots=pool).run(plan)
    assert pool.peak == 1 and flights.peak == 1
    _, hosts, bad = fleet_and_plan([(0, 1)], Flights(), plan_settings={"max_migrations_in_flight": "many"})
    with pytest.raises(ExecutorError, match="settings.max_migrations_in_flight"):
        Executor(hosts, clock=cluster.clock).run(bad)
    with pytest.raises(ValueError, match="max_migrations_in_flight"):
        ExecutorSettings(max_migrations_in_flight=-1)


def _run_while_a_slot_is_held(executor: Executor, plan: Plan, pool: MigrationSlots, meanwhile) -> Plan:  # type: ignore[no-untyped-def]
    """Run `plan` while the pool's only slot is taken; once the migration waits for it, change
    the world (`meanwhile`), then free the slot."""
    done: list[Plan] = []
    with pool.held(1):
        runner = threading.Thread(target=lambda: done.append(executor.run(plan)))
        runner.start()
        deadline = time.monotonic() + 30
        while pool.waits < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert pool.waits == 1
        meanwhile()
    runner.join(30)
    assert done
    return done[0]


def test_a_migration_that_waited_checks_its_lease_and_the_host_again():
    lease = {"held": True}
    cluster, hosts, plan = fleet_and_plan([(0, 1)], Flights())
    pool = MigrationSlots()
    executor = Executor(hosts, clock=cluster.clock, migration_slots=pool, keep_lease=lambda: lease["held"],
                        settings=ExecutorSettings(max_migrations_in_flight=1))
    done = _run_while_a_slot_is_held(executor, plan, pool, lambda: lease.update(held=False))
    assert done.actions[0].state == "skipped" and "lease was lost while waiting" in done.actions[0].message
    assert {d.name for d in cluster.hosts["h0"].domains()} == {"g0"}  # not migrated

    cluster, hosts, plan = fleet_and_plan([(0, 1)], Flights())
    pool = MigrationSlots()
    executor = Executor(hosts, clock=cluster.clock, migration_slots=pool,
                        settings=ExecutorSettings(max_migrations_in_flight=1))
    done = _run_while_a_slot_is_held(executor, plan, pool,
                                     lambda: cluster.hosts["h0"].pin_vcpu("g0", 0, frozenset({2})))
    assert done.actions[0].state == "skipped" and "drift" in done.actions[0].message
    assert {d.name for d in cluster.hosts["h0"].domains()} == {"g0"}
