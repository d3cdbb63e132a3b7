"""REST API storage: bearer tokens, idempotency keys, background jobs.

Tokens are stored as the SHA-256 of a 256-bit random secret: a database dump
reveals no usable token, and a high-entropy secret needs no slow password hash.
Every method is one short committed transaction, so several vmplacer instances
can share one PostgreSQL database.
"""

from __future__ import annotations

import hmac
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from vmplacer.adapters.db.models import ApiTokenRow, AuditRow, IdempotencyKeyRow, JobRow, utcnow
from vmplacer.ports import ApplyRefused, JobRecord, TokenError, TokenInfo, hash_token

TOKEN_PREFIX = "vmp_"
TOKEN_BYTES = 32
SCOPES = ("read", "admin")
TOKEN_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-@")
LAST_USED_EVERY_S = 60.0  # last_used_at is a hint for operators, not worth a write per request


def _aware(moment: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; everything is stored in UTC."""
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment


def _epoch(moment: datetime | None) -> float | None:
    aware = _aware(moment)
    return aware.timestamp() if aware is not None else None


# ----- tokens ------------------------------------------------------------------------------------


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def check_token_name(name: str) -> str:
    if not 1 <= len(name) <= 64 or not set(name) <= TOKEN_NAME_CHARS:
        raise TokenError(f"token name must be 1-64 characters of A-Z a-z 0-9 _ . - @, got {name!r}")
    return name


class SqlTokenStore:
    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions

    def create(self, name: str, scope: str) -> str:
        """A new token for `name`; returns the secret, which is never stored."""
        check_token_name(name)
        if scope not in SCOPES:
            raise TokenError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        token = new_token()
        with self.sessions() as session:
            session.add(ApiTokenRow(name=name, scope=scope, token_hash=hash_token(token)))
            session.add(AuditRow(actor="vmplacer", action="token-create", outcome="ok",
                                 message=f"token {name} ({scope})", detail={"token": name, "scope": scope}))
            try:
                session.commit()
            except IntegrityError:
                session.rollback()
                raise TokenError(f"a token named {name!r} exists already (revoke it first)") from None
        return token

    def revoke(self, name: str) -> bool:
        with self.sessions() as session:
            deleted = session.execute(delete(ApiTokenRow).where(ApiTokenRow.name == name)).rowcount
            if deleted:
                session.add(AuditRow(actor="vmplacer", action="token-revoke", outcome="ok",
                                     message=f"token {name}", detail={"token": name}))
            session.commit()
        return bool(deleted)

    def list(self) -> list[TokenInfo]:
        with self.sessions() as session:
            rows = session.scalars(select(ApiTokenRow).order_by(ApiTokenRow.name))
            return [TokenInfo(r.name, r.scope, _epoch(r.created_at) or 0.0, _epoch(r.last_used_at), r.id)
                    for r in rows]

    def verify(self, token: str) -> TokenInfo | None:
        """The token's owner and scope, or None. The lookup is by hash; the stored hash
        is compared again in constant time so no timing tells how much of it matched."""
        digest = hash_token(token)
        with self.sessions() as session:
            row = session.scalar(select(ApiTokenRow).where(ApiTokenRow.token_hash == digest))
            if row is None or not hmac.compare_digest(row.token_hash, digest):
                return None
            now = utcnow()
            last = _aware(row.last_used_at)
            if last is None or (now - last).total_seconds() > LAST_USED_EVERY_S:
                row.last_used_at = now
                session.commit()
            return TokenInfo(row.name, row.scope, _epoch(row.created_at) or 0.0, _epoch(row.last_used_at), row.id)


# ----- idempotency keys ----------------------------------------------------------------------------


@dataclass(frozen=True)
class IdempotencyBegin:
    """What to do with a request carrying an Idempotency-Key.

    outcome: "new" (serve it, then `finish` or `abandon` row_id), "replay" (answer
    with the stored response), "mismatch" (the key was used for another request),
    "pending" (the first request with this key is still being served)."""

    outcome: str
    row_id: int | None = None
    status: int | None = None
    content_type: str | None = None
    body: str | None = None
    headers: tuple[tuple[str, str], ...] = ()


class SqlIdempotencyStore:
    def __init__(self, sessions: sessionmaker[Session], *, retention_s: float = 86_400.0,
                 pending_timeout_s: float = 600.0):
        self.sessions = sessions
        self.retention_s = retention_s
        self.pending_timeout_s = pending_timeout_s

    def begin(self, principal: str, key: str, fingerprint: str, method: str, path: str) -> IdempotencyBegin:
        """Read the key first (a retry or a waiting duplicate costs one SELECT); insert it
        when it is new, the unique (principal, key) deciding races between instances."""
        for _ in range(3):
            with self.sessions() as session:
                existing = self._existing(session, principal, key)
                if existing is None:
                    row = IdempotencyKeyRow(principal=principal, key=key, fingerprint=fingerprint,
                                            method=method, path=path[:512])
                    session.add(row)
                    try:
                        session.commit()
                        return IdempotencyBegin("new", row.id)
                    except IntegrityError:
                        session.rollback()
                    existing = self._existing(session, principal, key)
                    if existing is None:
                        continue  # purged or abandoned between our insert and this read: try again
                if not hmac.compare_digest(existing.fingerprint, fingerprint):
                    return IdempotencyBegin("mismatch", existing.id)
                if existing.response_status is not None:
                    headers = tuple((str(name), str(value)) for name, value in existing.response_headers or ())
                    return IdempotencyBegin("replay", existing.id, existing.response_status,
                                            existing.response_type, existing.response_body, headers)
                age = (utcnow() - (_aware(existing.created_at) or utcnow())).total_seconds()
                if age < self.pending_timeout_s:
                    return IdempotencyBegin("pending", existing.id)
                # The instance serving it died mid-request: forget that attempt, serve anew.
                session.execute(delete(IdempotencyKeyRow).where(
                    IdempotencyKeyRow.id == existing.id, IdempotencyKeyRow.response_status.is_(None)))
                session.commit()
        return IdempotencyBegin("pending")

    @staticmethod
    def _existing(session: Session, principal: str, key: str) -> IdempotencyKeyRow | None:
        return session.scalar(select(IdempotencyKeyRow).where(
            IdempotencyKeyRow.principal == principal, IdempotencyKeyRow.key == key))

    def finish(self, row_id: int, status: int, content_type: str, body: str,
               headers: list[tuple[str, str]] | None = None) -> None:
        """Store the answer with the headers a retry must get too (Location, Retry-After)."""
        with self.sessions() as session:
            session.execute(update(IdempotencyKeyRow).where(IdempotencyKeyRow.id == row_id).values(
                response_status=status, response_type=content_type[:128], response_body=body,
                response_headers=[[name, value] for name, value in headers or ()]))
            session.commit()

    def abandon(self, row_id: int) -> None:
        """The request failed in a way worth retrying (5xx): let the next try run again."""
        with self.sessions() as session:
            session.execute(delete(IdempotencyKeyRow).where(IdempotencyKeyRow.id == row_id))
            session.commit()

    def purge(self) -> int:
        cutoff = utcnow() - timedelta(seconds=self.retention_s)
        with self.sessions() as session:
            count = session.execute(delete(IdempotencyKeyRow).where(
                IdempotencyKeyRow.created_at < cutoff)).rowcount
            session.commit()
        return int(count or 0)


# ----- jobs ----------------------------------------------------------------------------------------


def _record(row: JobRow) -> JobRecord:
    return JobRecord(
        id=row.id, kind=row.kind, hosts=tuple(row.hosts or ()), status=row.status,
        progress=float(row.progress or 0.0), message=row.message or "",
        parameters=dict(row.parameters or {}), result=row.result, error=row.error,
        created_by=row.created_by or "", owner=row.owner,
        created_at=_epoch(row.created_at) or 0.0, started_at=_epoch(row.started_at),
        finished_at=_epoch(row.finished_at), heartbeat_at=_epoch(row.heartbeat_at),
    )


class SqlJobStore:
    """The `JobStore` port on SQLAlchemy. State changes are conditional updates
    (`WHERE status = … AND owner = …`), so two instances never both run a job and
    a job failed by the reaper is not revived by a late runner."""

    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions

    def create(self, kind: str, hosts: list[str], parameters: dict[str, Any], created_by: str) -> JobRecord:
        with self.sessions() as session:
            row = JobRow(id=str(uuid.uuid4()), kind=kind, hosts=sorted(set(hosts)), status="queued",
                         progress=0.0, message="queued", parameters=dict(parameters),
                         created_by=created_by, created_at=utcnow())
            session.add(row)
            session.commit()
            return _record(row)

    def get(self, job_id: str) -> JobRecord | None:
        with self.sessions() as session:
            row = session.get(JobRow, job_id)
            return _record(row) if row is not None else None

    def list(self, limit: int = 100, status: str | None = None, kind: str | None = None) -> list[JobRecord]:
        query = select(JobRow).order_by(JobRow.created_at.desc(), JobRow.id).limit(limit)
        if status is not None:
            query = query.where(JobRow.status == status)
        if kind is not None:
            query = query.where(JobRow.kind == kind)
        with self.sessions() as session:
            return [_record(row) for row in session.scalars(query)]

    def active_on(self, kind: str, host: str) -> list[JobRecord]:
        """Queued or running jobs of `kind` touching `host`."""
        with self.sessions() as session:
            rows = session.scalars(select(JobRow).where(
                JobRow.kind == kind, JobRow.status.in_(("queued", "running"))))
            return [_record(row) for row in rows if host in (row.hosts or ())]

    def request_stop(self, job_id: str, by: str) -> JobRecord | None:
        """Ask an unfinished job to stop (recorded in its parameters as `stop`; the handler of a
        job that runs until told, like the protection loop, polls for it). The job as it now is,
        None when it does not exist; a finished job is returned unchanged."""
        with self.sessions() as session:
            row = session.get(JobRow, job_id, with_for_update=True)
            if row is None:
                return None
            if row.status in ("queued", "running") and not (row.parameters or {}).get("stop"):
                row.parameters = {**(row.parameters or {}), "stop": {"by": by, "at": utcnow().timestamp()}}
                session.commit()
            return _record(row)

    def cancel(self, job_id: str, by: str) -> JobRecord | None:
        """Cancel a job: a queued one ends `cancelled` here and now (no runner ever starts it);
        a running one gets a stop request, as `request_stop`, which its handler honours between
        steps. The job as it now is, None when it does not exist; a finished job unchanged."""
        with self.sessions() as session:
            row = session.get(JobRow, job_id, with_for_update=True)
            if row is None:
                return None
            stop = (row.parameters or {}).get("stop") or {"by": by, "at": utcnow().timestamp()}
            if row.status == "queued":
                now = utcnow()
                row.parameters = {**(row.parameters or {}), "stop": stop}
                row.status, row.finished_at, row.heartbeat_at = "cancelled", now, now
                row.message = f"cancelled by {stop['by']} before it started"
                row.error = {"code": "cancelled", "message": row.message}
                session.commit()
            elif row.status == "running" and not (row.parameters or {}).get("stop"):
                row.parameters = {**(row.parameters or {}), "stop": stop}
                session.commit()
            return _record(row)

    def queued(self, limit: int) -> list[JobRecord]:
        with self.sessions() as session:
            rows = session.scalars(select(JobRow).where(JobRow.status == "queued")
                                   .order_by(JobRow.created_at, JobRow.id).limit(limit))
            return [_record(row) for row in rows]

    def claim(self, job_id: str, owner: str) -> bool:
        now = utcnow()
        with self.sessions() as session:
            count = session.execute(update(JobRow).where(JobRow.id == job_id, JobRow.status == "queued").values(
                status="running", owner=owner, started_at=now, heartbeat_at=now, message="started")).rowcount
            session.commit()
        return count == 1

    def progress(self, job_id: str, owner: str, fraction: float, message: str) -> None:
        with self.sessions() as session:
            session.execute(update(JobRow).where(
                JobRow.id == job_id, JobRow.owner == owner, JobRow.status == "running").values(
                progress=min(max(float(fraction), 0.0), 1.0), message=message[:2000], heartbeat_at=utcnow()))
            session.commit()

    def finish(self, job_id: str, owner: str, status: str, result: dict[str, Any] | None,
               error: dict[str, Any] | None) -> bool:
        if status not in ("succeeded", "failed", "cancelled"):
            raise ValueError(f"job {job_id}: final status must be succeeded, failed or cancelled, got {status!r}")
        values: dict[str, Any] = {"status": status, "result": result, "error": error,
                                  "finished_at": utcnow(), "heartbeat_at": utcnow()}
        if status == "succeeded":
            values.update(progress=1.0, message="finished")
        else:
            values["message"] = str((error or {}).get("message", "failed"))[:2000]
        with self.sessions() as session:
            count = session.execute(update(JobRow).where(
                JobRow.id == job_id, JobRow.owner == owner, JobRow.status == "running").values(**values)).rowcount
            session.commit()
        return count == 1

    def heartbeat(self, owner: str, job_ids: list[str]) -> None:
        if not job_ids:
            return
        with self.sessions() as session:
            session.execute(update(JobRow).where(
                JobRow.id.in_(job_ids), JobRow.owner == owner, JobRow.status == "running").values(
                heartbeat_at=utcnow()))
            session.commit()

    def reap(self, stale_s: float) -> list[str]:
        cutoff = utcnow() - timedelta(seconds=stale_s)
        with self.sessions() as session:
            stale = list(session.scalars(select(JobRow).where(
                JobRow.status == "running",
                or_(JobRow.heartbeat_at.is_(None), JobRow.heartbeat_at < cutoff))))
            reaped = []
            for row in stale:
                count = session.execute(update(JobRow).where(
                    JobRow.id == row.id, JobRow.status == "running", JobRow.owner == row.owner).values(
                    status="failed", finished_at=utcnow(),
                    message=f"abandoned: instance {row.owner} stopped reporting",
                    error={"code": "abandoned",
                           "message": f"instance {row.owner} stopped reporting progress "
                                      f"(no heartbeat for {stale_s:g} s); the job did not finish"})).rowcount
                if count:
                    reaped.append(row.id)
            session.commit()
        return reaped

    def counts(self) -> dict[tuple[str, str], int]:
        """(kind, status) -> number of jobs, for metrics."""
        with self.sessions() as session:
            rows = session.execute(select(JobRow.kind, JobRow.status, func.count()).group_by(JobRow.kind, JobRow.status))
            return {(kind, status): int(n) for kind, status, n in rows}


# ----- placements listing (the API's GET /v1/placements) -------------------------------------------------


def placement_records(sessions: sessionmaker[Session], host: str | None = None,
                      limit: int = 1000) -> list[dict[str, Any]]:
    from vmplacer.adapters.db.models import HostRow, PlacementRow

    query = select(PlacementRow, HostRow.name).join(HostRow).order_by(PlacementRow.id).limit(limit)
    if host is not None:
        query = query.where(HostRow.name == host)
    with sessions() as session:
        return [
            {"guest": row.guest, "host": name, "state": row.state, "domain_uuid": row.domain_uuid,
             "spec": row.spec, "placement": row.placement, "claims": sorted(c.cpu for c in row.claims)}
            for row, name in session.execute(query)
        ]



# ----- applying a plan through the API -------------------------------------------------------------------


def queue_plan_apply(sessions: sessionmaker[Session], plan_id: int, hosts: list[str], created_by: str,
                     kind: str = "apply-plan", *, token_id: int | None = None) -> JobRecord:
    """Approve a plan and queue the job applying it, atomically: of racing callers one gets
    the job, the others ApplyRefused. The plan row is written first, which locks it (the
    row on PostgreSQL, the database on SQLite) until the job row is committed."""
    from vmplacer.adapters.db.models import PlanRow
    from vmplacer.core.rebalance.plan import not_appliable

    with sessions() as session:
        touched = session.execute(update(PlanRow).where(PlanRow.id == plan_id).values(updated_at=utcnow())).rowcount
        if not touched:
            session.rollback()
            raise LookupError(f"plan {plan_id} does not exist")
        row = session.get(PlanRow, plan_id, populate_existing=True)
        assert row is not None
        for job in session.scalars(select(JobRow).where(JobRow.kind == kind,
                                                        JobRow.status.in_(("queued", "running")))):
            if (job.parameters or {}).get("plan_id") == plan_id:
                session.rollback()
                raise ApplyRefused(f"plan {plan_id} is already being applied by job {job.id}", job=job.id)
        if row.state == "proposed":
            row.state = "approved"
            row.message = f"approved by {created_by} through the API"
        elif row.state != "approved":
            state = row.state
            session.rollback()
            raise ApplyRefused(not_appliable(plan_id, state), state=state)
        job_row = JobRow(id=str(uuid.uuid4()), kind=kind, hosts=sorted(set(hosts)), status="queued", progress=0.0,
                         message="queued", parameters={"plan_id": plan_id, "token_id": token_id},
                         created_by=created_by,
                         created_at=utcnow())
        session.add(job_row)
        session.commit()
        return _record(job_row)
