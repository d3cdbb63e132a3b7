"""Property test: hundreds of random guests on every named topology, invariants after each batch.

No pCPU is ever owned by two guests or used by anyone but its owner, reserved
and offline pCPUs stay untouched, isolate/require/latency-critical hold,
memory and hugepages stay within the nodes, and every refusal names reasons.
"""

from __future__ import annotations

import random

import pytest

from tests.unit.allocation_fixtures import TOPOLOGIES, check_invariants
from vmplacer.core.placement.allocate import NoFit, allocate
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.admit import AllocationOptions, minimum_cells

SEEDS = (1, 2, 3)
GUESTS_PER_RUN = 150


def random_guest(rng: random.Random, index: int, max_nodes: int) -> GuestSpec:
    kind = rng.choice(["shared", "dedicated", "isolate", "require", "latency", "mixed", "batch", "cells"])
    vcpus = rng.choice([1, 1, 2, 2, 3, 4, 6, 8])
    fields: dict = {"name": f"g{index}", "vcpus": vcpus, "memory_mib": rng.choice([256, 512, 1024, 2048, 4096])}
    if kind == "dedicated":
        fields["cpu_policy"] = "dedicated"
    elif kind == "isolate":
        fields.update(cpu_policy="dedicated", thread_policy="isolate")
    elif kind == "require":
        fields.update(cpu_policy="dedicated", thread_policy="require", vcpus=rng.choice([2, 4]))
    elif kind == "latency":
        fields["workload_class"] = "latency-critical"
    elif kind == "mixed":
        fields.update(cpu_policy="mixed", vcpus=max(2, vcpus), dedicated_vcpus="^0")
    elif kind == "batch":
        fields["workload_class"] = "batch"
    elif kind == "cells" and max_nodes > 1:
        cells = rng.randint(2, min(max_nodes, 4))
        fields.update(cpu_policy=rng.choice(["dedicated", "shared"]), numa_nodes=cells,
                      vcpus=cells * rng.choice([1, 2]), memory_mib=cells * 512)
    if fields.get("cpu_policy") in ("dedicated", "mixed") or kind == "latency":
        if rng.random() < 0.2:
            fields["emulator_threads"] = "isolate"
    page = rng.random()
    if page < 0.1:
        fields["mem_page_size"] = "2MB"
    elif page < 0.15:
        fields["mem_page_size"] = "any"
    elif page < 0.2:
        fields.update(mem_page_size="1GB", memory_mib=1024 * fields.get("numa_nodes", 1))
    if rng.random() < 0.05:
        fields["mem_mode"] = rng.choice(["preferred", "interleave", "restrictive"])
    return GuestSpec.from_mapping(fields)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_random_guests_keep_every_invariant(name, seed):
    topology = TOPOLOGIES[name]()
    rng = random.Random(f"{name}-{seed}")
    options = AllocationOptions(cpu_allocation_ratio=rng.choice([1.0, 2.0, 4.0]))
    max_nodes = len(topology.nodes_with_cpus())
    placed: list[Placement] = []
    specs: dict[str, GuestSpec] = {}
    refusals = 0
    for index in range(GUESTS_PER_RUN):
        spec = random_guest(rng, index, max_nodes)
        try:
            placement = allocate(topology, spec, placed, options=options)
        except NoFit as failure:
            refusals += 1
            assert failure.reasons and all(r.constraint and r.where for r in failure.reasons)
            continue
        assert placement.guest == spec.name and placement.host == topology.name
        if spec.numa_nodes is None and minimum_cells(spec, topology, options) == 1:
            assert len(placement.cells) == 1, f"{spec.name} fits one node but was split"
        placed.append(placement)
        specs[spec.name] = spec
        if len(placed) % 25 == 0:
            check_invariants(topology, placed, specs, options)
    check_invariants(topology, placed, specs, options)
    assert placed, "nothing could be placed"
    assert refusals, "the run never filled the host; the test would not exercise limits"
