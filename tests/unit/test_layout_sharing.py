"""Time sharing in exact layouts: k vCPUs on one pCPU, its sibling left idle when that is better.
The solver (CP-SAT over fused plain problems) is checked against brute force over every
assignment, and the problem's arithmetic against the search's what-if."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
from vmplacer.core.rebalance import layout_sharing as sharing
from vmplacer.core.model.interference import Exposure, InterferenceModel, Observation
from vmplacer.core.rebalance.layout_problem import OPTIMAL, brute_force
from vmplacer.core.rebalance.layout_sharing import fused, interchangeable, sharing_groups, solve_time_shared, without_sharing
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.policy import (
    ClusterState,
    HostState,
    RebalanceSettings,
    describe_guest,
    plan_rebalance,
)
from vmplacer.core.rebalance.exact import SHARE_GROUP, build_problem
from vmplacer.core.rebalance.search import start_search
from vmplacer.core.rebalance.whatif import host_objective
from vmplacer.core.topology.host import DistanceClass, uniform_topology

SOLVER = CpSatLayoutSolver()


def sibling_model(loss: dict[tuple[str, str], float], seed: int = 0) -> InterferenceModel:
    """A model taught that `loss[(u, v)]` is what u costs v on its SMT sibling (1 % at LLC distance)."""
    rng = random.Random(seed)
    keys = sorted({k for pair in loss for k in pair})
    observations = []
    for _ in range(300):
        key, other = rng.choice(keys), rng.choice(keys)
        distance = rng.choice([DistanceClass.SAME_CORE, DistanceClass.SAME_LLC])
        value = loss.get((other, key), 0.0) if distance is DistanceClass.SAME_CORE else 0.01
        observations.append(Observation(key, 1.0 - value, 1.0, (Exposure(other, distance, 1.0),)))
    return InterferenceModel().fit(observations)


def state_of(workloads: list[str], cores: int, pins: list[int] | None = None, seed: int = 0) -> ClusterState:
    topo = uniform_topology(nodes=1, cores_per_node=cores, threads_per_core=2, name="h0")
    rng = random.Random(seed)
    cpus = sorted(topo.cpus)
    guests = {}
    for v, key in enumerate(workloads):
        cpu = pins[v] if pins is not None else rng.choice(cpus)
        guests[f"g{v}"] = describe_guest(Placement(guest=f"g{v}", host="h0", vcpupin={0: frozenset({cpu})},
                                                   memory_kib=1024 * 1024), labels={"workload": key})
    return ClusterState({"h0": HostState("h0", topo)}, guests)


def random_model(seed: int) -> InterferenceModel:
    rng = random.Random(seed)
    return sibling_model({(u, v): rng.uniform(0.0, 0.9) for u in "abc" for v in "abc"}, seed)


def test_two_heavy_guests_time_share_a_pcpu_and_leave_its_sibling_idle():
    """Three guests, two cores: any one-per-pCPU layout puts two of them on siblings, which costs
    each 80 %; time-sharing one pCPU costs each half, so the optimum shares and idles the sibling."""
    state = state_of(["a", "a", "a"], cores=2, pins=[0, 2, 1])  # g0, g1 on siblings 0/2, g2 alone
    learned = sibling_model({("a", "a"): 0.8})
    draft, inputs = start_search(state, learned, RebalanceSettings(), None, {}, None)
    problem = build_problem(draft, inputs, ["h0"])
    assert problem.max_shared == 1
    best = brute_force(problem)
    found = SOLVER.solve(problem, time_limit_s=5.0)
    assert found is not None and found.status == OPTIMAL
    assert found.objective == pytest.approx(best.objective, abs=1e-6)
    assert not problem.violations(found.assignment)
    layout = {problem.items[i][0]: problem.slots[s][1] for i, s in enumerate(found.assignment)}
    shared = [c for c in layout.values() if list(layout.values()).count(c) == 2]
    assert shared  # two guests time-share one pCPU …
    sibling = {0: 2, 2: 0, 1: 3, 3: 1}[shared[0]]
    assert sibling not in layout.values()  # … and its sibling stays idle
    plain = SOLVER.solve(without_sharing(problem), time_limit_s=5.0)
    assert found.objective > plain.objective + 0.1  # better than every layout without time sharing

    plan = plan_rebalance(state, learned, RebalanceSettings(), solver=SOLVER, now=0.0)
    after = {name: guest.placement.vcpupin[0] for name, guest in state.guests.items()}
    after.update({a.guest: a.after.vcpupin[0] for a in plan.actions
                  if a.after is not None and not a.parameters.get("tried")})  # the plan's layout, not its trial
    assert len(set(after.values())) == 2, plan.settings["notes"]  # the plan time-shares two of them
    assert plan.objective_after > plan.objective_before + 0.1


@pytest.mark.parametrize("seed", range(6))
def test_cp_sat_with_time_sharing_finds_the_brute_force_optimum(seed):
    """Five or six guests on two cores × two threads: every assignment (time sharing of up to
    SHARE_GROUP on one pCPU included) against the solver."""
    rng = random.Random(seed)
    state = state_of([rng.choice("abc") for _ in range(5 + seed % 2)], cores=2, seed=seed)
    draft, inputs = start_search(state, random_model(seed), RebalanceSettings(), None, {}, None)
    problem = build_problem(draft, inputs, ["h0"])
    assert problem.max_shared == 1 and problem.share_group == SHARE_GROUP
    best = brute_force(problem)
    found = SOLVER.solve(problem, time_limit_s=5.0)
    assert found is not None and found.status == OPTIMAL
    assert found.objective == pytest.approx(best.objective, abs=1e-5)
    assert found.bound >= best.objective - 1e-5
    assert not problem.violations(found.assignment)


@pytest.mark.parametrize("seed", range(3))
def test_time_shared_layouts_score_as_the_search_does(seed):
    """The problem's arithmetic (share factors on unary and pair terms, own time lost) is the
    what-if's, for layouts with two or three guests on one pCPU."""
    rng = random.Random(seed)
    state = state_of([rng.choice("abc") for _ in range(6)], cores=2, seed=seed)
    draft, inputs = start_search(state, random_model(seed), RebalanceSettings(), None, {}, None)
    problem = build_problem(draft, inputs, ["h0"])
    host = draft.hosts["h0"]
    checked = 0
    while checked < 8:
        slots = [rng.randrange(problem.n_slots) for _ in range(problem.n_items)]
        if problem.violations(slots):
            continue
        for (name, vcpu), slot in zip(problem.items, slots):
            host.set_pins(name, {vcpu: frozenset({problem.slots[slot][1]})})
        assert problem.objective(slots) == pytest.approx(host_objective(inputs, host), abs=1e-9)
        checked += 1


