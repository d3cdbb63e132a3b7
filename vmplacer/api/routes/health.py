"""Liveness, readiness and metrics."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from vmplacer.api.deps import Services
from vmplacer.api.errors import COMMON_RESPONSES, UNEXPECTED
from vmplacer.api.schemas import Health, Readiness, ReadyCheck
from vmplacer.api.strict_json import StrictJsonRoute

router = APIRouter(tags=["operations"], route_class=StrictJsonRoute)
HOST_CHECK_TIMEOUT_S = 5.0


@router.get("/healthz", operation_id="getHealth", response_model=Health,
            summary="liveness: the process answers (no token needed)", responses=UNEXPECTED)
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", operation_id="getReadiness", response_model=Readiness,
            summary="readiness: the database answers, and every host's libvirt answers and its topology can be read",
            responses={**COMMON_RESPONSES, 503: {"model": Readiness, "description": "a check failed"}})
def readyz(services: Services) -> JSONResponse:
    checks = [_database_check(services)]
    hosts = services.host_names
    pool = ThreadPoolExecutor(max_workers=max(1, min(8, len(hosts))), thread_name_prefix="readyz")
    try:
        futures = {name: pool.submit(_read_host, services.container.hypervisor(name)) for name in hosts}
        for name, future in futures.items():
            try:
                facts = future.result(timeout=HOST_CHECK_TIMEOUT_S)
                checks.append(ReadyCheck(name=f"host {name}", ok=True,
                                         detail=f"{facts.get('driver')} on {facts.get('hostname')}, "
                                                f"{facts.get('domains')} domains"))
            except FutureTimeout:
                checks.append(ReadyCheck(name=f"host {name}", ok=False,
                                         detail=f"host {name}: no answer within {HOST_CHECK_TIMEOUT_S:g} s"))
            except Exception as exc:  # noqa: BLE001 - each failure is reported, not raised
                services.metrics.libvirt_error(exc)
                checks.append(ReadyCheck(name=f"host {name}", ok=False, detail=str(exc)))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung host must not hang the probe
    ready = all(check.ok for check in checks)
    body = Readiness(ready=ready, checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


def _read_host(host: Any) -> dict[str, Any]:
    """What placing and planning read first: a host that answers a ping but whose topology
    cannot be read (capabilities without NUMA cells, reserved CPUs it does not have) is
    left out of every plan and placement, so it is not ready either."""
    facts = host.ping()
    host.topology()
    return facts


def _database_check(services) -> ReadyCheck:  # type: ignore[no-untyped-def]
    try:
        services.container.ping_database()
        current, head = services.container.schema_revisions()
    except Exception as exc:  # noqa: BLE001
        return ReadyCheck(name="database", ok=False, detail=f"{exc.__class__.__name__}: {exc}"[:500])
    if current != head:
        return ReadyCheck(name="database", ok=False,
                          detail=f"schema at revision {current}, this vmplacer needs {head}: run `vmplacer db upgrade`")
    return ReadyCheck(name="database", ok=True, detail=f"schema at revision {current}")


@router.get("/metrics", operation_id="getMetrics", summary="Prometheus metrics", response_class=Response,
            responses={**COMMON_RESPONSES, 200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                                 "description": "Prometheus text format"}})
def metrics(services: Services) -> Response:
    return Response(services.metrics.render(), media_type=CONTENT_TYPE_LATEST)
