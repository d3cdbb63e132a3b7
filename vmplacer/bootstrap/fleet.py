"""Composition of host choice over the fleet for the command line: container → `FleetPlacement`.

Part of the composition root: the CLI gets its fleet placement here, never by wiring hosts and
libvirt's refusals itself. (The API builds its own from its services, in `api/placing.py`: the
composition root names no front end, not even for annotations.)
"""

from __future__ import annotations

from typing import Any

from vmplacer.adapters.libvirt_errors import DomainRefused
from vmplacer.app.place.fleet_placement import FleetPlacement
from vmplacer.app.place.placement_service import PlacementService


def cli_fleet_placement(container: Any) -> tuple[FleetPlacement, PlacementService]:
    """Live reads for ranking and placing (a CLI run places a few guests, then exits)."""
    service = container.placement_service()
    return FleetPlacement(service, container.hypervisor, container.hypervisor, refusals=(DomainRefused,)), service

