"""Who uses each pCPU of a host, and how much room each NUMA node has left.

What an operator's view of a host draws: every pCPU in its place (package → NUMA node →
last-level cache → core → SMT thread) with the guest owning it exclusively, the shared guests
floating over it, the emulator threads and IOThreads pinned to it, or the host keeping it.
Pure: a topology and placements in, plain values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vmplacer.core.placement.occupancy import exclusive_of, split_vcpus, usage_of
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.admit import AllocationOptions, node_views
from vmplacer.core.topology.host import HostTopology

KINDS = ("offline", "reserved", "exclusive", "floating", "free")


@dataclass(frozen=True)
class CpuUse:
    """One pCPU: where it sits and who uses it."""

    cpu: int
    package: int
    node: int
    llc: int | None
    core: int
    online: bool = True
    reserved: bool = False  # kept for the host
    exclusive: str | None = None  # the guest whose dedicated vCPU owns it
    floating: tuple[str, ...] = ()  # shared guests whose vCPU pins include it
    emulator: tuple[str, ...] = ()  # guests whose emulator threads are pinned to it
    iothreads: tuple[str, ...] = ()  # guests with an IOThread pinned to it

    @property
    def kind(self) -> str:
        """The one word the map colours by (one of KINDS); pins of emulator threads and
        IOThreads are marked on top of it."""
        if not self.online:
            return "offline"
        if self.exclusive is not None:
            return "exclusive"
        if self.reserved:
            return "reserved"
        return "floating" if self.floating else "free"

    @property
    def guests(self) -> tuple[str, ...]:
        """Every guest on it, each once: owner first, then floating, emulator and IOThread pins."""
        seen: dict[str, None] = {}
        for name in ((self.exclusive,) if self.exclusive else ()) + self.floating + self.emulator + self.iothreads:
            seen.setdefault(name, None)
        return tuple(seen)

    def describe(self) -> str:
        """One line for a tooltip, e.g. "pCPU 7 (node 0, core 3): exclusive db; emulator web"."""
        parts = [] if self.online else ["offline"]
        if self.exclusive is not None:
            parts.append(f"exclusive {self.exclusive}")
        if self.floating:
            parts.append("floating " + ", ".join(self.floating))
        if self.reserved:
            parts.append("reserved for the host")
        if self.emulator:
            parts.append("emulator " + ", ".join(self.emulator))
        if self.iothreads:
            parts.append("iothread " + ", ".join(self.iothreads))
        return f"pCPU {self.cpu} (node {self.node}, core {self.core}): " + ("; ".join(parts) or "free")


def cpu_uses(topology: HostTopology, placements: Iterable[Placement]) -> dict[int, CpuUse]:
    """pCPU -> its use. A dedicated vCPU on a pCPU of its placement's exclusive set owns it;
    any other pinned vCPU floats over its pins (an empty pin, "anywhere", marks nothing)."""
    owner: dict[int, str] = {}
    floating: dict[int, list[str]] = {}
    emulator: dict[int, list[str]] = {}
    iothreads: dict[int, list[str]] = {}
    for placement in sorted(placements, key=lambda p: p.guest):
        dedicated, shared = split_vcpus(placement)
        for cpu in set(dedicated.values()) | set(exclusive_of(placement)):
            owner.setdefault(cpu, placement.guest)
        for cpu in sorted({c for pins in shared.values() for c in pins}):
            _add(floating, cpu, placement.guest)
        for cpu in sorted(placement.emulatorpin):
            _add(emulator, cpu, placement.guest)
        for cpu in sorted({c for pins in placement.iothreadpin.values() for c in pins}):
            _add(iothreads, cpu, placement.guest)
    return {
        cpu.id: CpuUse(cpu.id, cpu.package, cpu.node, cpu.llc, cpu.core, cpu.online, cpu.id in topology.reserved,
                       owner.get(cpu.id), tuple(floating.get(cpu.id, ())), tuple(emulator.get(cpu.id, ())),
                       tuple(iothreads.get(cpu.id, ())))
        for cpu in sorted(topology.cpus.values(), key=lambda c: c.id)
    }


def _add(table: dict[int, list[str]], cpu: int, guest: str) -> None:
    names = table.setdefault(cpu, [])
    if guest not in names:
        names.append(guest)


@dataclass(frozen=True)
class CacheGroup:
    llc: int | None
    cores: tuple[tuple[int, ...], ...]  # each core's pCPUs (its SMT threads)


@dataclass(frozen=True)
class NodeGroup:
    node: int
    caches: tuple[CacheGroup, ...]


@dataclass(frozen=True)
class PackageGroup:
    package: int
    nodes: tuple[NodeGroup, ...]


def cpu_layout(topology: HostTopology) -> tuple[PackageGroup, ...]:
    """The host's pCPUs nested as drawn: packages → NUMA nodes → LLC groups → cores → threads,
    each level in id order (a core in the order of its lowest thread)."""
    tree: dict[int, dict[int, dict[int | None, list[tuple[int, ...]]]]] = {}
    for core in topology.cores:
        llc = topology.cpus[core.cpus[0]].llc
        tree.setdefault(core.package, {}).setdefault(core.node, {}).setdefault(llc, []).append(tuple(core.cpus))
    return tuple(
        PackageGroup(package, tuple(
            NodeGroup(node, tuple(CacheGroup(llc, tuple(cores))
                                  for llc, cores in sorted(caches.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))))
            for node, caches in sorted(nodes.items())))
        for package, nodes in sorted(tree.items()))


@dataclass(frozen=True)
class NodeFree:
    """One NUMA node's room as placing sees it: whole free cores and free small-page memory."""

    node: int
    whole_cores: int
    cores: int
    free_kib: int
    memory_kib: int


def node_free(topology: HostTopology, placements: Sequence[Placement], options: AllocationOptions
              ) -> tuple[NodeFree, ...]:
    """Each node with pCPUs or memory: the allocator's own node views of the host with these
    placements on it (so the numbers are the ones a placement would be judged against)."""
    views = node_views(topology, usage_of(topology, placements), options, "performance")
    return tuple(
        NodeFree(node, sum(1 for c in view.cores if c.whole), len(view.cores), view.small_free_kib,
                 topology.nodes[node].memory_kib if node in topology.nodes else 0)
        for node, view in sorted(views.items()))
