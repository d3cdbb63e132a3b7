"""SQLAlchemy 2 models. The schema is owned by Alembic (migrations/); these
classes mirror it and tests check that they never drift apart."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Deterministic constraint names, so migrations can drop/alter them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


# Every column holding a libvirt domain name: libvirt takes names up to 251 bytes.
GUEST_NAME_LENGTH = 255


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class HostRow(Base):
    __tablename__ = "hosts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    uri: Mapped[str] = mapped_column(String(512))
    topology: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    last_seen_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # Maintenance: set while the host takes no new guests and no migrations (NULL: in service).
    maintenance_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    maintenance_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    maintenance_reason: Mapped[str | None] = mapped_column(Text, nullable=True)

    placements: Mapped[list[PlacementRow]] = relationship(back_populates="host_row")


class PlacementRow(Base):
    """A guest vmplacer placed (or adopted) and where it runs."""

    __tablename__ = "placements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    guest: Mapped[str] = mapped_column(String(GUEST_NAME_LENGTH), unique=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="RESTRICT"), index=True)
    domain_uuid: Mapped[str | None] = mapped_column(String(36), nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="planned")  # planned|defined|running|removed
    vcpus: Mapped[int] = mapped_column(Integer)
    memory_kib: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict] = mapped_column(JSON)
    placement: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    host_row: Mapped[HostRow] = relationship(back_populates="placements")
    claims: Mapped[list[CpuClaimRow]] = relationship(
        back_populates="placement_row", cascade="all, delete-orphan"
    )


class CpuClaimRow(Base):
    """An exclusive pCPU claim. The unique (host, cpu) key makes double-booking
    impossible at the database level, whatever the callers race on."""

    __tablename__ = "cpu_claims"
    __table_args__ = (UniqueConstraint("host_id", "cpu"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"))
    cpu: Mapped[int] = mapped_column(Integer)
    placement_id: Mapped[int] = mapped_column(ForeignKey("placements.id", ondelete="CASCADE"), index=True)

    placement_row: Mapped[PlacementRow] = relationship(back_populates="claims")


class AuditRow(Base):
    """Every action vmplacer takes on a host, with its reason and outcome."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    host: Mapped[str | None] = mapped_column(String(64), nullable=True)
    guest: Mapped[str | None] = mapped_column(String(GUEST_NAME_LENGTH), nullable=True)
    outcome: Mapped[str] = mapped_column(String(16))  # ok|failed|skipped|rolled_back
    detail: Mapped[dict] = mapped_column(JSON, default=dict)
    message: Mapped[str] = mapped_column(Text, default="")


class ThrottleRow(Base):
    """A CPU bandwidth limit vmplacer set and has not released, and the protected guest it serves.
    Throttles persist in libvirt beyond the process that set them; this row is their reason."""

    __tablename__ = "throttles"
    __table_args__ = (UniqueConstraint("host", "guest"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(64))
    guest: Mapped[str] = mapped_column(String(GUEST_NAME_LENGTH))
    bandwidth: Mapped[dict] = mapped_column(JSON)  # CpuBandwidth now in force
    original: Mapped[dict] = mapped_column(JSON)  # CpuBandwidth before vmplacer first throttled it
    protects: Mapped[str] = mapped_column(String(GUEST_NAME_LENGTH))
    reason: Mapped[str] = mapped_column(Text, default="")
    plan_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


# ----- Freeze'nSense ---------------------------------------------------------------------


class FreezeJournalRow(Base):
    """A freeze in progress: committed before the first suspend, deleted after the last
    resume. A row left behind names domains a dead process may have left paused."""

    __tablename__ = "freeze_journal"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(64), index=True)
    domains: Mapped[list] = mapped_column(JSON)  # [{"name": ..., "uuid": ...}]
    owner: Mapped[dict] = mapped_column(JSON)  # {"hostname", "pid", "started", "instance"}
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    deadline_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ProfileRunRow(Base):
    """One profiling run on one host: its parameters and, once finished, its results
    (per-VM distributions of ζ, ζb and degradation; measured and formula overhead)."""

    __tablename__ = "profile_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(64), index=True)
    metric: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="running")  # running|finished|failed
    parameters: Mapped[dict] = mapped_column(JSON, default=dict)
    results: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    samples: Mapped[list[ProfileSampleRow]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True
    )


