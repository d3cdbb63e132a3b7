"""SQLAlchemy 2 models. The schema is owned by Alembic (migrations/); these
classes mirror it and tests check that they never drift apart."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    DateTime,
    ForeignKey,
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

    placements: Mapped[list[PlacementRow]] = relationship(back_populates="host_row")


class PlacementRow(Base):
    """A guest vmplacer placed (or adopted) and where it runs."""

    __tablename__ = "placements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    guest: Mapped[str] = mapped_column(String(64), unique=True)
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
    guest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    outcome: Mapped[str] = mapped_column(String(16))  # ok|failed|skipped|rolled_back
    detail: Mapped[dict] = mapped_column(JSON, default=dict)
    message: Mapped[str] = mapped_column(Text, default="")
