"""What a placement answers, and the per-host lock every placement on a host takes.

Apart from the placement service so that its batch half (app/place/placement_batch.py) uses
them without importing the service.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from vmplacer.core.placement.isolation import IsolationViolation
from vmplacer.core.placement.guest_placement import Placement


@dataclass
class PlaceResult:
    placement: Placement
    xml: str
    state: str  # planned (dry run) | defined | running
    domain_uuid: str | None = None
    narrowed_placements: list[Placement] = field(default_factory=list)  # floating domains, as now pinned
    # what still breaks the isolation invariant on the host after this placement (a floater
    # libvirt refused to narrow, a domain pinned by hand), each named; empty when all is well
    violations: list[IsolationViolation] = field(default_factory=list)

    @property
    def narrowed(self) -> list[str]:
        """The floating domains whose pins this placement narrowed."""
        return [p.guest for p in self.narrowed_placements]

    def narrowed_pins(self) -> list[dict[str, Any]]:
        """Each narrowed domain's pins now (what libvirt and the records say after the placement)."""
        return [{"guest": p.guest, "host": p.host,
                 "vcpupin": {str(v): sorted(c) for v, c in sorted(p.vcpupin.items())},
                 "emulatorpin": sorted(p.emulatorpin)} for p in self.narrowed_placements]

    def to_dict(self) -> dict[str, Any]:
        data = self.placement.to_dict()
        data.update({"xml": self.xml, "state": self.state, "domain_uuid": self.domain_uuid,
                     "narrowed": self.narrowed, "narrowed_pins": self.narrowed_pins(),
                     "isolation_violations": [v.to_dict() for v in self.violations]})
        return data


_host_locks: dict[str, threading.Lock] = {}
_host_locks_guard = threading.Lock()


def host_lock(host: str) -> threading.Lock:
    """One lock per host in this process: placements on a host are serialized."""
    with _host_locks_guard:
        return _host_locks.setdefault(host, threading.Lock())