class ProfileSampleRow(Base):
    """One ζ (shared) or ζb (neighbours frozen) sample, with the neighbours at sample time
    and their distance class: the interference model learns from these."""

    __tablename__ = "profile_samples"
    # each guest's newest run (retention keeps it) is a max over this index, not a table scan
    __table_args__ = (Index("ix_profile_samples_guest_run_id", "guest", "run_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("profile_runs.id", ondelete="CASCADE"), index=True)
    guest: Mapped[str] = mapped_column(String(GUEST_NAME_LENGTH), index=True)
    kind: Mapped[str] = mapped_column(String(8))  # zeta | zeta_b | zeta_p (pair probe)
    metric: Mapped[str] = mapped_column(String(16))
    value: Mapped[float] = mapped_column(Float)
    window_s: Mapped[float] = mapped_column(Float)
    t_m_ms: Mapped[float] = mapped_column(Float)
    freeze_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    neighbours: Mapped[list] = mapped_column(JSON, default=list)  # [{"name", "distance", "frozen"}]
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    run: Mapped[ProfileRunRow] = relationship(back_populates="samples")


# ----- interference model ------------------------------------------------------------------


class InterferenceModelRow(Base):
    """The learned interference model (its to_dict() state), one row per model name."""

    __tablename__ = "interference_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[dict] = mapped_column(JSON)
    observations: Mapped[int] = mapped_column(Integer, default=0)
    last_run_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # newest profile run learned
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


# ----- rebalancing: plans, their actions, host leases ----------------------------------------------


class PlanRow(Base):
    """A rebalancing plan: proposed → approved → running → succeeded | failed | rolled_back | cancelled,
    or `empty` (final from the start: nothing worth doing was found).

    `cancel_requested_*` hold a request to stop a running plan, which its
    executor reads between actions."""

    __tablename__ = "plans"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    state: Mapped[str] = mapped_column(String(16), default="proposed", index=True)
    hosts: Mapped[list] = mapped_column(JSON, default=list)
    objective_before: Mapped[float] = mapped_column(Float, default=0.0)
    objective_after: Mapped[float] = mapped_column(Float, default=0.0)
    predicted: Mapped[dict] = mapped_column(JSON, default=dict)  # guest -> {"before", "after"}
    settings: Mapped[dict] = mapped_column(JSON, default=dict)
    summary: Mapped[str] = mapped_column(Text, default="")
    message: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(128), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    cancel_requested_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    cancel_reason: Mapped[str | None] = mapped_column(Text, nullable=True)

    actions: Mapped[list[PlanActionRow]] = relationship(
        back_populates="plan", cascade="all, delete-orphan", passive_deletes=True,
        order_by="PlanActionRow.seq",
    )


class PlanActionRow(Base):
    """One action of a plan, with what the planner expected (before/after) and what happened."""

    __tablename__ = "plan_actions"
    # finished actions of a kind lately (the last day's trials, the moves within the cool-down): a range
    # of this index, not a scan; the count by state (/metrics) reads the index instead of every row
    __table_args__ = (UniqueConstraint("plan_id", "seq"),
                      Index("ix_plan_actions_state_kind_finished_at", "state", "kind", "finished_at"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(24))  # repin | set_memory_nodes | migrate | probe | throttle | release
    host: Mapped[str] = mapped_column(String(64))
    guest: Mapped[str | None] = mapped_column(String(GUEST_NAME_LENGTH), nullable=True, index=True)
    target_host: Mapped[str | None] = mapped_column(String(64), nullable=True)
    before: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    predicted_gain: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[dict] = mapped_column(JSON, default=dict)
    confidence: Mapped[float] = mapped_column(Float, default=1.0)
    depends_on: Mapped[list] = mapped_column(JSON, default=list)
    parameters: Mapped[dict] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    message: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    plan: Mapped[PlanRow] = relationship(back_populates="actions")


class HostLeaseRow(Base):
    """Who may act on a host until when: one rebalancing run per host at a time."""

    __tablename__ = "host_leases"

    host: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(128), nullable=True)
    acquired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class RebalanceRoundRow(Base):
    """One round of rebalancing shared by every instance that selects the same hosts: each host
    is planned (and applied) once per round, by whichever instance claims it.

    `open_key` is the selection's key while the round is open and NULL once every host is done:
    its unique constraint lets only one round per selection be open, so instances starting
    together join one round instead of opening one each."""

    __tablename__ = "rebalance_rounds"
    __table_args__ = (UniqueConstraint("open_key"), Index("ix_rebalance_rounds_key_finished_at", "key", "finished_at"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64))
    open_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    opened_by: Mapped[str] = mapped_column(String(128), default="")
    opened_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class RebalanceRoundHostRow(Base):
    """A host of a round: pending until the instance that held its lease marks it done, with the
    plan that covered it (none when the host could not be planned). `claimed_by` tells a lease
    taken by the round's instances (waited for, taken over when it lapses) from one held
    outside the round (an API job, a `--no-share` run)."""

    __tablename__ = "rebalance_round_hosts"

    round_id: Mapped[int] = mapped_column(ForeignKey("rebalance_rounds.id", ondelete="CASCADE"), primary_key=True)
    host: Mapped[str] = mapped_column(String(64), primary_key=True)
    claimed_by: Mapped[str | None] = mapped_column(String(128), nullable=True)  # the last instance to claim it
    done_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    done_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    plan_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    outcome: Mapped[str | None] = mapped_column(String(32), nullable=True)


# ----- REST API: tokens, idempotency keys, jobs ---------------------------------------------


class ApiTokenRow(Base):
    """A bearer token of the REST API. Only its SHA-256 is stored: the token itself is
    shown once, when created, and cannot be read back from the database."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    scope: Mapped[str] = mapped_column(String(8))  # read | admin
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class IdempotencyKeyRow(Base):
    """The first answer to a POST sent with an Idempotency-Key, replayed to retries.

    `fingerprint` (SHA-256 of method, path, query and the body as canonical
    JSON) tells a retry from a different request reusing the key;
    `response_status` is NULL while the first request is still being served;
    `response_headers` keeps the headers a retry needs too (Location,
    Retry-After) as [[name, value], ...]."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("principal", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    principal: Mapped[str] = mapped_column(String(64))  # the token's SHA-256 (api/idempotency.py)
    key: Mapped[str] = mapped_column(String(255))
    fingerprint: Mapped[str] = mapped_column(String(64))
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(512))
    response_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    response_type: Mapped[str | None] = mapped_column(String(128), nullable=True)
    response_body: Mapped[str | None] = mapped_column(Text, nullable=True)
    response_headers: Mapped[list | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)


class JobRow(Base):
    """Long work (profiling, applying a plan) run in the background, with its progress.

    Queued rows are picked up by whichever vmplacer instance first holds the
    lease of every host in `hosts`; `heartbeat_at` shows the runner is alive."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    hosts: Mapped[list] = mapped_column(JSON, default=list)
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)  # queued|running|succeeded|failed
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str] = mapped_column(Text, default="")
    parameters: Mapped[dict] = mapped_column(JSON, default=dict)
    result: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    error: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    created_by: Mapped[str] = mapped_column(String(64), default="")
    owner: Mapped[str | None] = mapped_column(String(128), nullable=True)  # instance running it
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


# ----- the web view's sign-ins ----------------------------------------------------------------


class WebSessionRow(Base):
    """A browser signed in to the web view. The cookie carries a random id; only its SHA-256 is
    stored, so a database dump signs nobody in. The row names the token's owner and scope,
    never the token, and goes with the token: revoking it deletes the row (ON DELETE CASCADE)."""

    __tablename__ = "web_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True)
    actor: Mapped[str] = mapped_column(String(64))  # the token's name
    token_scope: Mapped[str] = mapped_column(String(8))  # read | admin: the token's, shown, never granted
    scope: Mapped[str] = mapped_column(String(8))  # what the view may do with it: read
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
