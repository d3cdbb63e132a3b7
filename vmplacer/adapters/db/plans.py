"""Plans, their actions, host leases, and placement rows that follow repins and migrations.

Every method is one short transaction, committed before it returns: the
executor records an action's outcome before it starts the next one, so a
crash leaves the database saying what happened up to that point.

Leases: one row per host in `host_leases` (holder, expiry). On PostgreSQL the
rows are taken with SELECT … FOR UPDATE SKIP LOCKED — a second run does not
queue behind the first's transaction, it sees the row locked and backs off;
on SQLite (one writer at a time anyway) a conditional UPDATE takes a host
only when it is free, expired or already ours. Either way a run gets every
host it asked for or none.

A live executor holds (and renews) the lease of every host its plan touches
from before the plan goes `running` until after it is final; so a `running`
plan none of whose hosts has a live lease was left by a process that stopped
(killed, powered off). `SqlPlanStore.close_orphaned` ends such plans as
`failed`, saying what is known and what is not.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import delete, exists, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from vmplacer.adapters.db.models import (
    AuditRow,
    CpuClaimRow,
    HostLeaseRow,
    HostRow,
    PlacementRow,
    PlanActionRow,
    PlanRow,
    utcnow,
)
from vmplacer.adapters.db.repositories import ensure_host
from vmplacer.core.placement.occupancy import exclusive_of
from vmplacer.core.placement.guest_placement import Placement, placement_from_dict
from vmplacer.core.rebalance.plan import Action, CancelRequest, Plan, PlanError
from vmplacer.core.rebalance.trial import TrialOutcome, trial_outcome, verdict_label
from vmplacer.ports import ClaimConflict

MOVING_KINDS = ("repin", "set_memory_nodes", "migrate")
INTERRUPTED_AUDIT = "rebalance-interrupted"
STOPPED_BEFORE = "the executor stopped before this action"


def _epoch(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    if moment.tzinfo is None:  # SQLite hands back naive datetimes; everything is stored in UTC
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _from_epoch(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=timezone.utc)


def new_holder(what: str = "rebalance") -> str:
    """An identity for one run: machine, process and a random suffix (unique per run)."""
    return f"{what}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# a plan's settings that bound disruption beyond its trials' notes (docs/disruption.md)
DISRUPTION_LIMITS = ("max_moves_per_guest_hour", "max_frozen_share_per_guest_hour", "max_migrations_in_flight")

class SqlPlanStore:
    """Plans and actions (the `PlanStore` port)."""

    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions

    # ----- writing --------------------------------------------------------------------------
    def save(self, plan: Plan, created_by: str = "") -> Plan:
        """Insert a new plan and its actions; the plan comes back with its id."""
        if plan.id is not None:
            raise PlanError(f"plan {plan.id} is already stored")
        with self.sessions.begin() as session:
            row = PlanRow(
                state=plan.state, hosts=list(plan.hosts), objective_before=plan.objective_before,
                objective_after=plan.objective_after,
                predicted={g: dict(p) for g, p in plan.predicted.items()},
                settings=_jsonable(plan.settings), summary=plan.summary, message=plan.message,
                created_by=created_by,
            )
            if plan.created_at is not None:
                row.created_at = _from_epoch(plan.created_at)
            row.actions = [_action_row(a) for a in plan.actions]
            session.add(row)
            session.flush()
            plan_id = row.id
        return self.get(plan_id)  # type: ignore[return-value]

    def transition(self, plan_id: int, from_state: str, to_state: str, message: str = "") -> bool:
        """Move a plan from one state to the next, only if it is still in `from_state`.

        A conditional UPDATE: of two callers racing to run one plan, exactly one wins.
        """
        plan = self.get(plan_id)
        if plan is None:
            raise PlanError(f"plan {plan_id} does not exist")
        if plan.state == from_state:
            plan.moved_to(to_state)  # validates the transition
        with self.sessions.begin() as session:
            values: dict[str, Any] = {"state": to_state, "updated_at": utcnow()}
            if message:
                values["message"] = message
            result = session.execute(
                update(PlanRow).where(PlanRow.id == plan_id, PlanRow.state == from_state).values(**values)
            )
            return result.rowcount == 1

    def record_action(self, plan_id: int, action: Action, *, started: bool = False, finished: bool = False) -> None:
        with self.sessions.begin() as session:
            row = session.scalar(select(PlanActionRow).where(
                PlanActionRow.plan_id == plan_id, PlanActionRow.seq == action.index))
            if row is None:
                raise PlanError(f"plan {plan_id} has no action {action.index}")
            row.state = action.state
            row.message = action.message
            if started:
                row.started_at = utcnow()
            if finished:
                row.finished_at = utcnow()

    def cancel(self, plan_id: int, from_state: str, message: str) -> bool:
        """Cancel a proposed or approved plan, only if it is still in `from_state`; its pending
        actions become skipped with `message` in the same transaction."""
        if from_state not in ("proposed", "approved"):
            raise PlanError(f"plan {plan_id}: only a proposed or approved plan is cancelled at once, "
                            f"not a {from_state} one")
        now = utcnow()
        with self.sessions.begin() as session:
            result = session.execute(update(PlanRow).where(PlanRow.id == plan_id, PlanRow.state == from_state)
                                     .values(state="cancelled", message=message, updated_at=now))
            if result.rowcount != 1:
                return False
            session.execute(update(PlanActionRow)
                            .where(PlanActionRow.plan_id == plan_id, PlanActionRow.state == "pending")
                            .values(state="skipped", message=message, finished_at=now))
            return True

    def request_cancel(self, plan_id: int, by: str, reason: str = "") -> bool:
        """Record a request to stop a running plan (the first request stands); False if not running."""
        with self.sessions.begin() as session:
            result = session.execute(
                update(PlanRow)
                .where(PlanRow.id == plan_id, PlanRow.state == "running", PlanRow.cancel_requested_at.is_(None))
                .values(cancel_requested_at=utcnow(), cancel_requested_by=by[:128], cancel_reason=reason))
            if result.rowcount == 1:
                return True
            state = session.scalar(select(PlanRow.state).where(PlanRow.id == plan_id))
            return state == "running"  # already requested

    def cancel_requested(self, plan_id: int) -> CancelRequest | None:
        with self.sessions() as session:
            row = session.execute(
                select(PlanRow.cancel_requested_by, PlanRow.cancel_reason, PlanRow.cancel_requested_at)
                .where(PlanRow.id == plan_id)).first()
        if row is None or row.cancel_requested_at is None:
            return None
        return CancelRequest(by=row.cancel_requested_by or "", reason=row.cancel_reason or "",
                             at=_epoch(row.cancel_requested_at))

    # ----- plans whose executor stopped ---------------------------------------------------
    def close_orphaned(self, by: str = "vmplacer", *, dry_run: bool = False) -> list[int]:
        """End every `running` plan none of whose hosts (action hosts, migration targets) has a
        live lease: its executor stopped. Each becomes `failed` in one transaction, only if it
        is still running and still unleased (of two closers at once, one writes): pending
        actions `skipped`, a running one `failed` (its outcome is unknown), one audit entry.
        Returns the ids closed (with `dry_run`, the ids it would close; nothing is written)."""
        found = self._orphaned()
        if dry_run:
            return [plan_id for plan_id, _hosts, _since in found]
        return [plan_id for plan_id, hosts, since in found if self._close_interrupted(plan_id, hosts, since, by)]

    def _orphaned(self) -> list[tuple[int, list[str], str]]:
        """(plan id, its hosts, since when it is known dead) of running plans without a live lease.

        Running plans are read before the leases: a plan that went running after
        the first read is not looked at; one that did before had its leases taken
        before that, so a lease missing now was lost, not yet to come.
        """
        now = utcnow()
        with self.sessions() as session:
            running: dict[int, datetime | None] = {
                plan_id: moment for plan_id, moment in session.execute(
                    select(PlanRow.id, PlanRow.updated_at).where(PlanRow.state == "running").order_by(PlanRow.id))}
            if not running:
                return []
            hosts: dict[int, set[str]] = {plan_id: set() for plan_id in running}
            last_step = {plan_id: [moment] for plan_id, moment in running.items() if moment is not None}
            for plan_id, host, target, started, finished in session.execute(
                    select(PlanActionRow.plan_id, PlanActionRow.host, PlanActionRow.target_host,
                           PlanActionRow.started_at, PlanActionRow.finished_at)
                    .where(PlanActionRow.plan_id.in_(list(running)))):
                hosts[plan_id].update(h for h in (host, target) if h)
                last_step.setdefault(plan_id, []).extend(m for m in (started, finished) if m is not None)
            named = sorted(set().union(*hosts.values()))
            leases = {row.host: row for row in session.scalars(
                select(HostLeaseRow).where(HostLeaseRow.host.in_(named)))}
        found = []
        for plan_id in running:
            rows = [leases[h] for h in sorted(hosts[plan_id]) if h in leases]
            if any(row.holder is not None and row.expires_at is not None and _aware(row.expires_at) > now
                   for row in rows):
                continue
            expiries = [_aware(row.expires_at) for row in rows
                        if row.holder is not None and row.expires_at is not None]
            steps = [_aware(m) for m in last_step.get(plan_id, [])]
            if expiries:  # the lease of its executor lapsed and nobody used the hosts since
                since = f" since {_stamp(max(expiries))}"
            elif steps:  # released (or taken and released by others since): its last step is what is known
                since = f"; its last recorded step was at {_stamp(max(steps))}"
            else:
                since = ""
            found.append((plan_id, sorted(hosts[plan_id]), since))
        return found

    def _close_interrupted(self, plan_id: int, hosts: list[str], since: str, by: str) -> bool:
        now = utcnow()
        message = f"interrupted: the process applying it stopped (no live lease on its hosts{since})"
        live_lease = exists().where(HostLeaseRow.host.in_(hosts), HostLeaseRow.holder.is_not(None),
                                    HostLeaseRow.expires_at > now)
        with self.sessions.begin() as session:
            # The write comes first: it takes the row (PostgreSQL) or the database (SQLite) before
            # anything is read, so a second closer waits here and then finds the plan failed.
            # running → failed is a move the plan lifecycle allows (core.rebalance.plan).
            result = session.execute(update(PlanRow)
                                     .where(PlanRow.id == plan_id, PlanRow.state == "running", ~live_lease)
                                     .values(state="failed", message=message, updated_at=now))
            if result.rowcount != 1:
                return False
            skipped, unknown = [], []
            for row in session.scalars(select(PlanActionRow).where(
                    PlanActionRow.plan_id == plan_id, PlanActionRow.state.in_(("pending", "running")))
                    .order_by(PlanActionRow.seq)):
                action = _action_of(row)
                if action.state == "pending":
                    action = action.moved_to("skipped", STOPPED_BEFORE)
                    skipped.append(action.index)
                else:
                    action = action.moved_to("failed", _outcome_unknown(action))
                    unknown.append({"action": action.index, "kind": action.kind, "guest": action.guest,
                                    "host": action.host, "target_host": action.target_host})
                row.state, row.message, row.finished_at = action.state, action.message, now
            session.add(AuditRow(
                actor=by[:64], action=INTERRUPTED_AUDIT, outcome="failed", host=None, guest=None,
                message=f"plan {plan_id}: {message}" + (
                    f"; action {', '.join(str(u['action']) for u in unknown)} was running: outcome unknown"
                    if unknown else ""),
                detail={"plan_id": plan_id, "hosts": hosts, "skipped": skipped, "unknown": unknown}))
        return True

    # ----- reading --------------------------------------------------------------------------
    def get(self, plan_id: int) -> Plan | None:
        with self.sessions() as session:
            row = session.get(PlanRow, plan_id)
            if row is None:
                return None
            return _plan_of(row)

    def action_counts(self) -> dict[str, int]:
        """Plan actions in the database by state (their outcome once final)."""
        with self.sessions() as session:
            rows = session.execute(select(PlanActionRow.state, func.count()).group_by(PlanActionRow.state))
            return {state: int(n) for state, n in rows}

    def trial_counts(self, since: float) -> dict[tuple[str, str, str], int]:
        """(host, trial kind, kept|undone) -> trial probes finished since `since` (epoch seconds),
        counted by the database: /metrics asks on every scrape, so no row is read into Python."""
        trial_kind = PlanActionRow.parameters["trial"]["kind"].as_string()
        kind = trial_kind.label("trial_kind")  # grouped by its name: PostgreSQL would see two expressions
        query = (select(PlanActionRow.host, kind, PlanActionRow.state, func.count())
                 .where(PlanActionRow.kind == "probe", PlanActionRow.state.in_(("succeeded", "rolled_back")),
                        PlanActionRow.finished_at >= datetime.fromtimestamp(since, timezone.utc),
                        trial_kind.is_not(None))
                 .group_by(PlanActionRow.host, kind, PlanActionRow.state))
        with self.sessions() as session:
            return {(host, str(trial), verdict_label(state == "succeeded")): int(n)
                    for host, trial, state, n in session.execute(query)}

    def recent(self, limit: int = 20, states: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The newest plans first, as summaries; `states` keeps only plans in those states."""
        query = select(PlanRow).order_by(PlanRow.id.desc()).limit(limit)
        if states is not None:
            query = query.where(PlanRow.state.in_(list(states)))
        with self.sessions() as session:
            rows = session.scalars(query)
            return [{"id": r.id, "state": r.state, "hosts": r.hosts, "summary": r.summary,
                     "created_at": _epoch(r.created_at), "actions": len(r.actions),
                     "predicted_gain": round(r.objective_after - r.objective_before, 6)} for r in rows]

    def latest_disruption(self, within: int = 20) -> dict[str, Any] | None:
        """The disruption budget of the newest plan (among the last `within`) that spent one: what
        its trials took of the budget and how many waited (plan notes' `disruption`), the other
        limits it was made under (its settings' `DISRUPTION_LIMITS`), with its id."""
        query = select(PlanRow.id, PlanRow.settings).order_by(PlanRow.id.desc()).limit(within)
        with self.sessions() as session:
            for plan_id, settings in session.execute(query):
                notes = (settings or {}).get("notes") if isinstance(settings, dict) else None
                spent = notes.get("disruption") if isinstance(notes, dict) else None
                if isinstance(spent, dict) and spent:
                    limits = {key: settings[key] for key in DISRUPTION_LIMITS
                              if isinstance(settings.get(key), (int, float)) and not isinstance(settings[key], bool)}
                    return {"plan_id": int(plan_id), **limits, **spent}
        return None

    def touching(self, guest: str, limit: int = 20) -> list[dict[str, Any]]:
        """The newest plans with an action on `guest`, as `recent` lists them, each with the
        kinds and states of the actions on that guest (a guest's page: what was done to it)."""
        ids = (select(PlanActionRow.plan_id).where(PlanActionRow.guest == guest)
               .group_by(PlanActionRow.plan_id).order_by(PlanActionRow.plan_id.desc()).limit(limit))
        with self.sessions() as session:
            rows = session.scalars(select(PlanRow).where(PlanRow.id.in_(ids)).order_by(PlanRow.id.desc()))
            return [{"id": r.id, "state": r.state, "hosts": r.hosts, "summary": r.summary,
                     "created_at": _epoch(r.created_at), "actions": len(r.actions),
                     "on_guest": [{"index": a.seq, "kind": a.kind, "state": a.state}
                                  for a in sorted(r.actions, key=lambda a: a.seq) if a.guest == guest]}
                    for r in rows]

    def last_moved(self, guests: Iterable[str] | None = None, since: float | None = None) -> dict[str, float]:
        """Guest -> epoch seconds its latest move (repin, memory, migration) finished; with `since`
        (epoch seconds), only guests moved since then (the cool-down's window: a range of the
        (state, kind, finished_at) index instead of every move of the plans kept)."""
        query = (select(PlanActionRow.guest, func.max(PlanActionRow.finished_at))
                 .where(PlanActionRow.state == "succeeded", PlanActionRow.kind.in_(MOVING_KINDS),
                        PlanActionRow.guest.is_not(None), PlanActionRow.finished_at.is_not(None))
                 .group_by(PlanActionRow.guest))
        wanted = None if guests is None else set(guests)
        if since is not None:  # the window's moves are few: the guests are picked from them here
            query = query.where(PlanActionRow.finished_at >= datetime.fromtimestamp(since, timezone.utc))
        elif wanted is not None:
            query = query.where(PlanActionRow.guest.in_(sorted(wanted)))
        with self.sessions() as session:
            return {guest: _epoch(moment) for guest, moment in session.execute(query)
                    if moment is not None and (wanted is None or guest in wanted)}

    def moves_since(self, guests: Iterable[str] | None, since: float) -> dict[str, int]:
        """Guest -> its moves (repin, memory, migration) finished since `since` (epoch seconds); a
        move undone by its trial or plan counts twice: it was made and taken back."""
        query = (select(PlanActionRow.guest, PlanActionRow.state, func.count())
                 .where(PlanActionRow.state.in_(("succeeded", "rolled_back")), PlanActionRow.kind.in_(MOVING_KINDS),
                        PlanActionRow.guest.is_not(None),
                        PlanActionRow.finished_at >= datetime.fromtimestamp(since, timezone.utc))
                 .group_by(PlanActionRow.guest, PlanActionRow.state))
        wanted = None if guests is None else set(guests)
        counts: dict[str, int] = {}
        with self.sessions() as session:
            for guest, state, n in session.execute(query):
                if wanted is None or guest in wanted:
                    counts[guest] = counts.get(guest, 0) + int(n) * (2 if state == "rolled_back" else 1)
        return counts

    def last_placements(self, guests: Iterable[str]) -> dict[str, Placement]:
        """Guest -> the Placement its latest successful repin or migration left it in."""
        names = list(guests)
        if not names:
            return {}
        latest = (select(func.max(PlanActionRow.id))
                  .where(PlanActionRow.state == "succeeded", PlanActionRow.kind.in_(("repin", "migrate")),
                         PlanActionRow.guest.in_(names), PlanActionRow.after.is_not(None))
                  .group_by(PlanActionRow.guest))
        query = select(PlanActionRow.guest, PlanActionRow.after).where(PlanActionRow.id.in_(latest))
        with self.sessions() as session:
            return {guest: placement_from_dict(after) for guest, after in session.execute(query)
                    if guest is not None and after}

    def trial_outcomes(self, since: float) -> list[TrialOutcome]:
        """Trial probes finished since `since` (epoch seconds), with what they compared and kept."""
        query = (select(PlanActionRow.kind, PlanActionRow.state, PlanActionRow.parameters, PlanActionRow.host,
                        PlanActionRow.finished_at)
                 .where(PlanActionRow.kind == "probe", PlanActionRow.state.in_(("succeeded", "rolled_back")),
                        PlanActionRow.finished_at >= datetime.fromtimestamp(since, timezone.utc))
                 .order_by(PlanActionRow.id))
        with self.sessions() as session:
            found = [trial_outcome(kind, state, parameters or {}, host, _epoch(finished) or 0.0)
                     for kind, state, parameters, host, finished in session.execute(query)]
        return [o for o in found if o is not None]

    def audit_rows(self, plan_id: int) -> list[dict[str, Any]]:
        """The audit-log entries of one plan's actions (oldest first)."""
        with self.sessions() as session:
            rows = session.scalars(select(AuditRow).order_by(AuditRow.id))
            return [{"action": r.action, "outcome": r.outcome, "host": r.host, "guest": r.guest,
                     "message": r.message, "detail": r.detail}
                    for r in rows if (r.detail or {}).get("plan_id") == plan_id]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and value != value:
        return None
    return value


