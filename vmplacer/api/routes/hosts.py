"""Configured hosts, their topology, and maintenance mode.

A host in maintenance takes no new guest (placements without `host` skip it,
with `host` get 409) and no migration; `POST /v1/plans` with `drain` plans
the migrations that empty it. PUT enters maintenance (idempotent: the first
record stays), DELETE leaves it.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from fastapi import APIRouter, Path, Request

from vmplacer.api.errors import COMMON_RESPONSES, HOST_ERROR, NOT_FOUND, ApiError
from vmplacer.api.deps import Services
from vmplacer.api.actors import api_actor
from vmplacer.api.schemas import HOST_NAME, HostList, HostView, MaintenanceRequest, MaintenanceView
from vmplacer.api.strict_json import StrictJsonRoute
from vmplacer.api.times import with_api_times
from vmplacer.ports import HypervisorError

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices

router = APIRouter(prefix="/v1/hosts", tags=["hosts"], route_class=StrictJsonRoute)


def known_host(services: ApiServices, name: str) -> None:
    if name not in services.host_names:
        raise ApiError(404, "not-found", f"host {name!r} is not configured "
                       f"(configured: {', '.join(services.host_names) or 'none'})", {"host": name})


def lease_view(lease: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if lease is None else with_api_times(lease, "acquired_at", "expires_at")


def maintenance_view(record: Any) -> dict[str, Any] | None:
    """A maintenance record with `since` spelled as every API timestamp is."""
    return None if record is None else with_api_times(record.to_dict(), "since")


@router.get("", operation_id="listHosts", response_model=HostList, summary="configured hosts and whether each answers",
            responses=COMMON_RESPONSES)
def list_hosts(services: Services) -> HostList:
    leases = services.container.live_leases()
    closed = services.container.maintenance.current()
    hosts = []
    for settings in services.settings.hosts:
        record = closed.get(settings.name)
        entry: dict[str, Any] = {"name": settings.name, "uri": settings.uri, "reachable": False,
                                 "lease": lease_view(leases.get(settings.name)),
                                 "maintenance": maintenance_view(record)}
        try:
            entry.update(services.container.hypervisor(settings.name).ping())
            entry["reachable"] = True
        except HypervisorError as exc:
            services.metrics.libvirt_error(exc)
            entry["error"] = str(exc)
        hosts.append(HostView(**entry))
    return HostList(hosts=hosts)


@router.get("/{host}/topology", operation_id="getHostTopology",
            summary="the host's NUMA nodes, cores, threads and caches "
            "(the JSON of `vmplacer topology --format json`)",
            responses={**COMMON_RESPONSES, **NOT_FOUND, **HOST_ERROR,
                       200: {"content": {"application/json": {"schema": {"type": "object"}}},
                             "description": "HostTopology.to_dict()"}})
def topology(services: Services, host: str = Path(pattern=HOST_NAME, max_length=63)) -> dict[str, Any]:
    known_host(services, host)
    return services.container.hypervisor(host).topology().to_dict()


@router.put("/{host}/maintenance", operation_id="enterMaintenance", response_model=MaintenanceView,
            summary="put a host in maintenance: no new guests, no migrations in (idempotent)",
            responses={**COMMON_RESPONSES, **NOT_FOUND})
def enter_maintenance(request: Request, services: Services, body: MaintenanceRequest,
                      host: str = Path(pattern=HOST_NAME, max_length=63)) -> dict[str, Any]:
    known_host(services, host)
    actor = api_actor(request)
    uri = services.settings.host(host).uri
    record, changed = services.container.maintenance.start(host, uri, by=actor.name,
                                                           reason=body.reason.strip() or body.reason,
                                                           detail=actor.detail())
    services.dry_run_maintenance.invalidate()
    return {"host": host, "changed": changed, "maintenance": maintenance_view(record)}


@router.delete("/{host}/maintenance", operation_id="leaveMaintenance", response_model=MaintenanceView,
               summary="take a host out of maintenance", responses={**COMMON_RESPONSES, **NOT_FOUND})
def leave_maintenance(request: Request, services: Services,
                      host: str = Path(pattern=HOST_NAME, max_length=63)) -> dict[str, Any]:
    known_host(services, host)
    actor = api_actor(request)
    record = services.container.maintenance.end(host, by=actor.name, detail=actor.detail())
    services.dry_run_maintenance.invalidate()
    return {"host": host, "changed": record is not None, "maintenance": maintenance_view(record)}
