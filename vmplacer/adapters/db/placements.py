"""Placements vmplacer made, and the exclusive pCPU claims that guard them."""

from __future__ import annotations

import json
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from sqlalchemy import Text, cast, delete, func, select, update
from sqlalchemy.orm import Session

from vmplacer.adapters.db.models import CpuClaimRow, HostRow, PlacementRow, utcnow
from vmplacer.adapters.db.repositories import ensure_host
from vmplacer.core.placement.occupancy import exclusive_of
from vmplacer.core.placement.guest_placement import Placement, placement_from_dict
from vmplacer.ports import RecordedPlacement

ACTIVE_STATES = ("planned", "defined", "running")
PARSED_PLACEMENTS = 16384  # distinct stored placements kept built (a few KiB each at most)


def placements_on_host(session: Session, host: str) -> list[Placement]:
    """Placements recorded for `host` that still hold resources.

    Every placement on a host reads this under the host's lock, so it reads the stored
    JSON as text and builds each distinct text once: loading ORM rows and rebuilding
    every placement cost ~50 us a row (8 ms at 170 guests), the query alone ~2 us."""
    texts = session.scalars(
        select(cast(PlacementRow.placement, Text))
        .join(HostRow)
        .where(HostRow.name == host, PlacementRow.state.in_(ACTIVE_STATES))
        .order_by(PlacementRow.id)
    )
    return [_placement_from_json(text) for text in texts]


# What a host's placement rows look like now: any insert raises the highest id, any delete
# lowers the count (or, with an insert, raises the id), any update raises the newest updated_at.
RECORDED_MAX_AGE_S = 1.0  # a full read at least this often: a writer's clock may run behind
_recorded_cache: weakref.WeakKeyDictionary[Any, dict[str, _HostRows]] = weakref.WeakKeyDictionary()
_recorded_guard = threading.Lock()


@dataclass(frozen=True)
class _Row:
    placement: Placement
    anti_affinity: tuple[str, ...]  # the guests its spec refuses to share a node with


@dataclass(frozen=True)
class _HostRows:
    version: tuple  # (row count, highest id, newest updated_at) of every row of the host
    read_at: float  # when every row was last read
    rows: dict[int, _Row | None]  # every row by id while active, else None

    def active(self) -> list[_Row]:
        return [row for _, row in sorted(self.rows.items()) if row is not None]

    def placements(self) -> list[Placement]:
        return [row.placement for row in self.active()]

    def anti_affinity(self) -> dict[str, tuple[str, ...]]:
        return {row.placement.guest: row.anti_affinity for row in self.active() if row.anti_affinity}


def _rows_version(session: Session, host: str) -> tuple:
    return tuple(session.execute(
        select(func.count(PlacementRow.id), func.max(PlacementRow.id), func.max(PlacementRow.updated_at))
        .join(HostRow).where(HostRow.name == host)).one())


def _rows(session: Session, host: str, since: datetime | None = None) -> dict[int, _Row | None]:
    query = (select(PlacementRow.id, PlacementRow.state, cast(PlacementRow.placement, Text),
                    cast(PlacementRow.spec, Text))
             .join(HostRow).where(HostRow.name == host))
    if since is not None:
        query = query.where(PlacementRow.updated_at >= since)
    return {row_id: _Row(_placement_from_json(text), _anti_affinity_from_json(spec))
            if state in ACTIVE_STATES else None
            for row_id, state, text, spec in session.execute(query)}


def cached_placements_on_host(sessions: Any, host: str) -> list[Placement]:
    """`placements_on_host` (same placements, same order) without reading every row each time.

    Placing reads the host's placements under its lock on every request. Here one aggregate
    query tells whether the rows changed; if they did, only the rows written since the last
    read are fetched, and a count that does not add up (a row deleted) reads them all."""
    return _cached_rows(sessions, host).placements()


