"""Hosts in maintenance: stored on the hosts row, shared by every instance on the database.

A host in maintenance takes no new guest (the API does not pick it, and refuses
it by name) and no migration (the rebalancer never moves a guest onto it); a
drain moves its guests away. Entering and leaving are audited.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from vmplacer.adapters.db.models import HostRow, utcnow
from vmplacer.adapters.db.repositories import ensure_host, record_audit


@dataclass(frozen=True)
class Maintenance:
    host: str
    since: datetime
    by: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"since": self.since.isoformat(), "by": self.by, "reason": self.reason}

    def describe(self) -> str:
        return f"host {self.host} is in maintenance since {self.since:%Y-%m-%d %H:%M} UTC ({self.by}: {self.reason})"


def _record(row: HostRow) -> Maintenance | None:
    if row.maintenance_since is None:
        return None
    since = row.maintenance_since
    if since.tzinfo is None:  # SQLite hands back naive UTC
        since = since.replace(tzinfo=timezone.utc)
    return Maintenance(row.name, since, row.maintenance_by or "", row.maintenance_reason or "")


class SqlMaintenanceStore:
    def __init__(self, sessions: sessionmaker[Session]):
        self._sessions = sessions

    def current(self) -> dict[str, Maintenance]:
        """Every host in maintenance, by name."""
        with self._sessions() as session:
            rows = session.scalars(select(HostRow).where(HostRow.maintenance_since.is_not(None)))
            return {row.name: record for row in rows if (record := _record(row)) is not None}

    def get(self, host: str) -> Maintenance | None:
        return self.current().get(host)

    def start(self, host: str, uri: str, *, by: str, reason: str,
              detail: dict[str, Any] | None = None) -> tuple[Maintenance, bool]:
        """Put `host` in maintenance; (the record, whether it changed). Already in maintenance:
        the first record stays (its time and reason are what the operators need to see)."""
        with self._sessions.begin() as session:
            row = ensure_host(session, host, uri)
            existing = _record(row)
            if existing is not None:
                return existing, False
            row.maintenance_since = utcnow()
            row.maintenance_by = by
            row.maintenance_reason = reason
            session.flush()
            record_audit(session, actor=by[:64], action="maintenance-start", outcome="ok", host=host, message=reason,
                         detail=detail)
            record = _record(row)
            assert record is not None
            return record, True

    def end(self, host: str, *, by: str, detail: dict[str, Any] | None = None) -> Maintenance | None:
        """Take `host` out of maintenance; the record it had (None: it was in service)."""
        with self._sessions.begin() as session:
            row = session.scalar(select(HostRow).where(HostRow.name == host))
            existing = _record(row) if row is not None else None
            if row is None or existing is None:
                return None
            row.maintenance_since = None
            row.maintenance_by = None
            row.maintenance_reason = None
            record_audit(session, actor=by[:64], action="maintenance-end", outcome="ok", host=host,
                         message=f"in maintenance since {existing.since.isoformat()}: {existing.reason}",
                         detail=detail)
            return existing
