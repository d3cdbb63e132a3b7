"""Freeze journal and profile storage in the database (the FreezeJournal and ProfileStore ports).

Every journal call is its own committed transaction: `open` must be durable
before the caller suspends anything, whatever happens to the process next.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from vmplacer.adapters.db.models import FreezeJournalRow, ProfileRunRow, ProfileSampleRow, utcnow
from vmplacer.core.rebalance.frozen_share import FROZEN_KINDS, UNSAMPLED_KIND, FreezeRecord, records_from_samples
from vmplacer.ports import FreezeEntry, ProfileSample


def _epoch(moment: datetime) -> float:
    """SQLite hands back naive datetimes; everything is stored in UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _from_epoch(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


class SqlFreezeJournal:
    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions

    def open(self, host: str, domains: list[tuple[str, str]], max_freeze_s: float,
             owner: dict[str, object]) -> int:
        now = utcnow()
        row = FreezeJournalRow(
            host=host,
            domains=[{"name": name, "uuid": uuid} for name, uuid in domains],
            owner=dict(owner),
            created_at=now,
            deadline_at=now + timedelta(seconds=max_freeze_s),
        )
        with self.sessions.begin() as session:
            session.add(row)
            session.flush()
            return row.id

    def close(self, entry_id: int) -> None:
        """Delete the row; a row already gone (a replay closed it) is fine."""
        with self.sessions.begin() as session:
            session.execute(delete(FreezeJournalRow).where(FreezeJournalRow.id == entry_id))

    def pending(self, host: str | None = None) -> list[FreezeEntry]:
        query = select(FreezeJournalRow).order_by(FreezeJournalRow.id)
        if host is not None:
            query = query.where(FreezeJournalRow.host == host)
        with self.sessions() as session:
            rows = list(session.scalars(query))
        return [
            FreezeEntry(
                id=row.id,
                host=row.host,
                domains=tuple((str(d["name"]), str(d.get("uuid", ""))) for d in row.domains),
                owner=dict(row.owner),
                created_at=_epoch(row.created_at),
                deadline_at=_epoch(row.deadline_at),
            )
            for row in rows
        ]


class SqlProfileStore:
    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions

    def start_run(self, host: str, metric: str, parameters: dict[str, object]) -> int:
        with self.sessions.begin() as session:
            row = ProfileRunRow(host=host, metric=metric, status="running", parameters=dict(parameters))
            session.add(row)
            session.flush()
            return row.id

    def add_samples(self, run_id: int, samples: list[ProfileSample]) -> None:
        if not samples:
            return
        with self.sessions.begin() as session:
            session.add_all(
                ProfileSampleRow(
                    run_id=run_id,
                    guest=s.guest,
                    kind=s.kind,
                    metric=s.metric,
                    value=s.value,
                    window_s=s.window_s,
                    t_m_ms=s.t_m_ms,
                    freeze_ms=s.freeze_ms,
                    neighbours=[{"name": n.name, "distance": n.distance, "frozen": n.frozen}
                                for n in s.neighbours],
                    at=_from_epoch(s.at),
                )
                for s in samples
            )

    def finish_run(self, run_id: int, results: dict[str, object], status: str = "finished") -> None:
        with self.sessions.begin() as session:
            row = session.get(ProfileRunRow, run_id)
            if row is None:
                raise LookupError(f"profile run {run_id} does not exist")
            row.results = results
            row.status = status
            row.finished_at = utcnow()

    # ----- reading (CLI, API, interference model) ---------------------------------------
    def freezes_since(self, host: str, since: float, exclude_run: int | None = None) -> list[FreezeRecord]:
        """The freezes on `host` that ended at or after `since` (epoch s), from the ζb and pair
        samples of its runs (core/rebalance/frozen_share.py); `exclude_run`: a run that counts
        its own. Runs are found through the host index and kept when still running or finished
        since then; their samples through the run index."""
        moment = _from_epoch(since)
        runs = select(ProfileRunRow.id).where(
            ProfileRunRow.host == host,
            (ProfileRunRow.finished_at.is_(None)) | (ProfileRunRow.finished_at >= moment))
        if exclude_run is not None:
            runs = runs.where(ProfileRunRow.id != exclude_run)
        query = (select(ProfileSampleRow)
                 .where(ProfileSampleRow.run_id.in_(runs), ProfileSampleRow.kind.in_(FROZEN_KINDS),
                        ProfileSampleRow.at >= moment)
                 .order_by(ProfileSampleRow.id))
        with self.sessions() as session:
            rows = [{"run_id": row.run_id, "kind": row.kind, "at": _epoch(row.at), "freeze_ms": row.freeze_ms,
                     "t_m_ms": row.t_m_ms, "neighbours": row.neighbours}
                    for row in session.scalars(query)]
        return records_from_samples(rows)

    def latest_run_with(self, guests: Sequence[str], host: str | None = None) -> ProfileRunRow | None:
        """The newest run holding samples of every guest in `guests`."""
        query = (
            select(ProfileRunRow)
            .join(ProfileSampleRow, ProfileSampleRow.run_id == ProfileRunRow.id)
            .where(ProfileSampleRow.guest.in_(list(guests)), ProfileSampleRow.kind != UNSAMPLED_KIND)
            .group_by(ProfileRunRow.id)
            .having(func.count(func.distinct(ProfileSampleRow.guest)) == len(set(guests)))
            .order_by(ProfileRunRow.id.desc())
            .limit(1)
        )
        if host is not None:
            query = query.where(ProfileRunRow.host == host)
        with self.sessions() as session:
            return session.scalar(query)

    def run(self, run_id: int) -> ProfileRunRow | None:
        with self.sessions() as session:
            return session.get(ProfileRunRow, run_id)

    def finished_run_ids(self) -> list[int]:
        """Ids of the runs that finished (what model learning may read), ascending."""
        with self.sessions() as session:
            return sorted(session.scalars(select(ProfileRunRow.id).where(ProfileRunRow.status == "finished")))

    def latest_results(self) -> list[tuple[str, dict[str, Any]]]:
        """(host, results) of each host's newest finished run that has results."""
        with self.sessions() as session:
            newest = (select(ProfileRunRow.host, func.max(ProfileRunRow.id).label("id"))
                      .where(ProfileRunRow.status == "finished", ProfileRunRow.results.is_not(None))
                      .group_by(ProfileRunRow.host).subquery())
            rows = session.execute(select(ProfileRunRow.host, ProfileRunRow.results)
                                   .join(newest, ProfileRunRow.id == newest.c.id))
            return [(host, results or {}) for host, results in rows]

    def guest_history(self, guest: str, limit: int = 20) -> list[dict[str, Any]]:
        """The guest's ζ/ζb summaries from its newest finished runs, newest first: run id, host,
        when it finished, and the run's summary of that guest (its `vms` entry; None when the
        run sampled the guest but reported nothing on it). Runs are found through the
        (guest, run_id) index, so a long history costs `limit` rows, not a scan."""
        runs = (select(ProfileSampleRow.run_id)
                .where(ProfileSampleRow.guest == guest, ProfileSampleRow.kind != UNSAMPLED_KIND)
                .group_by(ProfileSampleRow.run_id))
        query = (select(ProfileRunRow)
                 .where(ProfileRunRow.id.in_(runs), ProfileRunRow.status == "finished",
                        ProfileRunRow.results.is_not(None))
                 .order_by(ProfileRunRow.id.desc()).limit(limit))
        with self.sessions() as session:
            return [{"run_id": row.id, "host": row.host, "metric": row.metric,
                     "finished_at": _epoch(row.finished_at) if row.finished_at else None,
                     "summary": ((row.results or {}).get("vms") or {}).get(guest)}
                    for row in session.scalars(query)]

    def samples(self, run_id: int, guest: str | None = None) -> list[dict[str, Any]]:
        # a freeze stored without its sample is the frozen-share history's, not a measurement
        query = (select(ProfileSampleRow)
                 .where(ProfileSampleRow.run_id == run_id, ProfileSampleRow.kind != UNSAMPLED_KIND)
                 .order_by(ProfileSampleRow.id))
        if guest is not None:
            query = query.where(ProfileSampleRow.guest == guest)
        with self.sessions() as session:
            return [
                {
                    "guest": row.guest,
                    "kind": row.kind,
                    "metric": row.metric,
                    "value": row.value,
                    "window_s": row.window_s,
                    "t_m_ms": row.t_m_ms,
                    "freeze_ms": row.freeze_ms,
                    "neighbours": row.neighbours,
                    "at": _epoch(row.at),
                }
                for row in session.scalars(query)
            ]