def test_a_fused_group_scores_as_the_problem_with_the_group_on_one_pcpu():
    rng = random.Random(4)
    state = state_of([rng.choice("abc") for _ in range(6)], cores=2, seed=4)
    problem = build_problem(*start_search(state, random_model(4), RebalanceSettings(), None, {}, None), ["h0"])
    for group in sharing_groups(problem):
        sub = fused(problem, group)
        for _ in range(20):
            slots = [rng.randrange(problem.n_slots) for _ in range(problem.n_items)]
            for i in group[1:]:
                slots[i] = slots[group[0]]
            if slots.count(slots[group[0]]) > len(group):
                continue  # a larger group than this one
            if sub.violations(slots):
                assert problem.violations(slots) or not sub.allowed[group[0], slots[group[0]]]
                continue
            assert not problem.violations(slots)
            assert sub.objective(slots) == pytest.approx(problem.objective(slots), abs=1e-9)


def test_identical_guests_make_one_kind_of_group():
    """Four guests of one workload and two of another: groups are tried once per kind."""
    state = state_of(["a", "a", "a", "a", "b", "b"], cores=2, pins=[0, 1, 2, 3, 0, 1])
    problem = build_problem(*start_search(state, random_model(1), RebalanceSettings(), None, {}, None), ["h0"])
    label = interchangeable(problem)
    kinds = {problem.items[i][0]: int(label[i]) for i in range(problem.n_items)}
    assert len({kinds["g0"], kinds["g1"], kinds["g2"], kinds["g3"]}) == 1
    assert len({kinds["g4"], kinds["g5"]}) == 1 and kinds["g4"] != kinds["g0"]
    groups = sharing_groups(problem)
    shapes = sorted(tuple(sorted(kinds[problem.items[i][0]] for i in g)) for g in groups)
    assert len(shapes) == len(set(shapes))
    assert SHARE_GROUP == 4
    assert len(groups) == 3 + 3 + 3  # aa ab bb; aaa aab abb (bbb impossible: two b's); aaaa aaab aabb
    best = brute_force(problem)
    found = solve_time_shared(problem, SOLVER._solve, 5.0)
    assert found.objective == pytest.approx(best.objective, abs=1e-5)


def test_no_time_sharing_when_every_guest_can_have_a_core():
    state = state_of(["a", "b", "c"], cores=4, seed=2)
    problem = build_problem(*start_search(state, random_model(2), RebalanceSettings(), None, {}, None), ["h0"])
    assert problem.max_shared == 0 and sharing_groups(problem) == []
    shared = [0, 0, 1]
    assert problem.violations(shared)  # two on one pCPU is outside this problem's space
    assert not replace(problem, max_shared=1).violations(shared)
    assert np.isclose(replace(problem, max_shared=1).time_share(shared)[:2], 0.5).all()
    three = [0, 0, 0]
    assert not replace(problem, max_shared=1, share_group=3).violations(three)
    assert replace(problem, max_shared=1, share_group=2).violations(three)
    light = replace(problem, max_shared=1, share_group=3, item_load=np.full(problem.n_items, 0.4))
    assert light.violations(three)  # 1.2 of a pCPU from guests that fit alone: not the sharing solved here
    assert not light.sharing_items().any()


def test_groups_beyond_the_cap_leave_the_answer_feasible_and_bounded(monkeypatch):
    """A host with hundreds of possible groups is tried best ceiling first, up to the cap; groups that
    leave the others no room are never tried. The answer says "feasible" and its bound still holds."""
    rng = random.Random(5)
    state = state_of([rng.choice("abc") for _ in range(6)], cores=2, seed=5)
    problem = build_problem(*start_search(state, random_model(5), RebalanceSettings(), None, {}, None), ["h0"])
    best = brute_force(problem)
    assert SOLVER.solve(without_sharing(problem), time_limit_s=5.0) is None  # six guests, four pCPUs
    monkeypatch.setattr(sharing, "MAX_GROUPS", 1)
    found = solve_time_shared(problem, SOLVER._solve, 5.0)
    assert found is not None and not problem.violations(found.assignment)
    assert found.objective <= best.objective + 1e-9 <= found.bound + 1e-5
    fitting = [g for g in sharing_groups(problem) if len(g) == 3]  # a pair leaves five for three pCPUs
    unpruned = [g for g in fitting if sharing.upper_bound(fused(problem, g)) > found.objective + 1e-9]
    assert found.status == ("feasible" if len(unpruned) > 1 else OPTIMAL)
