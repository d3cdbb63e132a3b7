"""The pCPU map's reading of placements: who owns, who floats, what is pinned where."""

from __future__ import annotations

from vmplacer.core.topology.cpu_map import cpu_layout, cpu_uses, node_free
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.admit import AllocationOptions
from vmplacer.core.topology.host import uniform_topology

TOPOLOGY = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2).with_reserved({0, 8})
DB = Placement(guest="db", host="h", vcpupin={0: frozenset({1}), 1: frozenset({9})}, emulatorpin=frozenset({2}),
               memory_kib=1024, dedicated=True, exclusive_cpus=frozenset({1, 9}))
WEB = Placement(guest="web", host="h", vcpupin={0: frozenset({2, 3, 10, 11})}, memory_kib=1 << 20,
                iothreadpin={1: frozenset({3})})


def test_owners_floaters_and_pins_land_on_their_pcpus():
    uses = cpu_uses(TOPOLOGY, [WEB, DB])
    assert (uses[1].kind, uses[1].exclusive) == ("exclusive", "db") and uses[9].exclusive == "db"
    assert uses[2].kind == "floating" and uses[2].floating == ("web",) and uses[2].emulator == ("db",)
    assert uses[2].guests == ("web", "db")
    assert uses[3].iothreads == ("web",) and "iothread web" in uses[3].describe()
    assert uses[0].kind == "reserved" and "reserved for the host" in uses[0].describe()
    assert uses[4].kind == "free" and uses[4].describe().endswith(": free")
    assert {u.kind for u in uses.values()} <= {"reserved", "exclusive", "floating", "free"}


def test_the_layout_nests_every_pcpu_once_by_package_node_cache_and_core():
    layout = cpu_layout(TOPOLOGY)
    drawn = [cpu for p in layout for n in p.nodes for c in n.caches for core in c.cores for cpu in core]
    assert sorted(drawn) == sorted(TOPOLOGY.cpus) and len(drawn) == len(set(drawn))
    assert [n.node for p in layout for n in p.nodes] == [0, 1]
    assert layout[0].nodes[0].caches[0].cores[1] == (1, 9)  # a core's SMT siblings together


def test_node_room_counts_whole_cores_left_by_exclusive_owners_only():
    rooms = {n.node: n for n in node_free(TOPOLOGY, [DB, WEB], AllocationOptions())}
    # node 0: core 0 reserved, core 1 owned by db; cores 2 and 3 stay whole (web only floats there)
    assert (rooms[0].whole_cores, rooms[0].cores) == (2, 4)
    assert rooms[1].whole_cores == 4 and rooms[1].free_kib == rooms[1].memory_kib
    assert rooms[0].free_kib < rooms[0].memory_kib
