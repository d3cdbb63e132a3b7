"""A neighbour's distance is the closest pair's class, found level by level rather than pair by pair."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from vmplacer.app.observe.profiler import UNKNOWN_DISTANCE, neighbour_distance
from vmplacer.core.topology.host import uniform_topology


def closest_pair(topology, mine, theirs) -> str:
    classes = [topology.distance_class(a, b) for a in mine for b in theirs if a in topology.cpus and b in topology.cpus]
    return min(classes, key=lambda c: c.rank).value if classes else UNKNOWN_DISTANCE


@pytest.mark.parametrize("seed", range(8))
def test_the_closest_level_shared_is_the_closest_pair(seed):
    rng = random.Random(seed)
    topology = uniform_topology(nodes=rng.choice([1, 2, 4]), cores_per_node=rng.choice([2, 4]),
                                threads_per_core=rng.choice([1, 2]), llc_per_node=rng.random() < 0.7, name="h")
    if seed % 3 == 0:  # a host that reports no L2 and, for some pCPUs, no LLC
        topology = replace(topology, cpus={i: replace(c, l2=None, llc=c.llc if i % 2 else None)
                                           for i, c in topology.cpus.items()})
    cpus = sorted(topology.cpus)
    for _ in range(200):
        mine = frozenset(rng.sample(cpus, rng.randint(1, min(6, len(cpus)))) + ([999] if rng.random() < 0.1 else []))
        theirs = frozenset(rng.sample(cpus, rng.randint(1, min(6, len(cpus)))))
        assert neighbour_distance(topology, mine, theirs) == closest_pair(topology, mine, theirs)
    assert neighbour_distance(topology, frozenset({999}), frozenset(cpus)) == UNKNOWN_DISTANCE
    assert neighbour_distance(None, frozenset({0}), frozenset({1})) == UNKNOWN_DISTANCE
