"""The audit log: every action vmplacer took on a host, its reason and outcome.

`since` and `until` bound the entries' times (both inclusive), in SQL like every filter;
entries come newest first by id, `cursor` (or the older `before_id`) pages further back.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Query, Request, Response

from vmplacer.api.deps import Services
from vmplacer.api.errors import COMMON_RESPONSES, ApiError
from vmplacer.api.paging import CursorQuery, decode, int_key, paged
from vmplacer.api.fields import DOMAIN_NAME_MAX_BYTES, DOMAIN_NAME_PATTERN, check_domain_name
from vmplacer.api.schemas import HOST_NAME, AuditList
from vmplacer.api.strict_json import StrictJsonRoute
from vmplacer.api.times import with_api_times

router = APIRouter(prefix="/v1/audit", tags=["audit"], route_class=StrictJsonRoute)
# A calendar date of the years 1000-8999 (so that no offset moves it out of Python's range),
# then optionally a time of day and an offset below a day: exactly what the route accepts.
_YEAR = "[1-8][0-9]{3}"
_LEAP_YEAR = "(?:[1-8][0-9](?:0[48]|[2468][048]|[13579][26])|(?:[2468][048]|[1357][26])00)"
_MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
              "|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_TIME = "[T ](?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9](?:\\.[0-9]{1,6})?)?(?:Z|[+-](?:[01][0-9]|2[0-3]):?[0-5][0-9])?"
ISO_8601 = f"^(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)(?:{_TIME})?$"
MOMENT_HELP = "ISO 8601 date or date-time; without an offset: UTC"


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
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
    return aware.astimezone(timezone.utc)  # compared in the database as UTC


@router.get("", operation_id="listAuditEntries", response_model=AuditList,
            summary="audit log entries, newest first (by id); a page at a time (`next`)", responses=COMMON_RESPONSES)
def list_audit(request: Request, services: Services, response: Response,
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
               cursor: str | None = CursorQuery,
               before_id: int | None = Query(default=None, ge=1, le=2**31 - 1,
                                             description="entries older than this id (the older way to page; "
                                                         "not with `cursor`)")) -> dict[str, Any]:
    if guest is not None:
        _domain_name(guest)
    if cursor is not None and before_id is not None:
        reason = "cursor and before_id both say where the page starts: send one"
        raise ApiError(422, "validation", f"field query.before_id: {reason}",
                       [{"field": "query.before_id", "rule": "one_of", "reason": reason}])
    moments = {"since": _moment(since, "since") if since is not None else None,
               "until": _moment(until, "until") if until is not None else None}
    filters = {"host": host, "guest": guest, "action": action,
               **{name: None if moment is None else moment.isoformat() for name, moment in moments.items()}}
    before = decode(cursor, "audit", filters, int_key) if cursor is not None else before_id
    entries, last = services.container.pages.audit(
        limit=limit, before_id=before, host=host, guest=guest, action=action, **moments)
    return {"entries": [with_api_times(entry, "at") for entry in entries],
            **paged(request, response, "audit", filters, None if last is None else [last])}