def cached_placements_and_refusals_on_host(sessions: Any, host: str
                                           ) -> tuple[list[Placement], dict[str, tuple[str, ...]]]:
    """`cached_placements_on_host` in the same read as the refusals of the guests recorded
    there: guest -> refused guests (anti-affinity binds both ways: a guest placed later must
    keep off their nodes too)."""
    rows = _cached_rows(sessions, host)
    return rows.placements(), rows.anti_affinity()


def cached_records_of_every_host(sessions: Any, max_age_s: float = 30.0
                                 ) -> dict[str, tuple[list[Placement], dict[str, tuple[str, ...]]]]:
    """Every host's recorded placements and its recorded guests' refusals, for dry runs: one
    grouped query tells which hosts' rows changed, and only those are read again (a host whose
    rows look unchanged is re-read in full after `max_age_s`, as a writer's clock may run
    behind). Placing never uses this: it reads its host exactly, under the host's lock."""
    with sessions() as session:
        versions = {name: (count, last_id, last_update) for name, count, last_id, last_update in session.execute(
            select(HostRow.name, func.count(PlacementRow.id), func.max(PlacementRow.id),
                   func.max(PlacementRow.updated_at))
            .join(PlacementRow, PlacementRow.host_id == HostRow.id).group_by(HostRow.name))}
    with _recorded_guard:
        by_host = dict(_recorded_cache.get(sessions, {}))
    now = time.monotonic()
    result = {}
    for host, version in versions.items():
        cached = by_host.get(host)
        if cached is None or cached.version != version or now - cached.read_at >= max_age_s:
            cached = _cached_rows(sessions, host)
        result[host] = (cached.placements(), cached.anti_affinity())
    return result


def _cached_rows(sessions: Any, host: str) -> _HostRows:
    clock = time.monotonic
    with sessions() as session:
        version = _rows_version(session, host)
        with _recorded_guard:
            by_host = _recorded_cache.setdefault(sessions, {})
            cached = by_host.get(host)
        fresh = cached is not None and clock() - cached.read_at < RECORDED_MAX_AGE_S
        if fresh and cached is not None and cached.version == version:
            return cached
        current: _HostRows | None = None
        if fresh and cached is not None and cached.version[2] is not None:
            rows = {**cached.rows, **_rows(session, host, since=cached.version[2])}
            if len(rows) == version[0]:
                current = _HostRows(version, cached.read_at, rows)
        if current is None:
            current = _HostRows(version, clock(), _rows(session, host))
    with _recorded_guard:
        by_host[host] = current
    return current


@lru_cache(maxsize=PARSED_PLACEMENTS)
def _placement_from_json(text: str) -> Placement:
    """A stored placement, built once per distinct JSON text (placements are immutable)."""
    return placement_from_dict(json.loads(text))


@lru_cache(maxsize=PARSED_PLACEMENTS)
def _anti_affinity_from_json(text: str | None) -> tuple[str, ...]:
    """The anti-affinity peers of a stored spec (none in a spec without any)."""
    if not text:
        return ()
    peers = json.loads(text).get("anti_affinity") or ()
    return tuple(str(peer) for peer in peers)


def recorded_on_host(session: Session, host: str, now: datetime | None = None) -> list[RecordedPlacement]:
    """Active placement rows of `host` with their age (from `updated_at`), oldest row first.

    SQLite hands `updated_at` back naive (it was written in UTC), PostgreSQL
    aware; both are compared as UTC. An age below zero (a writer whose clock
    runs ahead) counts as "just changed".
    """
    now = now or utcnow()
    rows = session.scalars(
        select(PlacementRow)
        .join(HostRow)
        .where(HostRow.name == host, PlacementRow.state.in_(ACTIVE_STATES))
        .order_by(PlacementRow.id)
    )
    return [
        RecordedPlacement(
            guest=row.guest,
            host=host,
            state=row.state,
            domain_uuid=row.domain_uuid,
            placement=placement_from_dict(row.placement),
            age_s=max(0.0, (now - _as_utc(row.updated_at or row.created_at)).total_seconds()),
        )
        for row in rows
    ]


