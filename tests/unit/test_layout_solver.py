"""The exact layout solver: the rebalancer's objective as a LayoutProblem, solved by CP-SAT,
checked against brute force on small hosts and against the search's own arithmetic."""

from __future__ import annotations

import random

import numpy as np
import pytest

from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.model.interference import Exposure, InterferenceModel, Observation
from vmplacer.core.rebalance.layout_problem import OPTIMAL, brute_force
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.policy import (
    ClusterState,
    HostState,
    RebalanceSettings,
    describe_guest,
    plan_rebalance,
)
from vmplacer.core.rebalance.exact import NotExact, build_problem
from vmplacer.core.rebalance.draft import Draft, PlanInputs
from vmplacer.core.rebalance.search import start_search
from vmplacer.core.rebalance.whatif import host_objective
from vmplacer.core.topology.host import DistanceClass, uniform_topology

SOLVER = CpSatLayoutSolver()
KEYS = ("a", "b", "c")


def model(seed: int) -> InterferenceModel:
    """A model learned from random observations: uneven, asymmetric coefficients at three distances."""
    rng = random.Random(seed)
    observations = []
    for _ in range(80):
        neighbours = tuple(Exposure(rng.choice(KEYS), rng.choice([DistanceClass.SAME_CORE, DistanceClass.SAME_LLC,
                                                                  DistanceClass.REMOTE_NODE]), 1.0)
                           for _ in range(rng.randint(1, 3)))
        observations.append(Observation(rng.choice(KEYS), rng.uniform(0.5, 1.0), 1.0, neighbours))
    return InterferenceModel().fit(observations)


def random_state(seed: int, nodes: int, vms: int, hosts: int = 1, labels=None) -> ClusterState:
    rng = random.Random(seed)
    topologies = {f"h{k}": uniform_topology(nodes=nodes, cores_per_node=2, threads_per_core=2, name=f"h{k}")
                  for k in range(hosts)}
    guests = {}
    for v in range(vms):
        host = f"h{v % hosts}"
        cpus = sorted(topologies[host].cpus)
        placement = Placement(guest=f"g{v}", host=host, vcpupin={0: frozenset({rng.choice(cpus)})},
                              memory_kib=1024 * 1024)
        guests[f"g{v}"] = describe_guest(placement, labels={"workload": rng.choice(KEYS),
                                                            **(labels or {}).get(f"g{v}", {})})
    return ClusterState({n: HostState(n, t) for n, t in topologies.items()}, guests)


def search_of(state: ClusterState, seed: int, **settings) -> tuple[Draft, PlanInputs]:
    return start_search(state, model(seed), RebalanceSettings(**settings), None, {}, None)


@pytest.mark.parametrize("seed", range(4))
def test_cp_sat_finds_the_brute_force_optimum_of_one_host(seed):
    draft, inputs = search_of(random_state(seed, nodes=1 + seed % 2, vms=3 + seed % 2), seed)
    problem = build_problem(draft, inputs, ["h0"])
    best = brute_force(problem)
    found = SOLVER.solve(problem, time_limit_s=5.0)
    assert found is not None and found.status == OPTIMAL
    assert found.objective == pytest.approx(best.objective, abs=1e-6)
    assert found.bound >= best.objective - 1e-6
    assert not problem.violations(found.assignment)


@pytest.mark.parametrize("seed", range(3))
def test_the_problem_scores_layouts_as_the_search_does(seed):
    draft, inputs = search_of(random_state(seed, nodes=2, vms=4), seed)
    problem = build_problem(draft, inputs, ["h0"])
    host = draft.hosts["h0"]
    rng = random.Random(seed)
    for _ in range(5):
        slots = rng.sample(range(problem.n_slots), problem.n_items)  # no time sharing: the solver's space
        for (name, vcpu), slot in zip(problem.items, slots):
            host.set_pins(name, {vcpu: frozenset({problem.slots[slot][1]})})
        assert problem.objective(slots) == pytest.approx(host_objective(inputs, host), abs=1e-9)


def test_two_small_hosts_are_solved_together_with_migration_costs():
    state = random_state(3, nodes=1, vms=4, hosts=2)
    draft, inputs = search_of(state, 3)
    problem = build_problem(draft, inputs, ["h0", "h1"])
    assert problem.move_cost is not None and (problem.move_cost > 0).any()
    best = brute_force(problem)
    found = SOLVER.solve(problem, time_limit_s=5.0)
    assert found.objective == pytest.approx(best.objective, abs=1e-6)
    moved = problem.moved(found.assignment)
    assert problem.objective(found.assignment) == pytest.approx(
        float((problem.weight * _utility(problem.performance(found.assignment), problem.fairness)).sum())
        - float(problem.move_cost[moved].sum()))


def _utility(perf: np.ndarray, fairness: float) -> np.ndarray:
    shortfall = np.maximum(0.0, 1.0 - perf)
    return perf - fairness * shortfall * shortfall


