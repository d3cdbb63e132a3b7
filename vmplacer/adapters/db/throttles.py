"""The throttle ledger in the database: which guests vmplacer throttled, to what, and for whom."""

from __future__ import annotations

from datetime import timezone

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from vmplacer.adapters.db.models import ThrottleRow, utcnow
from vmplacer.core.placement.bandwidth import CpuBandwidth
from vmplacer.ports import ThrottleLedger, ThrottleRecord


class SqlThrottleLedger(ThrottleLedger):
    def __init__(self, sessions: sessionmaker[Session]):
        self._sessions = sessions

    def current(self, host: str | None = None) -> list[ThrottleRecord]:
        query = select(ThrottleRow).order_by(ThrottleRow.id)
        if host is not None:
            query = query.where(ThrottleRow.host == host)
        now = utcnow()
        with self._sessions() as session:
            return [_record(row, now) for row in session.scalars(query)]

    def note(self, host: str, guest: str, bandwidth: CpuBandwidth, original: CpuBandwidth, *, protects: str,
             reason: str = "", plan_id: int | None = None) -> None:
        with self._sessions.begin() as session:
            row = session.scalar(select(ThrottleRow).where(ThrottleRow.host == host, ThrottleRow.guest == guest)
                                 .with_for_update())
            if not bandwidth.limited:
                if row is not None:
                    session.execute(delete(ThrottleRow).where(ThrottleRow.id == row.id))
                return
            if row is None:
                session.add(ThrottleRow(host=host, guest=guest, bandwidth=bandwidth.to_dict(),
                                        original=original.to_dict(), protects=protects, reason=reason,
                                        plan_id=plan_id))
                return
            row.bandwidth = bandwidth.to_dict()  # the first original stays: a release returns to it
            row.protects, row.reason, row.plan_id, row.updated_at = protects, reason, plan_id, utcnow()


    def moved(self, guest: str, source: str, target: str) -> None:
        with self._sessions.begin() as session:
            session.execute(update(ThrottleRow).where(ThrottleRow.host == source, ThrottleRow.guest == guest)
                            .values(host=target, updated_at=utcnow()))


def _record(row: ThrottleRow, now) -> ThrottleRecord:  # type: ignore[no-untyped-def]
    changed = row.updated_at if row.updated_at.tzinfo else row.updated_at.replace(tzinfo=timezone.utc)
    return ThrottleRecord(host=row.host, guest=row.guest, bandwidth=CpuBandwidth.from_dict(row.bandwidth),
                          original=CpuBandwidth.from_dict(row.original), protects=row.protects,
                          reason=row.reason, plan_id=row.plan_id,
                          age_s=max(0.0, (now - changed).total_seconds()))
