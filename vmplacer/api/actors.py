"""Who acts: every write through the API is audited as the token that asked for it.

The audit log's `actor` is `api:TOKEN-NAME`; `detail` names the token by name
and id (a name can be reused after a revoke, an id cannot) and the instance
that served the request. Services write their audit entries through a store
built here, so no route can write one that says only "vmplacer".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TYPE_CHECKING

from fastapi import Request

from vmplacer.api.auth import require_principal

if TYPE_CHECKING:
    from vmplacer.ports import PlacementStore
    from vmplacer.api.services import ApiServices
    from vmplacer.app.place.placement_service import PlacementService


@dataclass(frozen=True)
class ApiActor:
    token: str
    token_id: int | None
    instance: str

    @property
    def name(self) -> str:
        """The audit log's actor (its column holds 64 characters; `detail` has the whole name)."""
        return f"api:{self.token}"[:64]

    def detail(self) -> dict[str, Any]:
        return {"via": "api", "token": self.token, "token_id": self.token_id, "instance": self.instance}


def api_actor(request: Request) -> ApiActor:
    principal = require_principal(request)
    return ApiActor(principal.name, principal.id, request.app.state.services.instance)


def acting_store(services: ApiServices, actor: ApiActor) -> PlacementStore:
    """The placement store, auditing as `actor`."""
    return services.container.placement_store_as(actor.name, actor.detail())


def acting_placement(services: ApiServices, actor: ApiActor) -> PlacementService:
    """The placement service (same renderer, same per-host options), auditing as `actor`."""
    return services.placement.acting_through(acting_store(services, actor))


def audit(services: ApiServices, actor: ApiActor, *, action: str, message: str, host: str | None = None,
          guest: str | None = None, detail: dict[str, Any] | None = None) -> None:
    """One audit entry for a write that has no service of its own to record it (queued jobs,
    stored plans)."""
    acting_store(services, actor).audit(action=action, outcome="ok", host=host, guest=guest, message=message,
                                        detail=detail)
