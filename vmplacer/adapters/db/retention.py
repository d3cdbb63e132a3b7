"""Data retention: delete finished records past their age (`vmplacer db prune`).

Rebalancing and profiling timers add plans, profile samples, audit entries and jobs
without end; this keeps the tables bounded. Rules, per kind:

* plans: only plans in a final state (PLAN_FINAL_STATES), by `updated_at` (when the
  plan reached that state), with their actions. Proposed, approved and running plans
  are never touched.
* profiles: whole profile runs (with their samples), finished or failed, by when
  they finished. For every guest the newest run holding its samples is kept, and
  also its newest *finished* run (what learning reads): `vmplacer profile show` and a
  re-learned model always find a guest's latest data. Running runs are never touched.
  The interference model itself lives in `interference_models` and keeps what it has
  learned whatever is pruned.
* audit: entries by `at`.
* jobs: succeeded or failed jobs, by when they finished; queued and running jobs are
  never touched.
* rebalance rounds: finished rounds (with their hosts) by when they finished, at the plans'
  age; an open round is still shared by the instances working on it.
* idempotency keys: those past the store's own replay window (SqlIdempotencyStore.purge):
  that window is a promise to API clients, so it does not follow the ages here.
* web sessions: sign-ins to the web view that have ended, past their lifetime or idle too
  long (`web.session_lifetime_s`, `web.session_idle_s`; SqlWebSessionStore.prune). A live
  sign-in is never touched, whatever the ages; the view deletes an ended one it meets, this
  deletes those nobody comes back with.

Placements are never pruned: they are the live record (`vmplacer reconcile` releases
the ones whose domains are gone).

The newest row of plans, profile runs and audit entries is always kept: SQLite hands
a table's highest id out again once that row is gone, and a reused plan or run id
would inherit the old one's audit entries or be skipped by learning as already seen.

Rows go in batches, each its own short transaction, so PostgreSQL never holds locks
on a large table for long while the API and timers keep writing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import ColumnElement, Select, delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from vmplacer.adapters.db.api import SqlIdempotencyStore
from vmplacer.adapters.db.web_sessions import DEFAULT_IDLE_S, DEFAULT_LIFETIME_S, SqlWebSessionStore
from vmplacer.adapters.db.models import (
    AuditRow,
    IdempotencyKeyRow,
    JobRow,
    PlanActionRow,
    PlanRow,
    RebalanceRoundHostRow,
    RebalanceRoundRow,
    ProfileRunRow,
    ProfileSampleRow,
    utcnow,
)
from vmplacer.core.rebalance.plan import PLAN_FINAL_STATES

DEFAULT_BATCH = 1000
JOB_FINAL_STATES = ("succeeded", "failed")
PROFILE_RUN_FINAL_STATES = ("finished", "failed")
# What a prune reports, in this order; children are counted under their own names.
KINDS = ("plans", "plan_actions", "profile_runs", "profile_samples", "audit", "jobs", "idempotency_keys",
         "rebalance_rounds", "rebalance_round_hosts", "web_sessions")


@dataclass(frozen=True)
class RetentionAges:
    """Seconds each kind is kept after it finished."""

    plans_s: float
    profiles_s: float
    audit_s: float
    jobs_s: float

    def __post_init__(self) -> None:
        for name in ("plans_s", "profiles_s", "audit_s", "jobs_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"retention age {name.removesuffix('_s')} must be longer than 0, "
                                 f"got {getattr(self, name)!r}")


@dataclass
class PruneReport:
    dry_run: bool
    now: datetime
    ages: RetentionAges
    web_session_lifetime_s: float = DEFAULT_LIFETIME_S
    web_session_idle_s: float = DEFAULT_IDLE_S
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "now": self.now.isoformat(),
            "older_than_s": {"plans": self.ages.plans_s, "profiles": self.ages.profiles_s,
                             "audit": self.ages.audit_s, "jobs": self.ages.jobs_s},
            "web_sessions_end_s": {"lifetime": self.web_session_lifetime_s, "idle": self.web_session_idle_s},
            "counts": dict(self.counts),
        }


class Pruner:
    """Deletes (or, in a dry run, counts) what retention no longer keeps."""

    def __init__(self, sessions: sessionmaker[Session], *, batch_size: int = DEFAULT_BATCH,
                 idempotency: SqlIdempotencyStore | None = None, web_sessions: SqlWebSessionStore | None = None,
                 actor: str = "vmplacer"):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.sessions = sessions
        self.batch_size = batch_size
        self.idempotency = idempotency or SqlIdempotencyStore(sessions)
        # the configured lifetimes come with the store (Container.web_session_store)
        self.web_sessions = web_sessions or SqlWebSessionStore(sessions, lifetime_s=DEFAULT_LIFETIME_S,
                                                               idle_s=DEFAULT_IDLE_S)
        self.actor = actor

    def prune(self, ages: RetentionAges, *, now: datetime | None = None, dry_run: bool = False) -> PruneReport:
        """Delete (or count, with `dry_run`) what is older than `ages` at `now` (default: the
        clock). Idempotency keys expire by the store's own clock and window."""
        if now is not None and now.tzinfo is None:
            raise ValueError("now must carry a time zone (rows are stored in UTC)")
        moment = (now or utcnow()).astimezone(timezone.utc)
        report = PruneReport(dry_run=dry_run, now=moment, ages=ages,
                             web_session_lifetime_s=self.web_sessions.lifetime.total_seconds(),
                             web_session_idle_s=self.web_sessions.idle.total_seconds())
        counts = report.counts

        def cutoff(seconds: float) -> datetime:
            return moment - timedelta(seconds=seconds)

        with self.sessions() as session:  # decided once: what is newest now stays kept
            plans = _plans(session, cutoff(ages.plans_s))
            runs = _profile_runs(session, cutoff(ages.profiles_s))
            audit = _audit(session, cutoff(ages.audit_s))
        jobs = _jobs(cutoff(ages.jobs_s))
        counts["plans"], (counts["plan_actions"],) = self._batches(
            PlanRow.id, plans, dry_run, children=[PlanActionRow.plan_id])
        counts["profile_runs"], (counts["profile_samples"],) = self._batches(
            ProfileRunRow.id, runs, dry_run, children=[ProfileSampleRow.run_id])
        counts["audit"], _ = self._batches(AuditRow.id, audit, dry_run)
        counts["jobs"], _ = self._batches(JobRow.id, jobs, dry_run)
        counts["idempotency_keys"] = self._idempotency_keys(dry_run)
        with self.sessions() as session:
            rounds = _rounds(session, cutoff(ages.plans_s))
        counts["rebalance_rounds"], (counts["rebalance_round_hosts"],) = self._batches(
            RebalanceRoundRow.id, rounds, dry_run, children=[RebalanceRoundHostRow.round_id])
        counts["web_sessions"] = self.web_sessions.prune(now=moment, dry_run=dry_run)
        if not dry_run and any(counts.values()):
            self._audit_prune(report)
        return report

    def _batches(self, key: Any, where: list[ColumnElement[bool]], dry_run: bool,
                 children: Sequence[Any] = ()) -> tuple[int, list[int]]:
        """Walk the matching rows in key order, `batch_size` at a time, one transaction per
        batch. Children (rows whose foreign key `children[i]` points at them) go first, so
        none is left dangling even where the database would not cascade.
        Returns (rows, [rows of each child table])."""
        total, child_totals = 0, [0] * len(children)
        last: Any = None
        while True:
            with self.sessions.begin() as session:
                query: Select[Any] = select(key).where(*where).order_by(key).limit(self.batch_size)
                if last is not None:
                    query = query.where(key > last)
                ids = list(session.scalars(query))
                if not ids:
                    break
                for index, parent_key in enumerate(children):
                    if dry_run:
                        child_totals[index] += int(session.scalar(
                            select(func.count()).select_from(parent_key.class_).where(parent_key.in_(ids))) or 0)
                    else:
                        child_totals[index] += int(session.execute(
                            delete(parent_key.class_).where(parent_key.in_(ids))).rowcount or 0)
                if not dry_run:
                    session.execute(delete(key.class_).where(key.in_(ids)))
                total += len(ids)
                last = ids[-1]
            if len(ids) < self.batch_size:
                break
        return total, child_totals

    def _idempotency_keys(self, dry_run: bool) -> int:
        if not dry_run:
            return self.idempotency.purge()
        expired = utcnow() - timedelta(seconds=self.idempotency.retention_s)
        with self.sessions() as session:
            return int(session.scalar(select(func.count()).select_from(IdempotencyKeyRow)
                                      .where(IdempotencyKeyRow.created_at < expired)) or 0)

    def _audit_prune(self, report: PruneReport) -> None:
        """Deleting history is itself worth a line in the history."""
        counts = {kind: n for kind, n in report.counts.items() if n}
        with self.sessions.begin() as session:
            session.add(AuditRow(actor=self.actor, action="db-prune", outcome="ok", detail=report.to_dict(),
                                 message="pruned " + ", ".join(f"{n} {kind}" for kind, n in counts.items())))


