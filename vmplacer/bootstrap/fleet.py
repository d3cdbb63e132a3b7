"""Composition of host choice over the fleet: container (and API services) → `FleetPlacement`.

Part of the composition root: the CLI and the API get their fleet placement
here, never by wiring hosts, snapshots and libvirt's refusals themselves.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from vmplacer.adapters.libvirt_errors import DomainRefused
from vmplacer.app.place.fleet_placement import FleetPlacement
from vmplacer.app.place.placement_service import PlacementService

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices


def cli_fleet_placement(container: Any) -> tuple[FleetPlacement, PlacementService]:
    """Live reads for ranking and placing (a CLI run places a few guests, then exits)."""
    service = container.placement_service()
    return FleetPlacement(service, container.hypervisor, container.hypervisor, refusals=(DomainRefused,)), service


def api_fleet_placement(services: ApiServices) -> FleetPlacement:
    """Dry runs on the API's short-lived host snapshots, placements live; every placement
    drops its host's snapshot, and libvirt errors are counted."""
    return FleetPlacement(services.dry_runs, services.snapshots.view, services.container.hypervisor,
                          on_libvirt_error=services.metrics.libvirt_error,
                          invalidate=services.snapshots.invalidate, refusals=(DomainRefused,),
                          memo=services.survey_memo, changes=services.snapshots.changes)
