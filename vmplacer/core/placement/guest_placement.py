"""Where one guest runs: vCPU→pCPU map, emulator cpuset, memory nodes, guest NUMA cells.

The same value is produced by the allocator, rendered into domain XML, parsed
back from live XML and compared by the rebalancer, so it is defined once here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from vmplacer.core.topology.cpuset import format_cpuset

MEM_MODES = ("strict", "preferred", "interleave", "restrictive")


NO_IOTHREADS: Mapping[int, frozenset[int]] = MappingProxyType({})  # shared, read-only: most domains have none


@dataclass(frozen=True)
class GuestCell:
    """One guest NUMA cell: its vCPUs, memory, and the host node backing it.

    `memory_node` is set when the cell's memory lives apart from its vCPUs, on a
    memory-only (CPU-less) node the request named; None: on `host_node`.
    """

    id: int
    vcpus: frozenset[int]
    memory_kib: int
    host_node: int
    memory_node: int | None = None

    @property
    def memory_host_node(self) -> int:
        """The host node holding this cell's memory."""
        return self.host_node if self.memory_node is None else self.memory_node


@dataclass(frozen=True)
class Placement:
    guest: str
    host: str
    vcpupin: dict[int, frozenset[int]]  # vCPU index -> pCPUs it may run on
    emulatorpin: frozenset[int] = frozenset()
    memory_nodes: frozenset[int] = frozenset()
    mem_mode: str = "strict"
    cells: tuple[GuestCell, ...] = ()
    memory_kib: int = 0
    hugepage_kib: int | None = None  # page size backing guest memory; None = small pages
    threads_per_core: int = 1  # guest <cpu><topology threads=…> (2 when on sibling pairs)
    dedicated: bool = False  # vCPUs own their pCPUs exclusively
    exclusive_cpus: frozenset[int] = field(default_factory=frozenset)  # pCPUs nobody else may use
    score: float = 0.0
    # Guests this one refuses to share a NUMA node with, as its domain XML's vmplacer metadata
    # says: read so that a rule written into a domain binds even where no record of it is kept.
    # It is who the guest refuses, not where it runs: never compared, stored or rendered from here.
    anti_affinity: tuple[str, ...] = field(default=(), compare=False)
    # IOThread -> pCPUs as the domain says: read from a host, never recorded (IOThreads float with
    # the emulator threads, so the record's emulatorpin is where they belong) nor compared.
    iothreadpin: Mapping[int, frozenset[int]] = field(default_factory=lambda: NO_IOTHREADS, compare=False)

    @property
    def vcpus(self) -> int:
        return len(self.vcpupin)

    @property
    def pcpus(self) -> frozenset[int]:
        """Every pCPU the guest's vCPUs may run on."""
        used: set[int] = set()
        for cpus in self.vcpupin.values():
            used |= cpus
        return frozenset(used)

    def to_dict(self) -> dict[str, Any]:
        return {
            "guest": self.guest,
            "host": self.host,
            "vcpupin": {str(v): sorted(c) for v, c in sorted(self.vcpupin.items())},
            "emulatorpin": sorted(self.emulatorpin),
            "memory_nodes": sorted(self.memory_nodes),
            "mem_mode": self.mem_mode,
            "cells": [_cell_dict(cell) for cell in self.cells],
            "memory_kib": self.memory_kib,
            "hugepage_kib": self.hugepage_kib,
            "threads_per_core": self.threads_per_core,
            "dedicated": self.dedicated,
            "exclusive_cpus": sorted(self.exclusive_cpus),
            "score": round(self.score, 6),
        }

    def describe_pinning(self) -> str:
        """Short human form, e.g. "0→2 1→3 emu→0-1 mem→0"."""
        parts = [f"{v}→{format_cpuset(c)}" for v, c in sorted(self.vcpupin.items())]
        if self.emulatorpin:
            parts.append(f"emu→{format_cpuset(self.emulatorpin)}")
        if self.memory_nodes:
            parts.append(f"mem→{format_cpuset(self.memory_nodes)}")
        return " ".join(parts)


def _cell_dict(cell: GuestCell) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": cell.id,
        "vcpus": sorted(cell.vcpus),
        "memory_kib": cell.memory_kib,
        "host_node": cell.host_node,
    }
    if cell.memory_node is not None:
        data["memory_node"] = cell.memory_node
    return data


def placement_from_dict(data: dict[str, Any]) -> Placement:
    """Inverse of `Placement.to_dict` (the stored and the API form)."""
    return Placement(
        guest=str(data["guest"]),
        host=str(data["host"]),
        vcpupin={int(v): frozenset(int(c) for c in cpus) for v, cpus in data.get("vcpupin", {}).items()},
        emulatorpin=frozenset(int(c) for c in data.get("emulatorpin", [])),
        memory_nodes=frozenset(int(n) for n in data.get("memory_nodes", [])),
        mem_mode=str(data.get("mem_mode", "strict")),
        cells=tuple(
            GuestCell(
                id=int(cell["id"]),
                vcpus=frozenset(int(v) for v in cell["vcpus"]),
                memory_kib=int(cell["memory_kib"]),
                host_node=int(cell["host_node"]),
                memory_node=None if cell.get("memory_node") is None else int(cell["memory_node"]),
            )
            for cell in data.get("cells", [])
        ),
        memory_kib=int(data.get("memory_kib", 0)),
        hugepage_kib=None if data.get("hugepage_kib") is None else int(data["hugepage_kib"]),
        threads_per_core=int(data.get("threads_per_core", 1)),
        dedicated=bool(data.get("dedicated", False)),
        exclusive_cpus=frozenset(int(c) for c in data.get("exclusive_cpus", [])),
        score=float(data.get("score", 0.0)),
    )