# ----- what each kind may lose: every state a row may still change from is excluded -------------------
def _plans(session: Session, before: datetime) -> list[ColumnElement[bool]]:
    return [PlanRow.state.in_(PLAN_FINAL_STATES), PlanRow.updated_at < before,
            PlanRow.id < _newest(session, PlanRow.id)]


def _rounds(session: Session, before: datetime) -> list[ColumnElement[bool]]:
    """Finished rebalance rounds, as old as final plans may be; open ones are still shared."""
    return [RebalanceRoundRow.finished_at.is_not(None), RebalanceRoundRow.finished_at < before,
            RebalanceRoundRow.id < _newest(session, RebalanceRoundRow.id)]


def _profile_runs(session: Session, before: datetime) -> list[ColumnElement[bool]]:
    kept = (_newest_run_per_guest(session, PROFILE_RUN_FINAL_STATES)
            | _newest_run_per_guest(session, ("finished",)))
    where = [ProfileRunRow.status.in_(PROFILE_RUN_FINAL_STATES),
             func.coalesce(ProfileRunRow.finished_at, ProfileRunRow.started_at) < before,
             ProfileRunRow.id < _newest(session, ProfileRunRow.id)]
    if kept:
        where.append(ProfileRunRow.id.not_in(sorted(kept)))
    return where


def _audit(session: Session, before: datetime) -> list[ColumnElement[bool]]:
    return [AuditRow.at < before, AuditRow.id < _newest(session, AuditRow.id)]


def _jobs(before: datetime) -> list[ColumnElement[bool]]:
    return [JobRow.status.in_(JOB_FINAL_STATES), func.coalesce(JobRow.finished_at, JobRow.created_at) < before]


def _newest(session: Session, key: Any) -> int:
    """The table's highest id (0 when empty: then nothing matches `id < 0`)."""
    return int(session.scalar(select(func.max(key))) or 0)


def _newest_run_per_guest(session: Session, statuses: Sequence[str]) -> set[int]:
    query = (select(func.max(ProfileSampleRow.run_id))
             .join(ProfileRunRow, ProfileRunRow.id == ProfileSampleRow.run_id)
             .where(ProfileRunRow.status.in_(list(statuses)))
             .group_by(ProfileSampleRow.guest))
    return {int(run_id) for run_id in session.scalars(query) if run_id is not None}
