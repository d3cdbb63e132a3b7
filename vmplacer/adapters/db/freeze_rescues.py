"""Rescues of frozen guests (by the freeze guardian or a journal replay): audit and summary.

A rescue is a freeze that its own process did not end: the guardian resumed
its domains at the deadline or when the parent died, or a replay did later.
Each one is an audit entry (action `freeze-rescue`) whose detail names the
cause, the domains resumed and how long the pause went past its cap, so
`/metrics` and `vmplacer audit`-style readers see them whichever process
did the work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from vmplacer.adapters.db.models import AuditRow, FreezeJournalRow
from vmplacer.adapters.db.repositories import record_audit

RESCUE_ACTION = "freeze-rescue"


def write_rescues(sessions: sessionmaker[Session], rescues: Iterable[Mapping[str, Any]], *, actor: str) -> None:
    """Close each rescued row that has no errors left, and audit every rescue that did something."""
    with sessions.begin() as session:
        for rescue in rescues:
            errors = list(rescue.get("errors") or [])
            resumed = list(rescue.get("resumed") or [])
            if not errors:
                session.execute(delete(FreezeJournalRow).where(FreezeJournalRow.id == int(rescue["journal_id"])))
            if not resumed and not errors:
                continue  # the freezer had resumed everything itself: nothing to report
            overrun_ms = round(float(rescue.get("overrun_s") or 0.0) * 1e3, 1)
            record_audit(
                session, actor=actor, action=RESCUE_ACTION, outcome="failed" if errors else "ok",
                host=str(rescue["host"]),
                message=(f"resumed {', '.join(resumed) or 'nothing'} ({rescue['cause']}); "
                         f"{overrun_ms} ms past the freeze cap" + (f"; errors: {'; '.join(errors)}" if errors else "")),
                detail={"cause": str(rescue["cause"]), "journal_id": int(rescue["journal_id"]),
                        "resumed": resumed, "errors": errors, "overrun_ms": overrun_ms},
            )


def record_rescues(database_url: str, rescues: Iterable[Mapping[str, Any]], *, actor: str) -> None:
    """`write_rescues` for a process that has no engine of its own (the guardian)."""
    from vmplacer.adapters.db.engine import make_engine, make_session_factory

    engine = make_engine(database_url)
    try:
        write_rescues(make_session_factory(engine), rescues, actor=actor)
    finally:
        engine.dispose()


def rescue_summary(sessions: sessionmaker[Session]) -> tuple[dict[str, int], float]:
    """(domains resumed per cause, the longest pause past its cap in seconds) over the audit log."""
    resumed: dict[str, int] = {}
    worst_ms = 0.0
    with sessions() as session:
        for detail in session.scalars(select(AuditRow.detail).where(AuditRow.action == RESCUE_ACTION)):
            detail = detail or {}
            cause = str(detail.get("cause", "unknown"))
            resumed[cause] = resumed.get(cause, 0) + len(detail.get("resumed") or [])
            worst_ms = max(worst_ms, float(detail.get("overrun_ms") or 0.0))
    return resumed, worst_ms / 1e3
