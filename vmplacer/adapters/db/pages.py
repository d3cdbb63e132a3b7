"""The API's lists, one page at a time: filters, order and position all in SQL.

Each list has one stable order, newest first by a unique key (a placement's, plan's or
audit entry's id; a job's creation time, then its id), and a page starts strictly after
the key of the previous page's last row (keyset paging: a row written meanwhile neither
shifts a page nor repeats one). Every query reads one row more than asked: whether a
further page exists is known without counting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from vmplacer.adapters.db.api import _aware, _epoch, _record
from vmplacer.adapters.db.models import AuditRow, HostRow, JobRow, PlacementRow, PlanActionRow, PlanRow
from vmplacer.ports import JobRecord

T = TypeVar("T")
K = TypeVar("K")


def _cut(rows: list[tuple[K, T]], limit: int) -> tuple[list[T], K | None]:
    """The page's rows, and the key of its last one when another page follows (else None)."""
    return [row for _key, row in rows[:limit]], rows[limit - 1][0] if len(rows) > limit else None


class SqlPages:
    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions

    def placements(self, *, limit: int, before_id: int | None = None, host: str | None = None,
                   states: Sequence[str] | None = None, labels: Mapping[str, str] | None = None,
                   ) -> tuple[list[dict[str, Any]], int | None]:
        """Recorded placements newest first, and the id to page on from; `labels` all must match
        (label values are stored as text)."""
        query: Select[Any] = (select(PlacementRow, HostRow.name).join(HostRow)
                              .order_by(PlacementRow.id.desc()).limit(limit + 1))
        if before_id is not None:
            query = query.where(PlacementRow.id < before_id)
        if host is not None:
            query = query.where(HostRow.name == host)
        if states:
            query = query.where(PlacementRow.state.in_(list(states)))
        for key, value in (labels or {}).items():
            query = query.where(PlacementRow.spec["labels"][key].as_string() == value)
        with self.sessions() as session:
            rows = [(row.id, {"guest": row.guest, "host": name, "state": row.state, "domain_uuid": row.domain_uuid,
                              "spec": row.spec, "placement": row.placement,
                              "claims": sorted(c.cpu for c in row.claims)})
                    for row, name in session.execute(query)]
        return _cut(rows, limit)

    def jobs(self, *, limit: int, after: tuple[datetime, str] | None = None,
             statuses: Sequence[str] | None = None, kind: str | None = None,
             ) -> tuple[list[JobRecord], tuple[datetime, str] | None]:
        """Jobs newest first (creation time, then id, both descending); `after`: the (created_at,
        id) of the previous page's last job."""
        query = select(JobRow).order_by(JobRow.created_at.desc(), JobRow.id.desc()).limit(limit + 1)
        if after is not None:
            at, job_id = after
            query = query.where(or_(JobRow.created_at < at, and_(JobRow.created_at == at, JobRow.id < job_id)))
        if statuses:
            query = query.where(JobRow.status.in_(list(statuses)))
        if kind is not None:
            query = query.where(JobRow.kind == kind)
        with self.sessions() as session:
            rows = [((_aware(row.created_at), row.id), _record(row)) for row in session.scalars(query)]
        return _cut(rows, limit)

    def plans(self, *, limit: int, before_id: int | None = None,
              states: Sequence[str] | None = None) -> tuple[list[dict[str, Any]], int | None]:
        """Plan summaries newest first (their actions counted by the database)."""
        actions = (select(func.count()).where(PlanActionRow.plan_id == PlanRow.id)
                   .correlate(PlanRow).scalar_subquery())
        query = select(PlanRow, actions).order_by(PlanRow.id.desc()).limit(limit + 1)
        if before_id is not None:
            query = query.where(PlanRow.id < before_id)
        if states is not None:
            query = query.where(PlanRow.state.in_(list(states)))
        with self.sessions() as session:
            rows = [(r.id, {"id": r.id, "state": r.state, "hosts": r.hosts, "summary": r.summary,
                             "created_at": _epoch(r.created_at), "actions": int(n)})
                    for r, n in session.execute(query)]
        return _cut(rows, limit)

    def audit(self, *, limit: int, before_id: int | None = None, since: datetime | None = None,
              until: datetime | None = None, host: str | None = None, guest: str | None = None,
              action: str | None = None) -> tuple[list[dict[str, Any]], int | None]:
        """Audit entries newest first by id; `since` and `until` bound their times (inclusive)."""
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit + 1)
        if before_id is not None:
            query = query.where(AuditRow.id < before_id)
        if since is not None:
            query = query.where(AuditRow.at >= since)
        if until is not None:
            query = query.where(AuditRow.at <= until)
        if host is not None:
            query = query.where(AuditRow.host == host)
        if guest is not None:
            query = query.where(AuditRow.guest == guest)
        if action is not None:
            query = query.where(AuditRow.action == action)
        with self.sessions() as session:
            rows = [(row.id, {"id": row.id, "at": _epoch(row.at), "actor": row.actor, "action": row.action,
                              "host": row.host, "guest": row.guest, "outcome": row.outcome, "message": row.message,
                              "detail": row.detail or {}})
                    for row in session.scalars(query)]
        return _cut(rows, limit)
