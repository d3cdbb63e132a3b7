"""The FastAPI application: `create_app(container)`; `vmplacer serve` runs it under uvicorn.

Layers of a request, outside in: request id → body size limit → Idempotency-Key
handling → routing → bearer-token check (one dependency on the whole app) → unknown
query parameters refused → the route.
"""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from vmplacer import __version__
from vmplacer.api.auth import authorize
from vmplacer.api.errors import install_error_handlers
from vmplacer.api.idempotency import IdempotencyMiddleware
from vmplacer.api.limits import BodySizeLimit
from vmplacer.api.openapi import TAGS, install_contract, operation_id
from vmplacer.api.request_id import RequestIdMiddleware
from vmplacer.api.services import ApiOptions, ApiServices
from vmplacer.bootstrap import Container
from vmplacer.web.security import SecurityHeaders
from vmplacer.ports import LeaseStore

DESCRIPTION = """\
Placement controller for libvirt/KVM hosts: topology-aware placement with pinning,
Freeze'nSense interference profiling, rebalancing plans.

Every route except `/healthz` (and the web view under `/ui/`, which signs in with a token
once and keeps a read-only sign-in on the server, its random id in a cookie) needs `Authorization: Bearer <token>` (`vmplacer token
create NAME --scope read|admin`). GET needs a read or admin token; anything else needs
admin. POSTs accept an `Idempotency-Key` header: a retry returns the first answer.

Errors have one shape: `{"error": {"code", "message", "details", "request_id"}}`, `details` a
list of `{"field", "rule", "reason", ...}` (ErrorDetails). Every response carries `X-Request-Id`:
send your own (1-128 characters of `A-Za-z0-9._:-`) to have it echoed, else one is made.
Query parameters a route does not declare are refused (422), as unknown body keys are.
Timestamps are ISO 8601 UTC strings (`format: date-time`).
"""


def create_app(container: Container, options: ApiOptions | None = None,
               leases: LeaseStore | None = None) -> FastAPI:
    services = ApiServices(container, options)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        from anyio.to_thread import current_default_thread_limiter
        from starlette.concurrency import run_in_threadpool

        # Synchronous routes run on this loop's default thread limiter; the database pool is
        # sized for it (bootstrap.container.SERVER_POOL_SIZE + SERVER_POOL_OVERFLOW).
        current_default_thread_limiter().total_tokens = services.options.request_threads
        await run_in_threadpool(services.start, leases)
        # Everything loaded so far lives as long as the process: keep the cyclic garbage
        # collector from walking it again and again (shorter pauses under load).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await run_in_threadpool(services.stop)

    app = FastAPI(
        title="vmplacer",
        version=__version__,
        description=DESCRIPTION,
        openapi_url=None,  # served below, behind the token check like everything else
        docs_url=None,
        redoc_url=None,
        dependencies=[Depends(authorize)],
        lifespan=lifespan,
        openapi_tags=TAGS,
        generate_unique_id_function=operation_id,
    )
    app.state.services = services
    install_error_handlers(app, on_libvirt_error=services.metrics.libvirt_error)

    from vmplacer.api.routes import audit, health, hosts, jobs, placements, plans, profiles, protect, reconcile

    for module in (health, hosts, placements, profiles, plans, protect, reconcile, jobs, audit):
        app.include_router(module.router)

    from vmplacer.web.routes import mount as mount_web_view

    mount_web_view(app, services)  # /ui/: the operator's read-only view (cookie sign-in, no bearer)
    install_contract(app)

    @app.get("/openapi.json", include_in_schema=False)
    def openapi_document() -> JSONResponse:
        return JSONResponse(app.openapi())

    # add_middleware wraps: the last added is the outermost.
    app.add_middleware(IdempotencyMiddleware, services=lambda: services)
    app.add_middleware(BodySizeLimit, max_bytes=container.settings.api.max_request_bytes)
    app.add_middleware(RequestMetrics, metrics=services.metrics)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(RequestIdMiddleware)
    return app


class RequestMetrics:
    """Counts requests by route template and status, and their latency (pure ASGI: cheap)."""

    def __init__(self, app: Any, metrics: Any):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def recording_send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            method = scope.get("method", "")
            self.metrics.http_requests.labels(method, template, str(status)).inc()
            self.metrics.http_latency.labels(method, template).observe(time.perf_counter() - started)
