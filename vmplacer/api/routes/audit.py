"""The audit log: every action vmplacer took on a host, its reason and outcome."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Query, Request

from vmplacer.api.errors import COMMON_RESPONSES, ApiError
from vmplacer.api.fields import DOMAIN_NAME_MAX_BYTES, DOMAIN_NAME_PATTERN, check_domain_name
from vmplacer.api.schemas import HOST_NAME, AuditList
from vmplacer.api.strict_json import StrictJsonRoute

router = APIRouter(prefix="/v1/audit", tags=["audit"], route_class=StrictJsonRoute)
ISO_8601 = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?)?$"


def _domain_name(text: str) -> None:
    """The byte length and the characters the query pattern cannot say (schema: 1-251 bytes)."""
    try:
        check_domain_name(text)
    except ValueError as exc:  # PydanticCustomError is a ValueError
        raise ApiError(422, "validation", f"field query.guest: {exc}",
                       [{"field": "query.guest", "reason": str(exc)}]) from None


def _moment(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ApiError(422, "validation", f"field query.since: {exc}",
                       [{"field": "query.since", "reason": str(exc)}]) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


@router.get("", response_model=AuditList, summary="audit log entries, newest first",
            responses=COMMON_RESPONSES)
def list_audit(request: Request,
               limit: int = Query(default=100, ge=1, le=1000),
               since: str | None = Query(default=None, pattern=ISO_8601, max_length=40,
                                         description="ISO 8601 date or date-time; without an offset: UTC"),
               host: str | None = Query(default=None, pattern=HOST_NAME, max_length=63),
               guest: str | None = Query(default=None, min_length=1, max_length=DOMAIN_NAME_MAX_BYTES,
                                         pattern=DOMAIN_NAME_PATTERN,
                                         description="a libvirt domain name (any domain, not only placed ones)"),
               action: str | None = Query(default=None, pattern=r"^[a-z-]{1,64}$"),
               before_id: int | None = Query(default=None, ge=1, le=2**31 - 1,
                                             description="page: entries older than this id")) -> dict[str, Any]:
    moment = _moment(since) if since is not None else None
    if guest is not None:
        _domain_name(guest)
    entries = request.app.state.services.container.audit_entries(limit=limit, since=moment, host=host,
                                                                 guest=guest, action=action, before_id=before_id)
    return {"entries": entries}
