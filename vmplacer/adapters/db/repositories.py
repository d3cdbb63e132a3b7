"""Small repositories over the session: the only code that writes rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from vmplacer.adapters.db.models import AuditRow, HostRow, utcnow


def ensure_host(session: Session, name: str, uri: str) -> HostRow:
    """The row for a configured host, created on first sight, URI kept current."""
    row = session.scalar(select(HostRow).where(HostRow.name == name))
    if row is None:
        row = HostRow(name=name, uri=uri)
        session.add(row)
        session.flush()
    elif row.uri != uri:
        row.uri = uri
    return row


def mark_host_seen(session: Session, name: str, uri: str, topology: dict[str, Any] | None = None) -> None:
    row = ensure_host(session, name, uri)
    row.last_seen_at = utcnow()
    if topology is not None:
        row.topology = topology


def record_audit(
    session: Session,
    *,
    actor: str,
    action: str,
    outcome: str,
    host: str | None = None,
    guest: str | None = None,
    message: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditRow:
    row = AuditRow(
        actor=actor,
        action=action,
        outcome=outcome,
        host=host,
        guest=guest,
        message=message,
        detail=detail or {},
    )
    session.add(row)
    return row


def list_audit(session: Session, limit: int = 100, since: datetime | None = None) -> list[AuditRow]:
    query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
    if since is not None:
        query = query.where(AuditRow.at >= since)
    return list(session.scalars(query))