def _action_row(action: Action) -> PlanActionRow:
    data = action.to_dict()
    return PlanActionRow(
        seq=action.index, kind=action.kind, host=action.host, guest=action.guest,
        target_host=action.target_host, before=data["before"], after=data["after"], reason=action.reason,
        predicted_gain=action.predicted_gain, cost=data["cost"], confidence=action.confidence,
        depends_on=list(action.depends_on), parameters=_jsonable(dict(action.parameters)),
        state=action.state, message=action.message,
    )


def _action_of(a: PlanActionRow) -> Action:
    return Action.from_dict({
        "index": a.seq, "kind": a.kind, "host": a.host, "guest": a.guest, "target_host": a.target_host,
        "before": a.before, "after": a.after, "reason": a.reason, "predicted_gain": a.predicted_gain,
        "cost": a.cost, "confidence": a.confidence, "depends_on": a.depends_on, "parameters": a.parameters,
        "state": a.state, "message": a.message,
    })


def _outcome_unknown(action: Action) -> str:
    """What a `running` action left by a stopped executor says: nobody knows how it ended."""
    stopped = "the executor stopped during this action: its outcome is unknown"
    if action.kind == "migrate":
        return (f"{stopped}; {action.guest} may be on {action.host} or on {action.target_host} (a "
                f"half-migrated copy may be left on {action.target_host}): check both hosts with "
                "`vmplacer reconcile` or `virsh list --all`")
    if action.kind in ("throttle", "release"):
        return (f"{stopped}; check the CPU bandwidth of {action.guest} on {action.host} with `vmplacer reconcile` "
                "or `virsh schedinfo` (vcpu_quota): it may have the old or the new limit")
    if action.kind == "probe":
        return f"{stopped}; guests it froze on {action.host} are resumed by `vmplacer profile replay`"
    return (f"{stopped}; check {action.guest} on {action.host} with `vmplacer reconcile` or virsh "
            "(vcpupin, emulatorpin, numatune): it may have the old or the new placement")


