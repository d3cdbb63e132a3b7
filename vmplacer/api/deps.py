"""What the routes take from the composition root, and the only way they reach it.

Handlers declare `services: Services` and FastAPI hands them the application's ApiServices;
they never read `app.state` nor import `vmplacer.bootstrap`, so a test can hand a route any
services, and what builds adapters (rebalancer, profiler, protection loop) stays in
ApiServices. The dependency takes only the request: it adds nothing to the OpenAPI document.

Turning a profiling request into a ProfilerConfig (the settings' defaults under what was
asked) is pure and needed before any service runs (a bad request is refused at once), so it
passes through here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from vmplacer.bootstrap.profiler_config import SensitiveSpecError
from vmplacer.bootstrap.profiler_config import profiler_config as compose_profiler_config

if TYPE_CHECKING:  # named only: the services start the job handlers, which import the routes
    from vmplacer.api.services import ApiServices

__all__ = ["Services", "SensitiveSpecError", "api_services", "compose_profiler_config"]


async def api_services(request: Request) -> ApiServices:
    """The services `create_app` built for this application (async: no thread hop per request)."""
    services: ApiServices = request.app.state.services
    return services


Services = Annotated["ApiServices", Depends(api_services)]
