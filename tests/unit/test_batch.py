"""Batch placement: hardest first, a bounded search when a guest is left out, and the
fleet planner's host choice with every other host's answer."""

from __future__ import annotations

import itertools

from vmplacer.app.place.fleet_planner import FleetHost, FleetPlanner
from vmplacer.core.placement.batch import Fitted, Refused, hardest_first, place_batch
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import uniform_topology


def _spec(name: str, vcpus: int, **extra) -> GuestSpec:  # type: ignore[no-untyped-def]
    return GuestSpec.from_mapping({"name": name, "vcpus": vcpus, "memory_mib": 1024, **extra})


# ----- ordering ---------------------------------------------------------------------------------------------
def test_hardest_first_orders_multi_cell_then_whole_cores_then_size_and_keeps_file_order_on_ties():
    specs = [_spec("small", 1), _spec("ded", 2, cpu_policy="dedicated"), _spec("big-shared", 8),
             _spec("ded-two-cells", 2, cpu_policy="dedicated", numa_nodes=2), _spec("small-too", 1),
             _spec("lc", 1, workload_class="latency-critical"), _spec("ded-big", 6, cpu_policy="dedicated")]
    # guests holding no pCPU first (they only keep a shared pool), then the hardest of the others
    assert [specs[i].name for i in hardest_first(specs)] == [
        "big-shared", "small", "small-too", "ded-two-cells", "lc", "ded-big", "ded"]


# ----- the search, on bins of plain sizes -------------------------------------------------------------------
def _bins(sizes: list[int], capacity: list[int]):  # type: ignore[no-untyped-def]
    """A fit of sizes into capacities that prefers the emptiest bin (worst fit), as a
    spreading scorer does: greedy on it strands room a later guest needs."""
    calls = []

    def fit(guest: int, host: int, earlier: tuple[int, ...]) -> Fitted | Refused:
        calls.append((guest, host, earlier))
        left = capacity[host] - sum(sizes[g] for g in earlier) - sizes[guest]
        return Fitted(float(left), left) if left >= 0 else Refused(f"bin {host} short by {-left}")
    return fit, calls


def _specs(sizes: list[int]) -> list[GuestSpec]:
    return [_spec(f"g{i}", size) for i, size in enumerate(sizes)]


def test_the_search_finds_an_assignment_the_greedy_pass_misses():
    sizes, capacity = [3, 3, 2, 2, 2], [6, 6]
    fit, _ = _bins(sizes, capacity)
    first = place_batch(_specs(sizes), 2, fit, max_passes=1)
    assert len(first.placed) == 4 and list(first.refused) == [4]
    assert first.refused[4] == {0: Refused("bin 0 short by 1"), 1: Refused("bin 1 short by 1")}
    searched = place_batch(_specs(sizes), 2, fit)
    assert len(searched.placed) == 5 and not searched.refused and searched.greedy_placed == 4
    for host in (0, 1):  # the assignment found respects every capacity
        assert sum(sizes[g] for g, (h, _) in searched.placed.items() if h == host) <= capacity[host]


def test_a_guest_that_fits_no_empty_host_ends_the_search_at_once():
    sizes = [2, 9]
    fit, _ = _bins(sizes, [6, 6])
    result = place_batch(_specs(sizes), 2, fit)
    assert result.passes == 1 and list(result.placed) == [0] and list(result.refused) == [1]


def test_the_budget_is_the_given_clock_and_answers_are_cached():
    sizes, capacity = [3, 3, 2, 2, 2], [6, 6]
    fit, calls = _bins(sizes, capacity)
    ticks = itertools.count()
    result = place_batch(_specs(sizes), 2, fit, budget_s=0.5, clock=lambda: float(next(ticks)))
    assert result.passes == 1 and len(result.placed) == 4  # the first tick past the start spends the budget
    assert len(calls) == len(set(calls))  # every (guest, host, earlier) asked once


# ----- the fleet planner ----------------------------------------------------------------------------------
TWO_NODES = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=1, memory_mib_per_node=8192, name="h")


def test_batch_beats_file_order_on_a_big_guest_listed_last():
    specs = [_spec("s0", 2, cpu_policy="dedicated"), _spec("s1", 2, cpu_policy="dedicated"),
             _spec("big", 4, cpu_policy="dedicated", numa_nodes=1)]
    in_file_order = FleetPlanner(max_passes=1).plan(specs, [FleetHost("h", TWO_NODES)], order=[0, 1, 2])
    assert [g.spec.name for g in in_file_order.guests if g.host is None] == ["big"]
    (refusal,) = in_file_order.guests[2].refusals
    assert refusal.kind == "no-fit" and refusal.host == "h" and "need 4 free pCPUs, have 2" in refusal.message
    batch = FleetPlanner().plan(specs, [FleetHost("h", TWO_NODES)])
    assert all(g.host == "h" for g in batch.guests)
    nodes = {g.spec.name: {TWO_NODES.cpus[c].node for c in g.placement.pcpus} for g in batch.guests}
    assert len(nodes["big"]) == 1 and not nodes["big"] & (nodes["s0"] | nodes["s1"])


def test_the_best_scoring_host_wins_and_every_other_host_is_accounted_for():
    small = uniform_topology(nodes=1, cores_per_node=2, threads_per_core=1, memory_mib_per_node=4096, name="small")
    hosts = [FleetHost("small", small), FleetHost("h", TWO_NODES)]
    planner = FleetPlanner()
    shared = [_spec("g", 2)]
    plan = planner.plan(shared, hosts)
    planner.explain_others(plan, shared)
    (guest,) = plan.guests
    assert {name for name, _ in guest.ranking} == {"small", "h"}
    assert guest.host == max(guest.ranking, key=lambda item: item[1])[0]
    wide = [_spec("w", 4, cpu_policy="dedicated")]
    plan = planner.plan(wide, hosts)
    planner.explain_others(plan, wide)
    (guest,) = plan.guests
    assert guest.host == "h" and [(r.host, r.kind) for r in guest.refusals] == [("small", "no-fit")]


def test_a_host_with_a_domain_of_the_guests_name_is_refused_for_it():
    taken = Placement(guest="web", host="h", vcpupin={0: frozenset()}, memory_kib=1024 * 1024)
    hosts = [FleetHost("h", TWO_NODES, [taken], frozenset({"web"})), FleetHost("h2", TWO_NODES)]
    plan = FleetPlanner().plan([_spec("web", 1)], hosts)
    (guest,) = plan.guests
    assert guest.host == "h2"
    alone = FleetPlanner().plan([_spec("web", 1)], hosts[:1])
    (refusal,) = alone.guests[0].refusals
    assert refusal.kind == "exists" and "a domain named web exists" in refusal.message


def test_anti_affinity_inside_a_request_holds_on_one_host():
    specs = [_spec("a", 2, cpu_policy="dedicated", anti_affinity=["b"]), _spec("b", 2, cpu_policy="dedicated")]
    plan = FleetPlanner().plan(specs, [FleetHost("h", TWO_NODES)])
    nodes = [{TWO_NODES.cpus[c].node for c in g.placement.pcpus} for g in plan.guests]
    assert not nodes[0] & nodes[1]
