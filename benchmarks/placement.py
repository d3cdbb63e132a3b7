"""Placement benchmark: vmplacer's search against a Nova-like first-fit over cell permutations.

    python benchmarks/placement.py [--out benchmarks/results/placement.json] [--cap 20] [--check]

Cases place one guest on synthetic hosts of 2, 4, 8 and 16 NUMA nodes (up to
512 pCPUs) that already run a seeded mix of guests, including an 8-cell guest
on the 16-node host, and one adversarial case where only the last 8 of 16
nodes have room (first-fit walks the permutations that start on a full node
first). Both placers see the same host and are scored by the same default
scorer. The reference placer tries `itertools.permutations(host nodes, cells)`
in order and takes the first that fits — Nova's numa_fit_instance_to_host
strategy — with per-(cell, node) fit checks memoised (kinder to it than Nova)
and a time cap; a capped run is reported as such.

The fill case places 100 mixed guests one after another on a 2-socket SMT
host (2 x 28 cores x 2 threads) until it is full.

The fleet batch case places one request of 100 mixed guests (about 83% of the
fleet's pCPUs in vCPUs, big and multi-cell guests scattered through the file) across 10
two-node hosts, once in file order (one pass, each guest on its best host) and
once as vmplacer places a request (hardest first, then the bounded search); it
reports how many guests each placed and the batch's time (wall and CPU).

Targets: every single placement < 50 ms; the 100-guest fill < 2 s; vmplacer's
placement never scores below first-fit's; the fleet batch places at least as many
guests as file order, within BATCH_TARGET_S of CPU time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import host_facts  # noqa: E402

from vmplacer.core.placement.allocate import NoFit, allocate, place_on_nodes  # noqa: E402
from vmplacer.core.placement.guest import GuestSpec  # noqa: E402
from vmplacer.core.placement.occupancy import Occupancy  # noqa: E402
from vmplacer.core.placement.guest_placement import Placement  # noqa: E402
from vmplacer.core.placement.admit import (  # noqa: E402
    AllocationOptions,
    admit_cell,
    build_node_views,
    cell_requests,
    page_options,
)
from vmplacer.core.topology.host import HostTopology, uniform_topology  # noqa: E402

SINGLE_TARGET_MS = 50.0
FILL_TARGET_S = 2.0
BATCH_TARGET_S = 5.0
REPEATS = 5


def machine() -> str:
    return host_facts.summary()


def host(nodes: int, cores_per_node: int, threads: int, nodes_per_package: int, memory_gib: int) -> HostTopology:
    """Synthetic host; nodes in one package are close (12, or 21 for two-node hosts), others far (32)."""
    topo = uniform_topology(nodes=nodes, cores_per_node=cores_per_node, threads_per_core=threads,
                            memory_mib_per_node=memory_gib * 1024, name=f"numa{nodes}")
    near = 21 if nodes == 2 else 12
    table = {
        n: replace(node, distances={m: 10 if m == n else (near if m // nodes_per_package == n // nodes_per_package
                                                           else 32) for m in range(nodes)})
        for n, node in topo.nodes.items()
    }
    return replace(topo, nodes=table)


def background(topology: HostTopology, seed: int, owned_fraction: float) -> list[Placement]:
    """A seeded mix of guests already on the host, up to about `owned_fraction` of its pCPUs."""
    rng = random.Random(seed)
    placed: list[Placement] = []
    limit = owned_fraction * len(topology.usable_cpus)
    index = 0
    while sum(len(p.exclusive_cpus) for p in placed) < limit and index < 2000:
        fields = {"name": f"bg{index}", "vcpus": rng.choice([1, 2, 2, 4, 4, 8]),
                  "memory_mib": rng.choice([1024, 2048, 4096])}
        fields.update(rng.choice([{"cpu_policy": "dedicated"}, {"cpu_policy": "dedicated", "thread_policy": "isolate"},
                                  {"workload_class": "latency-critical"}, {}]))
        index += 1
        try:
            placed.append(allocate(topology, GuestSpec.from_mapping(fields), placed))
        except NoFit:
            continue
    return placed


def fill_nodes(topology: HostTopology, nodes: list[int]) -> list[Placement]:
    """Pin every pCPU of `nodes` to guests (one per node), so those nodes are full."""
    placed: list[Placement] = []
    for node in nodes:
        free = len(topology.cpus_in_node(node) & topology.usable_cpus)
        spec = GuestSpec.from_mapping({"name": f"full{node}", "vcpus": free, "memory_mib": 1024,
                                       "cpu_policy": "dedicated"})
        placed.append(place_on_nodes(topology, spec, [node], placed))
    return placed


def first_fit(topology: HostTopology, guest: GuestSpec, others: Occupancy, cells: int,
              cap_s: float) -> tuple[Placement | None, bool, int]:
    """Nova-like: the first permutation of host nodes where every cell fits. (placement, capped, tried)."""
    options = AllocationOptions()
    views = build_node_views(topology, others.usage(topology), options)
    requests = cell_requests(guest, cells, topology)
    pages = page_options(guest, topology)
    fits: dict[tuple[int, int], bool] = {}

    def fit(cell: int, node: int) -> bool:
        key = (cell, node)
        if key not in fits:
            fits[key] = bool(admit_cell(views[node], requests[cell], pages, options)[0])
        return fits[key]

    candidates = [n for n in sorted(views) if views[n].has_cpus]
    deadline = time.perf_counter() + cap_s
    tried = 0
    for perm in itertools.permutations(candidates, cells):
        tried += 1
        if tried % 65536 == 0 and time.perf_counter() > deadline:
            return None, True, tried
        if all(fit(i, node) for i, node in enumerate(perm)):
            try:
                return place_on_nodes(topology, guest, perm, others, options=options), False, tried
            except NoFit:
                continue
    return None, False, tried


def timed(fn, repeats: int = REPEATS) -> tuple[object, list[float]]:
    result, times = None, []
    for _ in range(repeats):
        start = time.perf_counter()
        try:
            result = fn()
        except NoFit as failure:
            result = failure
        times.append((time.perf_counter() - start) * 1000)
    return result, times


def run_case(name: str, topology: HostTopology, others: list[Placement], spec: dict, cap_s: float) -> dict:
    guest = GuestSpec.from_mapping(spec)
    occupancy = Occupancy(others)
    cells = spec.get("numa_nodes", 1)
    chosen, times = timed(lambda: allocate(topology, guest, Occupancy(others)))
    start = time.perf_counter()
    reference, capped, tried = first_fit(topology, guest, occupancy, cells, cap_s)
    firstfit_ms = (time.perf_counter() - start) * 1000
    row = {
        "name": name,
        "numa_nodes": len(topology.nodes),
        "pcpus": len(topology.cpus),
        "guest_cells": cells,
        "vmplacer_ms": round(statistics.median(times), 3),
        "firstfit_ms": round(firstfit_ms, 3),
        "vmplacer_score": chosen.score if isinstance(chosen, Placement) else None,
        "firstfit_score": reference.score if reference is not None else None,
        "vmplacer_ms_max": round(max(times), 3),
        "firstfit_capped": capped,
        "firstfit_permutations_tried": tried,
        "guests_already_placed": len(others),
    }
    if not isinstance(chosen, Placement):
        row["vmplacer_nofit"] = [str(r) for r in chosen.reasons][:4]
    print(f"{name:42s} vmplacer {row['vmplacer_ms']:8.2f} ms (max {row['vmplacer_ms_max']:.2f})  "
          f"first-fit {row['firstfit_ms']:10.2f} ms{' CAPPED' if capped else ''}  "
          f"scores {row['vmplacer_score']} vs {row['firstfit_score']}", flush=True)
    return row


def fill_case(seed: int = 100) -> dict:
    topology = host(2, 28, 2, 1, 192)
    rng = random.Random(seed)
    kinds = [
        {"cpu_policy": "dedicated"}, {"cpu_policy": "dedicated", "thread_policy": "isolate"},
        {"cpu_policy": "dedicated", "thread_policy": "require"}, {"workload_class": "latency-critical"},
        {}, {"workload_class": "batch"}, {"cpu_policy": "mixed", "dedicated_vcpus": "^0"},
        {"cpu_policy": "dedicated", "emulator_threads": "isolate"}, {"cpu_policy": "dedicated", "mem_page_size": "2MB"},
    ]
    specs = []
    for index in range(100):
        kind = dict(rng.choice(kinds))
        vcpus = rng.choice([1, 2, 2, 4]) if "dedicated_vcpus" not in kind else rng.choice([2, 4])
        if kind.get("thread_policy") == "require":
            vcpus = max(2, vcpus - vcpus % 2)
        specs.append(GuestSpec.from_mapping({"name": f"f{index}", "vcpus": vcpus,
                                             "memory_mib": rng.choice([1024, 2048, 4096]), **kind}))
    placed: list[Placement] = []
    times = []
    refused = 0
    start = time.perf_counter()
    for spec in specs:
        one = time.perf_counter()
        try:
            placed.append(allocate(topology, spec, placed))
        except NoFit:
            refused += 1
        times.append((time.perf_counter() - one) * 1000)
    seconds = time.perf_counter() - start
    owned = len(set().union(*(p.exclusive_cpus for p in placed)))
    print(f"fill 100 guests on 2x28x2: {seconds:.3f} s, placed {len(placed)}, refused {refused}, "
          f"{owned}/{len(topology.usable_cpus)} pCPUs owned, slowest {max(times):.2f} ms", flush=True)
    return {"guests": len(specs), "seconds": round(seconds, 4), "placed": len(placed), "refused": refused,
            "owned_pcpus": owned, "pcpus": len(topology.cpus), "max_ms": round(max(times), 3)}


def fleet_batch_case(seed: int = 14) -> dict:
    """100 mixed guests, one request, 10 hosts: file order against batch placement."""
    from vmplacer.app.place.fleet_planner import FleetHost, FleetPlanner

    hosts = [FleetHost(f"h{i}", replace(host(2, 8, 2, 1, 64), name=f"h{i}")) for i in range(10)]  # 32 pCPUs each
    rng = random.Random(seed)
    small = [({"cpu_policy": "dedicated"}, [1, 2, 2]),
             ({"cpu_policy": "dedicated", "thread_policy": "isolate"}, [1, 2]),
             ({}, [1, 2, 4]), ({"workload_class": "latency-critical"}, [1])]
    big = [({"cpu_policy": "dedicated", "numa_nodes": 2}, [20, 24]), ({"cpu_policy": "dedicated"}, [12, 14])]
    specs = []
    for index in range(100):  # every twelfth guest is big: a node or a host's worth of pCPUs
        kind, sizes = rng.choice(big if index % 12 == 11 else small)
        specs.append(GuestSpec.from_mapping({"name": f"g{index}", "vcpus": rng.choice(sizes),
                                             "memory_mib": rng.choice([2048, 4096, 8192]), **kind}))
    file_order = FleetPlanner(max_passes=1).plan(specs, hosts, order=list(range(len(specs))))
    cpu, wall = time.process_time(), time.perf_counter()
    batch = FleetPlanner(budget_s=BATCH_TARGET_S / 2).plan(specs, hosts)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    row = {"guests": len(specs), "hosts": len(hosts), "pcpus": sum(len(h.topology.cpus) for h in hosts),
           "vcpus_asked": sum(s.vcpus for s in specs),
           "file_order_placed": len(file_order.placed_in_order), "batch_placed": len(batch.placed_in_order),
           "batch_first_pass_placed": batch.greedy_placed, "passes": batch.passes,
           "seconds": round(wall, 3), "cpu_seconds": round(cpu, 3)}
    print(f"fleet batch 100 guests on 10 hosts: file order placed {row['file_order_placed']}, "
          f"batch placed {row['batch_placed']} (first pass {row['batch_first_pass_placed']}, "
          f"{row['passes']} passes) in {wall:.3f} s ({cpu:.3f} s CPU)", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "placement.json"))
    parser.add_argument("--cap", type=float, default=20.0, help="first-fit time cap per case, seconds")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)

    hosts = {
        2: host(2, 28, 2, 1, 192),  # 112 pCPUs
        4: host(4, 16, 2, 2, 64),  # 128 pCPUs
        8: host(8, 16, 2, 4, 64),  # 256 pCPUs
        16: host(16, 16, 2, 4, 64),  # 512 pCPUs
    }
    busy = {n: background(topo, seed=n, owned_fraction=0.4) for n, topo in hosts.items()}
    cases = []
    for n, topo in hosts.items():
        cases.append(run_case(f"1-cell 8 vCPU dedicated, {n}-node host", topo, busy[n],
                              {"name": "probe", "vcpus": 8, "memory_mib": 8192, "cpu_policy": "dedicated"}, args.cap))
        cases.append(run_case(f"1-cell 4 vCPU latency-critical, {n}-node host", topo, busy[n],
                              {"name": "probe", "vcpus": 4, "memory_mib": 4096,
                               "workload_class": "latency-critical"}, args.cap))
    for n, cells in ((4, 2), (8, 4), (16, 8)):
        cases.append(run_case(f"{cells}-cell dedicated, {n}-node host", hosts[n], busy[n],
                              {"name": "probe", "vcpus": 8 * cells, "memory_mib": 4096 * cells,
                               "cpu_policy": "dedicated", "numa_nodes": cells}, args.cap))
    cases.append(run_case("8-cell dedicated, 16 nodes, empty host", hosts[16], [],
                          {"name": "probe", "vcpus": 64, "memory_mib": 32768, "cpu_policy": "dedicated",
                           "numa_nodes": 8}, args.cap))
    full = fill_nodes(hosts[16], list(range(8)))
    cases.append(run_case("8-cell dedicated, 16 nodes, nodes 0-7 full", hosts[16], full,
                          {"name": "probe", "vcpus": 64, "memory_mib": 32768, "cpu_policy": "dedicated",
                           "numa_nodes": 8}, args.cap))
    fill = fill_case()
    batch = fleet_batch_case()

    slow = [c["name"] for c in cases if c["vmplacer_ms_max"] >= SINGLE_TARGET_MS]
    worse = [c["name"] for c in cases if c["vmplacer_score"] is not None and c["firstfit_score"] is not None
             and c["vmplacer_score"] < c["firstfit_score"]]
    missed_fit = [c["name"] for c in cases if c["vmplacer_score"] is None and c["firstfit_score"] is not None]
    targets = {
        "single_placement_under_ms": SINGLE_TARGET_MS,
        "single_placements_met": not slow,
        "fill_under_s": FILL_TARGET_S,
        "fill_met": fill["seconds"] < FILL_TARGET_S,
        "never_worse_than_firstfit": not worse and not missed_fit,
        "batch_under_cpu_s": BATCH_TARGET_S,
        "batch_met": batch["cpu_seconds"] < BATCH_TARGET_S and batch["batch_placed"] >= batch["file_order_placed"],
    }
    result = {"machine": machine(), "cases": cases, "fill": fill, "fleet_batch": batch, "targets": targets}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}; targets: {json.dumps(targets)}")
    if slow or worse or missed_fit:
        print(f"missed: slow={slow} worse={worse} missed_fit={missed_fit}", file=sys.stderr)
    met = (targets["single_placements_met"] and targets["fill_met"] and targets["never_worse_than_firstfit"]
           and targets["batch_met"])
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