def test_floors_exclusive_and_isolate_guests_and_anti_affinity_hold():
    topo = uniform_topology(nodes=2, cores_per_node=2, threads_per_core=2, name="h0")
    spec = GuestSpec.from_mapping({"name": "iso", "vcpus": 1, "memory_mib": 512, "cpu_policy": "dedicated",
                                   "thread_policy": "isolate"})
    guests = {
        "iso": describe_guest(Placement(guest="iso", host="h0", vcpupin={0: frozenset({0})}, memory_kib=512 * 1024,
                                        exclusive_cpus=frozenset({0, 4}), dedicated=True), spec=spec),
        "x": describe_guest(Placement(guest="x", host="h0", vcpupin={0: frozenset({1})}, memory_kib=1024),
                            labels={"workload": "a", "priority": "50"}),
        "y": describe_guest(Placement(guest="y", host="h0", vcpupin={0: frozenset({5})}, memory_kib=1024),
                            labels={"workload": "b"}),
        "z": describe_guest(Placement(guest="z", host="h0", vcpupin={0: frozenset({2})}, memory_kib=1024),
                            labels={"workload": "c"}),
    }
    guests["y"] = describe_guest(guests["y"].placement, labels={"workload": "b"},
                                 spec=None)
    state = ClusterState({"h0": HostState("h0", topo)}, guests)
    draft, inputs = search_of(state, 1)
    problem = build_problem(draft, inputs, ["h0"])
    best = brute_force(problem)
    found = SOLVER.solve(problem, time_limit_s=5.0)
    assert found.objective == pytest.approx(best.objective, abs=1e-6)
    layout = {problem.items[i][0]: problem.slots[s][1] for i, s in enumerate(found.assignment)}
    core = {c: topo.cpus[c].core for c in topo.cpus}
    assert all(core[layout[n]] != core[layout["iso"]] for n in layout if n != "iso")  # isolate: its core alone
    g = problem.guests.index("x")
    assert problem.performance(found.assignment)[g] >= problem.floor[g]


def test_a_host_without_time_sharing_room_is_left_to_the_local_search():
    """Five busy guests on two pCPUs: even one pCPU shared by three leaves no layout the solver may take."""
    topo = uniform_topology(nodes=1, cores_per_node=1, threads_per_core=2, name="h0")
    guests = {f"g{i}": describe_guest(Placement(guest=f"g{i}", host="h0", vcpupin={0: frozenset({0})},
                                                memory_kib=1024)) for i in range(6)}
    draft, inputs = search_of(ClusterState({"h0": HostState("h0", topo)}, guests), 0)
    with pytest.raises(NotExact, match="at most one time-shared pCPU"):
        build_problem(draft, inputs, ["h0"])
    plan = plan_rebalance(ClusterState({"h0": HostState("h0", topo)}, guests), model(0), solver=SOLVER, now=0.0)
    assert plan.actions  # the local search still spreads them
    assert plan.settings["notes"]["exact"][0]["status"] == "not solved"


def test_the_exact_layout_beats_a_local_optimum_on_a_full_host():
    """Eight guests, eight pCPUs: which ones share a core decides. The climb moves one guest or
    swaps two at a time and stops short; the solver's layout is better and proven optimal."""
    rng = random.Random(3)
    keys = "abcd"
    truth = {(u, v): rng.uniform(0, 0.6) for u in keys for v in keys}  # loss u causes v on its sibling
    observations = []
    for _ in range(400):
        key, other = rng.choice(keys), rng.choice(keys)
        distance = rng.choice([DistanceClass.SAME_CORE, DistanceClass.SAME_LLC])
        loss = truth[(other, key)] if distance is DistanceClass.SAME_CORE else 0.01
        observations.append(Observation(key, 1.0 - loss, 1.0, (Exposure(other, distance, 1.0),)))
    learned = InterferenceModel().fit(observations)
    topo = uniform_topology(nodes=1, cores_per_node=4, threads_per_core=2, name="h0")
    cpus = list(range(8))
    rng.shuffle(cpus)
    guests = {f"{k}{i}": describe_guest(Placement(guest=f"{k}{i}", host="h0", vcpupin={0: frozenset({cpus[2 * j + i]})},
                                                  memory_kib=1024), labels={"workload": k})
              for j, k in enumerate(keys) for i in range(2)}
    state = ClusterState({"h0": HostState("h0", topo)}, guests)
    settings = RebalanceSettings(max_actions=16)
    climb = plan_rebalance(state, learned, settings, now=0.0)
    exact = plan_rebalance(state, learned, settings, now=0.0, solver=SOLVER)
    report = exact.settings["notes"]["exact"][0]
    assert report["status"] == OPTIMAL and report["taken"]
    assert exact.objective_after > climb.objective_after + 0.1
    assert exact.objective_after == pytest.approx(report["objective"], abs=1e-6)
    assert report["bound"] >= report["objective"]


class SlowClock:
    """CP-SAT whose every solve reports a minute of wall time, as on a badly loaded machine."""

    name = "slow"

    def __init__(self):
        self.calls = 0

    def solve(self, problem, *, time_limit_s):
        from dataclasses import replace

        self.calls += 1
        found = SOLVER.solve(problem, time_limit_s=time_limit_s)
        return None if found is None else replace(found, seconds=60.0)


def test_the_plan_budget_counts_deterministic_work_not_wall_time():
    """Three hosts solved one by one: a minute of wall time each would spend a 3 s budget at the
    first; the deterministic work the solver reports does not, so the answer does not depend on load."""
    state = random_state(5, nodes=1, vms=9, hosts=3)
    slow = SlowClock()
    plan = plan_rebalance(state, model(5), RebalanceSettings(exact_budget_s=3.0, allow_migration=False),
                          now=0.0, solver=slow)
    reports = plan.settings["notes"]["exact"]
    assert reports and not any(r.get("status") == "skipped" for r in reports)
    solved = [r for r in reports if "objective" in r]
    assert solved and all(r["seconds"] == 60.0 and 0.0 <= r["work"] < 3.0 for r in solved)
