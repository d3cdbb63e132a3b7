"""Configured hosts and their topology."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Request

from vmplacer.api.leases import live_holders
from vmplacer.api.errors import COMMON_RESPONSES, HOST_ERROR, NOT_FOUND, ApiError
from vmplacer.api.schemas import HOST_NAME, HostList, HostView
from vmplacer.ports import HypervisorError

router = APIRouter(prefix="/v1/hosts", tags=["hosts"])


def known_host(services: Any, name: str) -> None:
    if name not in services.host_names:
        raise ApiError(404, "not-found", f"host {name!r} is not configured "
                       f"(configured: {', '.join(services.host_names) or 'none'})", {"host": name})


@router.get("", response_model=HostList, summary="configured hosts and whether each answers",
            responses=COMMON_RESPONSES)
def list_hosts(request: Request) -> HostList:
    services = request.app.state.services
    leases = live_holders(services.container)
    hosts = []
    for settings in services.settings.hosts:
        entry: dict[str, Any] = {"name": settings.name, "uri": settings.uri, "reachable": False,
                                 "lease": leases.get(settings.name)}
        try:
            entry.update(services.container.hypervisor(settings.name).ping())
            entry["reachable"] = True
        except HypervisorError as exc:
            services.metrics.libvirt_error(exc)
            entry["error"] = str(exc)
        hosts.append(HostView(**entry))
    return HostList(hosts=hosts)


@router.get("/{host}/topology", summary="the host's NUMA nodes, cores, threads and caches "
            "(the JSON of `vmplacer topology --format json`)",
            responses={**COMMON_RESPONSES, **NOT_FOUND, **HOST_ERROR,
                       200: {"content": {"application/json": {"schema": {"type": "object"}}},
                             "description": "HostTopology.to_dict()"}})
def topology(request: Request, host: str = Path(pattern=HOST_NAME, max_length=63)) -> dict[str, Any]:
    services = request.app.state.services
    known_host(services, host)
    return services.container.hypervisor(host).topology().to_dict()
