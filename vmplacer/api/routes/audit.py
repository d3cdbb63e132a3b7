"""The audit log: every action vmplacer took on a host, its reason and outcome.

`since` and `until` bound the entries' times (both inclusive); entries come newest first,
`before_id` pages further back.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Query, Request

from vmplacer.api.errors import COMMON_RESPONSES, ApiError
from vmplacer.api.fields import DOMAIN_NAME_MAX_BYTES, DOMAIN_NAME_PATTERN, check_domain_name
from vmplacer.api.schemas import HOST_NAME, AuditList
from vmplacer.api.strict_json import StrictJsonRoute
from vmplacer.api.times import with_api_times

router = APIRouter(prefix="/v1/audit", tags=["audit"], route_class=StrictJsonRoute)
ISO_8601 = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?)?$"
MOMENT_HELP = "ISO 8601 date or date-time; without an offset: UTC"
# Rows read per look when `until` skips newer entries (the store filters on `since` only).
UNTIL_PAGE = 1000


def _domain_name(text: str) -> None:
    """The byte length and the characters the query pattern cannot say (schema: 1-251 bytes)."""
    try:
        check_domain_name(text)
    except ValueError as exc:  # PydanticCustomError is a ValueError
        raise ApiError(422, "validation", f"field query.guest: {exc}",
                       [{"field": "query.guest", "rule": "domain_name", "reason": str(exc)}]) from None


def _moment(text: str, name: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ApiError(422, "validation", f"field query.{name}: {exc}",
                       [{"field": f"query.{name}", "rule": "datetime_parsing", "reason": str(exc)}]) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


@router.get("", operation_id="listAuditEntries", response_model=AuditList, summary="audit log entries, newest first",
            responses=COMMON_RESPONSES)
def list_audit(request: Request,
               limit: int = Query(default=100, ge=1, le=1000),
               since: str | None = Query(default=None, pattern=ISO_8601, max_length=40,
                                         description=f"entries at or after this moment: {MOMENT_HELP}"),
               until: str | None = Query(default=None, pattern=ISO_8601, max_length=40,
                                         description=f"entries at or before this moment: {MOMENT_HELP}"),
               host: str | None = Query(default=None, pattern=HOST_NAME, max_length=63),
               guest: str | None = Query(default=None, min_length=1, max_length=DOMAIN_NAME_MAX_BYTES,
                                         pattern=DOMAIN_NAME_PATTERN,
                                         description="a libvirt domain name (any domain, not only placed ones)"),
               action: str | None = Query(default=None, pattern=r"^[a-z-]{1,64}$"),
               before_id: int | None = Query(default=None, ge=1, le=2**31 - 1,
                                             description="page: entries older than this id")) -> dict[str, Any]:
    if guest is not None:
        _domain_name(guest)
    container = request.app.state.services.container
    query = {"since": _moment(since, "since") if since is not None else None, "host": host, "guest": guest,
             "action": action}
    if until is None:
        entries = container.audit_entries(limit=limit, before_id=before_id, **query)
    else:
        entries = _until(container, _moment(until, "until"), limit, before_id, query)
    return {"entries": [with_api_times(entry, "at") for entry in entries]}


def _until(container: Any, until: datetime, limit: int, before_id: int | None,
           query: dict[str, Any]) -> list[dict[str, Any]]:
    """The newest `limit` entries at or before `until`, paging back past newer ones (entries
    are read newest first by id, and an id does not promise an order of times across instances)."""
    bound = until.timestamp()
    found: list[dict[str, Any]] = []
    cursor = before_id
    while len(found) < limit:
        page = container.audit_entries(limit=UNTIL_PAGE, before_id=cursor, **query)
        found += [entry for entry in page if entry["at"] is not None and entry["at"] <= bound]
        if len(page) < UNTIL_PAGE:
            break
        cursor = page[-1]["id"]
    return found[:limit]
