"""Guests vmplacer floated over a pool may be pinned 1:1 again; guests someone else let float may not."""

from __future__ import annotations

from vmplacer.core.rebalance.draft import RunHistory
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.policy import PIPELINE, RebalanceSettings, plan_rebalance
from vmplacer.core.rebalance.search import run_stages, start_search
from vmplacer.core.rebalance.whatif import may_pin
from vmplacer.core.rebalance.exact import solver_items, build_problem
from vmplacer.core.rebalance.state import FLOATING, PINNED
from vmplacer.core.topology.host import uniform_topology

from tests.unit.test_rebalance_policy import LINEAR, cluster, final_pins, pinned


def floating(name: str, host: str, cpus: set[int]) -> Placement:
    return Placement(guest=name, host=host, vcpupin={0: frozenset(cpus)}, memory_kib=512 * 1024)


def crowded_pool() -> tuple:
    """Three one-vCPU guests floating over pCPUs 0-1 of a 4-pCPU host: each gets 2/3 of a pCPU,
    while pCPUs 2 and 3 stand idle."""
    topo = uniform_topology(nodes=1, cores_per_node=4, name="h1")
    return topo, cluster({"h1": topo}, [floating(n, "h1", {0, 1}) for n in "abc"])


def test_guests_an_earlier_plan_pooled_are_pinned_again_when_pcpus_free_up():
    _, state = crowded_pool()
    plan = plan_rebalance(state, LINEAR, now=0.0, pooled={"a", "b", "c"})
    pins = final_pins(plan, state)
    cpus = [pins[n][1][0] for n in "abc"]
    assert all(len(c) == 1 for c in cpus), f"still floating: {cpus}"
    assert len(set(cpus)) == 3
    for name in "abc":
        assert plan.predicted[name]["after"] > plan.predicted[name]["before"] + 0.3


def test_guests_someone_else_let_float_stay_floating():
    _, state = crowded_pool()
    plan = plan_rebalance(state, LINEAR, now=0.0)
    assert plan.actions == ()
    # the pinning is only the search's to undo for the guests it floated, not for every guest named
    plan = plan_rebalance(state, LINEAR, now=0.0, pooled={"a"})
    pins = final_pins(plan, state)
    assert pins["b"][1][0] == frozenset({0, 1}) and pins["c"][1][0] == frozenset({0, 1})


def test_a_guest_whose_flavor_asks_for_shared_vcpus_keeps_floating_even_if_named():
    topo, _ = crowded_pool()
    spec = GuestSpec.from_mapping({"name": "a", "vcpus": 1, "memory_mib": 512, "cpu_policy": "shared"})
    state = cluster({"h1": topo}, [floating(n, "h1", {0, 1}) for n in "abc"], specs={"a": spec})
    draft, inputs = start_search(state, LINEAR, RebalanceSettings(), 0.0, {}, None, None,
                             history=RunHistory.of(pooled={"a", "b", "c"}))
    assert not may_pin(draft, inputs, "a")
    assert may_pin(draft, inputs, "b") and may_pin(draft, inputs, "c")


def test_the_exact_solver_places_guests_the_climb_pooled():
    """Three busy guests on a 2-pCPU host: the climb floats them over both pCPUs. The exact solver
    must still see them as guests it may place (before, a pooled guest dropped out of its problem
    for good, and overcommitted hosts never got an exact layout)."""
    topo = uniform_topology(nodes=1, cores_per_node=2, name="h1")
    state = cluster({"h1": topo}, [pinned(n, "h1", [0]) for n in "abc"])
    draft, inputs = start_search(state, LINEAR, RebalanceSettings(), 0.0, {}, None, None)
    run_stages(draft, inputs, PIPELINE)
    host = draft.hosts["h1"]
    assert {draft.guests[n].mode for n in "abc"} == {FLOATING}, "the climb did not pool: the test lost its point"
    assert sorted(solver_items(draft, inputs, host)) == ["a", "b", "c"]
    problem = build_problem(draft, inputs, ["h1"])
    assert problem.n_items == 3 and problem.hint is None  # floating vCPUs have no pCPU to start from


def test_a_pooled_guest_pinned_by_a_move_counts_as_pinned_again():
    _, state = crowded_pool()
    draft, inputs = start_search(state, LINEAR, RebalanceSettings(), 0.0, {}, None, None,
                             history=RunHistory.of(pooled={"a", "b", "c"}))
    run_stages(draft, inputs, PIPELINE)
    assert {draft.guests[n].mode for n in "abc"} == {PINNED}
