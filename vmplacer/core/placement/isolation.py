"""The isolation invariant, stated once: exclusive pCPUs stay exclusive.

No vCPU or emulator thread of a guest may run on a pCPU that another guest
holds exclusively, and no vCPU on a pCPU the host reserves (`reserved_cpus`).
Emulator threads may sit on reserved pCPUs only where the host's
`emulator_cpus` sends them (Nova's `cpu_shared_set` habit). An empty pin set
means "anywhere", which is a violation as soon as anything is exclusive.

Every path that changes a host (place, narrowing of floaters, repin, migrate,
reconcile) checks its result with `isolation_violations`; an empty list is the
only acceptable answer. Pure: placements and topology in, named problems out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.placement.occupancy import exclusive_of
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import HostTopology

RESERVED = ""  # the owner of a host-reserved pCPU


@dataclass(frozen=True)
class IsolationViolation:
    """One thread of `guest` allowed onto pCPUs it must not use, and whose they are."""

    host: str
    guest: str
    thread: str  # "vCPU 3" | "emulator" | "iothread 1"
    cpus: frozenset[int]
    owner: str  # the guest holding them exclusively, or RESERVED (the host's)

    def describe(self) -> str:
        whose = f"exclusive to guest {self.owner}" if self.owner else "reserved for the host"
        return (f"host {self.host}: {self.thread} of guest {self.guest} may run on pCPUs "
                f"{format_cpuset(self.cpus)}, {whose}")

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "guest": self.guest, "thread": self.thread,
                "cpus": sorted(self.cpus), "owner": self.owner or None, "message": self.describe()}


def exclusive_owners(placements: Sequence[Placement]) -> dict[int, str]:
    """pCPU -> the guest that holds it exclusively (the first one, if two claim it)."""
    owners: dict[int, str] = {}
    for placement in placements:
        for cpu in exclusive_of(placement):
            owners.setdefault(cpu, placement.guest)
    return owners


def isolation_violations(topology: HostTopology, placements: Sequence[Placement], *,
                         emulator_cpus: frozenset[int] = frozenset()) -> list[IsolationViolation]:
    """Every thread of every guest that may run where the invariant forbids, in guest order."""
    owners = exclusive_owners(placements)
    anywhere = frozenset(topology.online_cpus)
    found: list[IsolationViolation] = []
    for placement in placements:
        threads = [(f"vCPU {vcpu}", pins or anywhere, topology.reserved)
                   for vcpu, pins in sorted(placement.vcpupin.items())]
        threads.append(("emulator", placement.emulatorpin or anywhere, topology.reserved - emulator_cpus))
        threads.extend((f"iothread {iothread}", pins or anywhere, topology.reserved - emulator_cpus)
                       for iothread, pins in sorted(placement.iothreadpin.items()))
        for thread, cpus, forbidden in threads:
            by_owner: dict[str, set[int]] = {}
            for cpu in sorted(cpus):
                owner = owners.get(cpu)
                if owner is not None and owner != placement.guest:
                    by_owner.setdefault(owner, set()).add(cpu)
                elif owner is None and cpu in forbidden:
                    by_owner.setdefault(RESERVED, set()).add(cpu)
            found.extend(IsolationViolation(placement.host or topology.name, placement.guest, thread,
                                            frozenset(cpus_of), owner)
                         for owner, cpus_of in sorted(by_owner.items()))
    return found