def _as_utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def get_placement_row(session: Session, guest: str) -> PlacementRow | None:
    return session.scalar(select(PlacementRow).where(PlacementRow.guest == guest))


def record_placement(
    session: Session,
    *,
    host: str,
    uri: str,
    placement: Placement,
    spec: dict[str, Any],
    state: str = "planned",
) -> PlacementRow:
    """Insert the placement and one claim row per exclusive pCPU.

    The caller commits; a concurrent writer that claimed any of the same pCPUs
    makes the commit fail with an IntegrityError, so nothing is double-booked.
    """
    row = placement_row(_host_id(session, host, uri), placement, spec, state)
    session.add(row)
    session.flush()
    return row


def placement_row(host_id: int, placement: Placement, spec: dict[str, Any], state: str = "planned") -> PlacementRow:
    """A new placement row with one claim row per exclusive pCPU (not yet added to a session)."""
    row = PlacementRow(
        guest=placement.guest,
        host_id=host_id,
        state=state,
        vcpus=placement.vcpus,
        memory_kib=placement.memory_kib,
        spec=spec,
        placement=placement.to_dict(),
    )
    row.claims = [CpuClaimRow(host_id=host_id, cpu=cpu) for cpu in sorted(exclusive_of(placement))]
    return row


def _host_id(session: Session, host: str, uri: str) -> int:
    """The host's row id, without loading the row (its stored topology) unless it must change."""
    found = session.execute(select(HostRow.id, HostRow.uri).where(HostRow.name == host)).first()
    if found is not None and found.uri == uri:
        return int(found.id)
    return ensure_host(session, host, uri).id


def _insert_placements(session: Session, host_id: int, claims: list[tuple[Placement, dict[str, Any]]]) -> None:
    """Placement rows and their claim rows as two multi-row INSERTs (not an ORM flush per row):
    what `placement_row` would add, for a batch of placements."""
    from sqlalchemy import insert

    now = utcnow()
    placements, cpu_claims = PlacementRow.__table__, CpuClaimRow.__table__
    inserted = session.connection().execute(
        insert(placements).returning(placements.c.id, placements.c.guest, sort_by_parameter_order=True),
        [{"guest": p.guest, "host_id": host_id, "state": "planned", "vcpus": p.vcpus, "memory_kib": p.memory_kib,
          "spec": spec, "placement": p.to_dict(), "created_at": now, "updated_at": now} for p, spec in claims])
    ids = {guest: row_id for row_id, guest in inserted}
    rows = [{"host_id": host_id, "cpu": cpu, "placement_id": ids[p.guest]}
            for p, _ in claims for cpu in sorted(exclusive_of(p))]
    if rows:
        session.connection().execute(insert(cpu_claims), rows)


def update_placement(session: Session, row: PlacementRow, placement: Placement) -> None:
    """Replace a row's placement and its claims (repin, migration)."""
    session.execute(delete(CpuClaimRow).where(CpuClaimRow.placement_id == row.id))
    host_row = session.get(HostRow, row.host_id)
    if host_row is None or host_row.name != placement.host:
        raise ValueError(f"guest {row.guest}: placement host {placement.host} differs from row host")
    row.placement = placement.to_dict()
    session.flush()
    for cpu in sorted(exclusive_of(placement)):
        session.add(CpuClaimRow(host_id=row.host_id, cpu=cpu, placement_id=row.id))
    session.flush()


def remove_placement(session: Session, row: PlacementRow) -> None:
    """Free the claims and forget the placement (the row is deleted, the audit log keeps the story)."""
    session.delete(row)
    session.flush()