def _plan_of(row: PlanRow) -> Plan:
    actions = [_action_of(a) for a in sorted(row.actions, key=lambda a: a.seq)]
    return Plan(
        actions=tuple(actions), hosts=tuple(row.hosts), state=row.state, id=row.id,
        objective_before=row.objective_before, objective_after=row.objective_after,
        predicted=row.predicted or {}, summary=row.summary, settings=row.settings or {},
        created_at=_epoch(row.created_at), message=row.message,
        cancel_request=None if row.cancel_requested_at is None else CancelRequest(
            by=row.cancel_requested_by or "", reason=row.cancel_reason or "", at=_epoch(row.cancel_requested_at)),
    )


# ----- leases ----------------------------------------------------------------------------------
class SqlLeaseStore:
    """Per-host leases (the `LeaseStore` port): all requested hosts or none."""

    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions

    def _dialect(self) -> str:
        bind = self.sessions.kw.get("bind")
        return bind.dialect.name if bind is not None else "sqlite"

    def _ensure_rows(self, hosts: Sequence[str]) -> None:
        dialect = self._dialect()
        with self.sessions.begin() as session:
            if dialect == "postgresql":
                from sqlalchemy.dialects.postgresql import insert
            else:
                from sqlalchemy.dialects.sqlite import insert
            for host in hosts:
                session.execute(insert(HostLeaseRow).values(host=host).on_conflict_do_nothing())

    def acquire(self, hosts: Sequence[str], holder: str, ttl_s: float) -> bool:
        hosts = sorted(set(hosts))
        if not hosts:
            return True
        self._ensure_rows(hosts)
        now = utcnow()
        expires = now + timedelta(seconds=ttl_s)
        if self._dialect() == "postgresql":
            return self._acquire_skip_locked(hosts, holder, now, expires)
        return self._acquire_conditional(hosts, holder, now, expires)

    def _acquire_skip_locked(self, hosts: list[str], holder: str, now: datetime, expires: datetime) -> bool:
        with self.sessions() as session:
            rows = list(session.scalars(
                select(HostLeaseRow).where(HostLeaseRow.host.in_(hosts)).order_by(HostLeaseRow.host)
                .with_for_update(skip_locked=True)))
            if len(rows) != len(hosts):
                session.rollback()
                return False  # another run holds some of the rows locked right now
            if any(self._taken(row, holder, now) for row in rows):
                session.rollback()
                return False
            for row in rows:
                if row.holder != holder:
                    row.acquired_at = now
                row.holder = holder
                row.expires_at = expires
            session.commit()
            return True

    @staticmethod
    def _taken(row: HostLeaseRow, holder: str, now: datetime) -> bool:
        return row.holder not in (None, holder) and row.expires_at is not None and _aware(row.expires_at) > now

    def _acquire_conditional(self, hosts: list[str], holder: str, now: datetime, expires: datetime) -> bool:
        with self.sessions() as session:
            for host in hosts:
                result = session.execute(
                    update(HostLeaseRow)
                    .where(HostLeaseRow.host == host,
                           or_(HostLeaseRow.holder.is_(None), HostLeaseRow.holder == holder,
                               HostLeaseRow.expires_at < now))
                    .values(holder=holder, acquired_at=now, expires_at=expires))
                if result.rowcount != 1:
                    session.rollback()
                    return False
            session.commit()
            return True

    def renew(self, hosts: Sequence[str], holder: str, ttl_s: float) -> bool:
        """Push the expiry of leases we hold; False if any was lost (expired and taken)."""
        expires = utcnow() + timedelta(seconds=ttl_s)
        with self.sessions.begin() as session:
            result = session.execute(update(HostLeaseRow)
                                     .where(HostLeaseRow.host.in_(list(hosts)), HostLeaseRow.holder == holder)
                                     .values(expires_at=expires))
            return result.rowcount == len(set(hosts))

    def release(self, hosts: Sequence[str], holder: str) -> None:
        with self.sessions.begin() as session:
            session.execute(update(HostLeaseRow)
                            .where(HostLeaseRow.host.in_(list(hosts)), HostLeaseRow.holder == holder)
                            .values(holder=None, expires_at=None, acquired_at=None))

    def holders(self, hosts: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        query = select(HostLeaseRow)
        if hosts is not None:
            query = query.where(HostLeaseRow.host.in_(list(hosts)))
        now = utcnow()
        with self.sessions() as session:
            return {
                row.host: {"holder": row.holder, "expires_at": _epoch(row.expires_at),
                           "live": row.holder is not None and row.expires_at is not None
                           and _aware(row.expires_at) > now}
                for row in session.scalars(query)
            }


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _stamp(moment: datetime) -> str:
    return f"{moment.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


# ----- placement rows follow the guests --------------------------------------------------------------
class SqlPlacementUpdates:
    """Rewrite recorded placements after repins and migrations (guests never recorded are skipped).

    All rows of one call change in one transaction with their exclusive pCPU
    claims: the old claims of every row go first, then the new ones, so two
    guests swapping pCPUs do not trip over each other's claims.
    """

    def __init__(self, sessions: sessionmaker[Session], uris: dict[str, str] | None = None):
        self.sessions = sessions
        self.uris = dict(uris or {})

    def recorded(self, guests: Iterable[str]) -> set[str]:
        with self.sessions() as session:
            return set(session.scalars(select(PlacementRow.guest).where(PlacementRow.guest.in_(list(guests)))))

    def apply(self, placements: Sequence[Placement]) -> list[str]:
        """Store these placements for the guests that have rows; returns the guests updated.

        Raises ClaimConflict (and changes nothing) when a new exclusive pCPU is
        claimed by a guest outside this call.
        """
        if not placements:
            return []
        with self.sessions() as session:
            try:
                with session.begin():
                    rows = {r.guest: r for r in session.scalars(
                        select(PlacementRow).where(PlacementRow.guest.in_([p.guest for p in placements])))}
                    if not rows:
                        return []
                    session.execute(delete(CpuClaimRow).where(CpuClaimRow.placement_id.in_(
                        [r.id for r in rows.values()])))
                    session.flush()
                    for placement in placements:
                        row = rows.get(placement.guest)
                        if row is None:
                            continue
                        host_row = session.get(HostRow, row.host_id)
                        if host_row is None or host_row.name != placement.host:
                            uri = self.uris.get(placement.host) or (host_row.uri if host_row else "")
                            host_row = ensure_host(session, placement.host, uri)
                            row.host_id = host_row.id
                        row.placement = placement.to_dict()
                        session.flush()
                        for cpu in sorted(exclusive_of(placement)):
                            session.add(CpuClaimRow(host_id=row.host_id, cpu=cpu, placement_id=row.id))
                    session.flush()
                    return sorted(rows)
            except IntegrityError as exc:
                raise ClaimConflict(
                    f"guests {', '.join(sorted(p.guest for p in placements))}: a new exclusive pCPU is "
                    "claimed by another guest") from exc
