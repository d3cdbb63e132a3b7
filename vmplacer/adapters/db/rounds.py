"""Rebalance rounds shared by several instances (the `RoundStore` port).

A round is keyed by the selection of hosts (and whether it is a dry run). An
instance joins the open round of its selection or opens one; the unique
`open_key` makes one of several instances opening at once win, the others join
it. Then each instance claims batches of the round's hosts: a host is claimable
while it is not done in this round and its lease (`host_leases`) is free,
expired or already ours. Claiming takes the lease in the same transaction that
checks the host is still pending, so a host is never claimed after another
instance marked it done:

- PostgreSQL: the lease rows are locked with SELECT … FOR UPDATE SKIP LOCKED
  (instances claiming at once each get other rows, nobody queues), then the
  pending check runs again after the lock (it sees every commit made before it).
- SQLite: one conditional UPDATE per host, whose WHERE checks the lease and the
  pending row together; SQLite runs one writer at a time, so it is atomic.

An instance that dies keeps its batch's leases until they expire (one TTL);
the hosts stay pending, so another instance claims them then.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import exists, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from vmplacer.adapters.db.models import HostLeaseRow, RebalanceRoundHostRow, RebalanceRoundRow, utcnow
from vmplacer.adapters.db.plans import SqlLeaseStore
from vmplacer.ports import RoundProgress, RoundTicket


class SqlRoundStore:
    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions
        self.leases = SqlLeaseStore(sessions)

    def _dialect(self) -> str:
        bind = self.sessions.kw.get("bind")
        return bind.dialect.name if bind is not None else "sqlite"

    # ----- join ----------------------------------------------------------------------------------
    def join(self, key: str, hosts: Sequence[str], holder: str, *, dry_run: bool,
             rest_s: float = 0.0) -> RoundTicket:
        """The open round of `key` (joined), or a new one; or, when the last round of `key`
        finished less than `rest_s` ago, that round (`finished`: nothing left to do)."""
        hosts = sorted(set(hosts))
        self.leases._ensure_rows(hosts)  # claims lock these rows: they must exist first
        for _ in range(5):  # a round may open or finish between our read and our write
            with self.sessions() as session:
                open_round = session.scalars(select(RebalanceRoundRow)
                                             .where(RebalanceRoundRow.open_key == key)).first()
                if open_round is not None:
                    return RoundTicket(open_round.id, key, opened=False, finished=False)
                if rest_s > 0:
                    last = session.scalars(select(RebalanceRoundRow)
                                           .where(RebalanceRoundRow.key == key,
                                                  RebalanceRoundRow.finished_at.is_not(None))
                                           .order_by(RebalanceRoundRow.finished_at.desc()).limit(1)).first()
                    if last is not None and last.finished_at is not None and \
                            _aware(last.finished_at) > utcnow() - timedelta(seconds=rest_s):
                        return RoundTicket(last.id, key, opened=False, finished=True)
            try:
                with self.sessions.begin() as session:
                    row = RebalanceRoundRow(key=key, open_key=key, dry_run=dry_run, opened_by=holder,
                                            opened_at=utcnow())
                    session.add(row)
                    session.flush()
                    session.add_all(RebalanceRoundHostRow(round_id=row.id, host=h) for h in hosts)
                    return RoundTicket(row.id, key, opened=True, finished=False)
            except IntegrityError:
                continue  # another instance opened it first: join that one
        raise RuntimeError(f"could not join or open a rebalance round for key {key}")

    # ----- claim ---------------------------------------------------------------------------------
    def claim(self, round_id: int, holder: str, limit: int, ttl_s: float) -> list[str]:
        """Up to `limit` pending hosts of the round whose lease was free, expired or ours,
        now leased to `holder` for `ttl_s`; [] when none is claimable right now."""
        now = utcnow()
        expires = now + timedelta(seconds=ttl_s)
        if self._dialect() == "postgresql":
            return self._claim_skip_locked(round_id, holder, limit, now, expires)
        return self._claim_conditional(round_id, holder, limit, now, expires)

    def _pending(self, round_id: int, host_column: Any) -> Any:
        return exists().where(RebalanceRoundHostRow.round_id == round_id, RebalanceRoundHostRow.host == host_column,
                              RebalanceRoundHostRow.done_at.is_(None))

    @staticmethod
    def _claimable(holder: str, now: datetime) -> Any:
        return or_(HostLeaseRow.holder.is_(None), HostLeaseRow.holder == holder, HostLeaseRow.expires_at.is_(None),
                   HostLeaseRow.expires_at < now)

    def _claim_skip_locked(self, round_id: int, holder: str, limit: int, now: datetime,
                           expires: datetime) -> list[str]:
        with self.sessions() as session:
            rows = list(session.scalars(
                select(HostLeaseRow)
                .where(self._pending(round_id, HostLeaseRow.host), self._claimable(holder, now))
                .order_by(HostLeaseRow.host).limit(limit).with_for_update(skip_locked=True)))
            if not rows:
                session.rollback()
                return []
            # The rows are ours now; a host marked done by its previous holder just before
            # it released the lease is seen done by this newer statement.
            still = set(session.scalars(select(RebalanceRoundHostRow.host).where(
                RebalanceRoundHostRow.round_id == round_id, RebalanceRoundHostRow.done_at.is_(None),
                RebalanceRoundHostRow.host.in_([r.host for r in rows]))))
            taken = []
            for row in rows:
                if row.host not in still or not _free(row, holder, now):
                    continue
                if row.holder != holder:
                    row.acquired_at = now
                row.holder = holder
                row.expires_at = expires
                taken.append(row.host)
            self._claimed(session, round_id, taken, holder)
            session.commit()
            return taken

    @staticmethod
    def _claimed(session: Session, round_id: int, hosts: list[str], holder: str) -> None:
        if hosts:
            session.execute(update(RebalanceRoundHostRow)
                            .where(RebalanceRoundHostRow.round_id == round_id, RebalanceRoundHostRow.host.in_(hosts))
                            .values(claimed_by=holder))

    def _claim_conditional(self, round_id: int, holder: str, limit: int, now: datetime,
                           expires: datetime) -> list[str]:
        with self.sessions() as session:
            candidates = list(session.scalars(
                select(HostLeaseRow.host)
                .where(self._pending(round_id, HostLeaseRow.host), self._claimable(holder, now))
                .order_by(HostLeaseRow.host)))
            session.rollback()
        taken: list[str] = []
        for host in candidates:
            if len(taken) >= limit:
                break
            with self.sessions.begin() as session:  # one statement: lease and pending checked together
                result = session.execute(
                    update(HostLeaseRow)
                    .where(HostLeaseRow.host == host, self._claimable(holder, now),
                           self._pending(round_id, HostLeaseRow.host))
                    .values(holder=holder, acquired_at=now, expires_at=expires))
                if result.rowcount == 1:
                    taken.append(host)
                    self._claimed(session, round_id, [host], holder)
        return taken

    # ----- done ----------------------------------------------------------------------------------
    def mark_done(self, round_id: int, hosts: Sequence[str], holder: str, plan_id: int | None,
                  outcome: str) -> list[str]:
        """Mark the hosts done by `holder` (only those still pending and still leased by it:
        a host whose lease lapsed and was taken over is the taker's); the hosts marked. The
        round finishes when its last host is done."""
        now = utcnow()
        with self.sessions.begin() as session:
            leased = exists().where(HostLeaseRow.host == RebalanceRoundHostRow.host, HostLeaseRow.holder == holder)
            marked = list(session.scalars(
                update(RebalanceRoundHostRow)
                .where(RebalanceRoundHostRow.round_id == round_id, RebalanceRoundHostRow.host.in_(list(hosts)),
                       RebalanceRoundHostRow.done_at.is_(None), leased)
                .values(done_by=holder, done_at=now, plan_id=plan_id, outcome=outcome[:32])
                .returning(RebalanceRoundHostRow.host)))
            pending = session.scalar(select(func.count()).select_from(RebalanceRoundHostRow).where(
                RebalanceRoundHostRow.round_id == round_id, RebalanceRoundHostRow.done_at.is_(None)))
            if not pending:
                session.execute(update(RebalanceRoundRow)
                                .where(RebalanceRoundRow.id == round_id, RebalanceRoundRow.finished_at.is_(None))
                                .values(open_key=None, finished_at=now))
            return sorted(marked)

    # ----- reading -------------------------------------------------------------------------------
    def progress(self, round_id: int, holder: str) -> RoundProgress:
        """Pending hosts; of those, the ones another holder leases live (what we wait for), and
        of these the ones leased outside the round (not by the instance that claimed them)."""
        now = utcnow()
        with self.sessions() as session:
            rows = session.execute(
                select(RebalanceRoundHostRow.host, RebalanceRoundHostRow.claimed_by, HostLeaseRow.holder,
                       HostLeaseRow.expires_at)
                .join(HostLeaseRow, HostLeaseRow.host == RebalanceRoundHostRow.host, isouter=True)
                .where(RebalanceRoundHostRow.round_id == round_id, RebalanceRoundHostRow.done_at.is_(None))
                .order_by(RebalanceRoundHostRow.host)).all()
        pending = tuple(row[0] for row in rows)
        live = [(host, claimed_by, lease_holder) for host, claimed_by, lease_holder, expires_at in rows
                if lease_holder not in (None, holder) and expires_at is not None and _aware(expires_at) > now]
        busy = {host: lease_holder for host, _, lease_holder in live}
        foreign = tuple(host for host, claimed_by, lease_holder in live if lease_holder != claimed_by)
        return RoundProgress(pending, busy, foreign)

    def hosts(self, round_id: int) -> list[dict[str, Any]]:
        """Every host of the round: who did it, when, with which plan."""
        with self.sessions() as session:
            return [{"host": r.host, "claimed_by": r.claimed_by, "done_by": r.done_by, "plan_id": r.plan_id, "outcome": r.outcome,
                     "done": r.done_at is not None}
                    for r in session.scalars(select(RebalanceRoundHostRow)
                                             .where(RebalanceRoundHostRow.round_id == round_id)
                                             .order_by(RebalanceRoundHostRow.host))]


def _free(row: HostLeaseRow, holder: str, now: datetime) -> bool:
    return row.holder in (None, holder) or row.expires_at is None or _aware(row.expires_at) <= now


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)