class SqlPlacementStore:
    """`PlacementStore` on SQLAlchemy: one short transaction per call.

    Audit entries name `actor` and carry `actor_detail` (e.g. the API token a
    request came with), so whoever acts through this store is on record."""

    def __init__(self, sessions, actor: str = "vmplacer",  # sessionmaker[Session]
                 actor_detail: dict[str, Any] | None = None):
        self._sessions = sessions
        self._actor = actor[:64]  # the audit log's actor column
        self._actor_detail = dict(actor_detail or {})

    def occupied(self, host: str) -> list[Placement]:
        return cached_placements_on_host(self._sessions, host)

    def occupied_and_refusals(self, host: str) -> tuple[list[Placement], dict[str, tuple[str, ...]]]:
        return cached_placements_and_refusals_on_host(self._sessions, host)

    def every_host_occupied_and_refusals(self) -> dict[str, tuple[list[Placement], dict[str, tuple[str, ...]]]]:
        """`occupied_and_refusals` of every host with records, in one read of what changed (dry runs)."""
        return cached_records_of_every_host(self._sessions)

    def records(self, host: str) -> list[RecordedPlacement]:
        with self._sessions() as session:
            return recorded_on_host(session, host)

    def record(self, host: str, uri: str, placement: Placement, spec: dict[str, Any]) -> None:
        from sqlalchemy.exc import IntegrityError

        from vmplacer.ports import ClaimConflict

        with self._sessions() as session:
            try:
                record_placement(session, host=host, uri=uri, placement=placement, spec=spec)
                session.commit()
            except IntegrityError as exc:
                session.rollback()
                raise ClaimConflict(
                    f"guest {placement.guest}: a pCPU or the name is already taken on host {host}"
                ) from exc

    def record_many(self, host: str, uri: str, claims: list[tuple[Placement, dict[str, Any]]]) -> None:
        """`record` of several placements on one host in one transaction (placements that arrived
        together): all are committed, or none (ClaimConflict) and the caller claims one by one."""
        from sqlalchemy.exc import IntegrityError

        from vmplacer.ports import ClaimConflict

        if not claims:
            return
        with self._sessions() as session:
            try:
                _insert_placements(session, _host_id(session, host, uri), claims)
                session.commit()
            except IntegrityError as exc:
                session.rollback()
                names = ", ".join(p.guest for p, _ in claims)
                raise ClaimConflict(f"guests {names}: a pCPU or a name is already taken on host {host}") from exc

    def settle(self, states: list[tuple[str, str, str | None]], forgotten: list[str],
               audits: list[dict[str, Any]]) -> None:
        """Placements that arrived together, settled in one transaction: each (guest, state,
        domain UUID) of `states` set, each guest of `forgotten` forgotten (its claims freed),
        and `audits` (each one `audit_entry`'s) recorded."""
        from sqlalchemy import bindparam, insert

        from vmplacer.adapters.db.models import AuditRow

        with self._sessions() as session:
            now = utcnow()
            if states:  # one statement run for every row (executemany), not one ORM flush each
                table = PlacementRow.__table__
                changed = session.connection().execute(
                    update(table).where(table.c.guest == bindparam("g"))
                    .values(state=bindparam("s"), updated_at=bindparam("at"),
                            domain_uuid=func.coalesce(bindparam("u"), table.c.domain_uuid)),
                    [{"g": guest, "s": state, "u": domain_uuid or None, "at": now}
                     for guest, state, domain_uuid in states])
                if changed.rowcount not in (-1, len(states)):
                    raise KeyError(", ".join(guest for guest, _, _ in states))
            for guest in forgotten:
                row = get_placement_row(session, guest)
                if row is not None:
                    remove_placement(session, row)
            if audits:
                session.connection().execute(insert(AuditRow.__table__),
                                             [{"at": now, **entry, "message": entry.get("message") or ""}
                                              for entry in audits])
            session.commit()

    def audit_entry(self, *, action: str, outcome: str, host: str | None, guest: str | None,
                    message: str = "", detail: dict[str, Any] | None = None) -> dict[str, Any]:
        """What `audit` would record, as this store's actor, without recording it (`settle` does,
        together with entries of other actors)."""
        return {"actor": self._actor, "action": action, "outcome": outcome, "host": host, "guest": guest,
                "message": message, "detail": {**self._actor_detail, **(detail or {})}}

    def placed_among(self, guests: list[str]) -> set[str]:
        """Which of `guests` have a placement recorded (one query)."""
        if not guests:
            return set()
        with self._sessions() as session:
            return set(session.scalars(select(PlacementRow.guest).where(PlacementRow.guest.in_(guests))))

    def set_state(self, guest: str, state: str, domain_uuid: str | None = None, *,
                  audit: dict[str, Any] | None = None) -> None:
        """`audit`: the keyword arguments of `audit()`, written in the same transaction (one
        commit instead of two on the path every placement takes)."""
        from vmplacer.adapters.db.repositories import record_audit

        with self._sessions() as session:
            values: dict[str, Any] = {"state": state, "updated_at": utcnow()}
            if domain_uuid:
                values["domain_uuid"] = domain_uuid
            # one UPDATE, not a load of the row (its spec and placement JSON) and a flush
            if not session.execute(update(PlacementRow).where(PlacementRow.guest == guest).values(**values)).rowcount:
                raise KeyError(guest)
            if audit is not None:
                record_audit(session, actor=self._actor, **{
                    **audit, "detail": {**self._actor_detail, **(audit.get("detail") or {})}})
            session.commit()

    def forget(self, guest: str) -> None:
        with self._sessions() as session:
            row = get_placement_row(session, guest)
            if row is not None:
                remove_placement(session, row)
                session.commit()

    def update_pins(self, placements: list[Placement]) -> list[str]:
        """Rows follow pins changed on the host (narrowing, repin): one transaction, claims
        included; guests never recorded are skipped."""
        if not placements:
            return []
        from vmplacer.adapters.db.plans import SqlPlacementUpdates

        return SqlPlacementUpdates(self._sessions).apply(placements)

    def is_placed(self, guest: str) -> bool:
        """Whether a placement of that name is recorded (without loading it)."""
        with self._sessions() as session:
            return session.scalar(select(PlacementRow.id).where(PlacementRow.guest == guest)) is not None

    def get(self, guest: str) -> dict[str, Any] | None:
        with self._sessions() as session:
            row = get_placement_row(session, guest)
            if row is None:
                return None
            host_row = session.get(HostRow, row.host_id)
            return {
                "guest": row.guest,
                "host": host_row.name if host_row else None,
                "state": row.state,
                "domain_uuid": row.domain_uuid,
                "spec": row.spec,
                "placement": row.placement,
                "claims": sorted(c.cpu for c in row.claims),
            }

    def listing(self, host: str | None = None) -> list[dict[str, Any]]:
        """Every recorded placement (of one host, if named), oldest first, for `vmplacer placements`."""
        with self._sessions() as session:
            query = select(PlacementRow, HostRow.name).join(HostRow).order_by(PlacementRow.id)
            if host:
                query = query.where(HostRow.name == host)
            return [
                {"guest": row.guest, "host": name, "state": row.state, "domain_uuid": row.domain_uuid,
                 "placement": row.placement, "claims": sorted(c.cpu for c in row.claims)}
                for row, name in session.execute(query)
            ]

    def audit(self, *, action: str, outcome: str, host: str | None, guest: str | None,
              message: str = "", detail: dict[str, Any] | None = None) -> None:
        from vmplacer.adapters.db.repositories import record_audit

        with self._sessions() as session:
            record_audit(session, actor=self._actor, action=action, outcome=outcome, host=host,
                         guest=guest, message=message, detail={**self._actor_detail, **(detail or {})})
            session.commit()
