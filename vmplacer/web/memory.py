"""Each NUMA node's memory as the host page shows it: its size, the small-page memory a
placement could still take, and its hugepage pools. The free figure is the allocator's own
(core/placement/occupancy.py): it leaves out the pools and the host's per-node reserve, so the
pools are listed beside it rather than silently missing. Pure: topology and placements in,
plain dictionaries out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vmplacer.core.placement.admit import AllocationOptions, node_views
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.occupancy import SMALL_PAGE_KIB, usage_of
from vmplacer.core.topology.host import HostTopology


def page_size(kib: int) -> str:
    """A page size as operators name it: "2 MiB", "1 GiB", "64 KiB"."""
    for unit, size in (("GiB", 1 << 20), ("MiB", 1 << 10)):
        if kib >= size and kib % size == 0:
            return f"{kib // size} {unit}"
    return f"{kib} KiB"


def node_memory(topology: HostTopology, placements: Sequence[Placement], options: AllocationOptions
                ) -> list[dict[str, Any]]:
    """Per node with memory: MiB in all, MiB of small pages free for placing (net of the pools,
    the reserve and the recorded placements), the reserve, and each hugepage pool that holds pages: its page size,
    pages in all, pages free as the kernel counts them and as placing counts them (the kernel's
    free pages less those recorded placements will take)."""
    views = node_views(topology, usage_of(topology, placements), options, "performance")
    rows = []
    for node_id, node in sorted(topology.nodes.items()):
        if not node.memory_kib and not node.hugepages:
            continue
        view = views.get(node_id)
        pools = [{"size_kib": pool.size_kib, "size": page_size(pool.size_kib), "total": pool.total,
                  "free": pool.free, "placeable": view.huge_free.get(pool.size_kib, 0) if view else 0,
                  "total_mib": pool.size_kib * pool.total // 1024}
                 for pool in sorted(node.hugepages, key=lambda p: p.size_kib)
                 if pool.size_kib > SMALL_PAGE_KIB and pool.total]
        rows.append({"node": node_id, "memory_mib": node.memory_kib // 1024,
                     "free_mib": (view.small_free_kib if view else 0) // 1024,
                     "reserved_mib": options.reserved_memory_mib_per_node,
                     "hugepage_mib": sum(p["total_mib"] for p in pools), "pools": pools})
    return rows
