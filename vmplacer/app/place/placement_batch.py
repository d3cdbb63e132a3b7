"""Placements that arrived together on one host, placed as one batch (see app/place/group_commit.py).

A batch does what its placements one after the other would do, with the shared work done
once: one check of the names in the store, one read of the host (libvirt's domains, then
the store's records, under the host lock), one transaction for every claim, and one that
settles them (states and audit entries). Each guest is allocated in arrival order on the
host as the guests before it in the batch left it: each allocated guest joins the view as
its domain will show (its placement, its labels, its anti-affinity), and the floating
domains its exclusive pCPUs push off are narrowed in the view as they will be on the host;
so a batch allocates exactly what the same requests, one at a time, would.

Ordering keeps the promises of a single placement: the claims are committed before libvirt
sees any domain, so another instance racing for the host loses the claim or sees the guests
as occupied. A guest that fails (it fits nowhere, its XML is refused, libvirt refuses to
define or start it) fails alone, with its own error: it is dropped before the claim when
allocating or rendering fails, and a domain libvirt refused leaves no domain and no record
(its claim is forgotten before the batch settles). The guests placed after it in the same
batch keep the pCPUs they were given: what it leaves free goes to the next placement. A
claim the database refuses (another instance claimed a pCPU or the name first) sends the
batch's guests through the one-at-a-time path, which re-reads the host and tries again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeGuard, cast

from vmplacer.app.observe.host_snapshot import HostSnapshot, joined_refusals, take_snapshot
from vmplacer.app.place.fleet_planner import exists_reason
from vmplacer.app.place.place_result import PlaceResult, host_lock
from vmplacer.core.placement.allocate import may_narrow
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.interference_scorer import profile_from_labels
from vmplacer.core.placement.nofit import NoFit, NoFitReason
from vmplacer.core.placement.occupancy import exclusive_of
from vmplacer.core.placement.isolation import IsolationViolation
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import HostTopology
from vmplacer.ports import ClaimConflict, HypervisorError, PlacementStore

PlacingHost = Any  # app/place/placement_service.py's PlacingHost


class PlacementService(Protocol):
    """What a batch uses of the placement service (app/place/placement_service.py)."""

    def admit_host(self, host: str) -> None: ...
    def with_recorded(self, host: PlacingHost, snapshot: HostSnapshot) -> HostSnapshot: ...
    def allocate_on(self, host: PlacingHost, spec: GuestSpec, view: HostSnapshot) -> Placement: ...
    def render(self, spec: GuestSpec, placement: Placement, base_xml: str | None = None) -> str: ...
    def narrowings(self, topology: HostTopology, placements: list[Placement]) -> list[Placement]: ...
    def narrow_floating(self, host: PlacingHost, snapshot: HostSnapshot, claimed_among: list[Placement]
                        ) -> tuple[list[Placement], list[IsolationViolation]]: ...
    def undo_define(self, host: PlacingHost, guest: str, *, forget: bool = True) -> None: ...
    def acting_through(self, store: PlacementStore) -> Any: ...


@dataclass(eq=False)
class Ask:
    """One placement request in a batch, and (once settled) its result or its error."""

    host: PlacingHost
    spec: GuestSpec
    base_xml: str | None
    start: bool
    actor_detail: dict[str, Any] | None
    store: PlacementStore  # the caller's: its audit entries name the caller
    result: PlaceResult | None = None
    error: BaseException | None = None
    # while placing
    placement: Placement | None = None
    xml: str = ""
    uuid: str | None = None
    narrowed: list[Placement] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        return self.result is not None or self.error is not None

    def fail(self, error: BaseException) -> None:
        self.error = error


class BatchStore(PlacementStore, Protocol):
    """A placement store that writes a batch's claims and settlement in one transaction each
    (adapters/db/placements.py)."""

    def placed_among(self, guests: list[str]) -> set[str]: ...
    def record_many(self, host: str, uri: str, claims: list[tuple[Placement, dict[str, Any]]]) -> None: ...
    def settle(self, states: list[tuple[str, str, str | None]], forgotten: list[str],
               audits: list[dict[str, Any]]) -> None: ...
    def audit_entry(self, *, action: str, outcome: str, host: str | None, guest: str | None,
                    message: str = "", detail: dict[str, Any] | None = None) -> dict[str, Any]: ...


def batch_capable(store: PlacementStore) -> TypeGuard[BatchStore]:
    """Whether `store` writes a batch's claims and settlement in one transaction each."""
    return all(callable(getattr(store, name, None)) for name in ("record_many", "settle", "audit_entry",
                                                                 "placed_among"))


def _audit_entry(ask: Ask, **entry: Any) -> dict[str, Any]:
    """An audit entry as the ask's caller: every store of a batch is of the first one's kind,
    which `place_batch` found batch-capable."""
    return cast(BatchStore, ask.store).audit_entry(**entry)


def already_placed(spec: GuestSpec, host: str) -> NoFit:
    return NoFit(spec.name, host, [NoFitReason("name", "fleet", "a guest name not yet placed",
                                               f"guest {spec.name} is already placed")])


def refuse_listed(spec: GuestSpec, host: str, snapshot: HostSnapshot) -> None:
    """libvirt's define replaces an existing domain of the same name: never do that. The
    host's listing the placement reads anyway says whether one exists (no lookup of its own)."""
    if spec.name in snapshot.live:
        raise NoFit(spec.name, host, [exists_reason(spec.name, host)])


def place_batch(service: PlacementService, asks: list[Ask]) -> None:
    """Place `asks` (all on one host, in arrival order), settling each with its result or error."""
    host = asks[0].host
    store = asks[0].store
    if not batch_capable(store):
        for ask in asks:
            _one_at_a_time(service, ask)
        return
    service.admit_host(host.name)  # e.g. not in maintenance: refuses the whole batch
    snapshot = take_snapshot(host)
    for ask in asks:
        try:
            refuse_listed(ask.spec, host.name, snapshot)
        except NoFit as exc:
            ask.fail(exc)
    placed = store.placed_among([ask.spec.name for ask in asks if not ask.settled])
    for ask in asks:
        if ask.spec.name in placed:
            ask.fail(already_placed(ask.spec, host.name))
    pending = [ask for ask in asks if not ask.settled]
    if not pending:
        return
    with host_lock(host.name):
        claimed, seen = _allocate_in_order(service, host, snapshot, pending)
        try:
            store.record_many(host.name, host.uri, [(ask.placement, ask.spec.to_dict()) for ask in claimed
                                                    if ask.placement is not None])
            conflicted = False
        except ClaimConflict:
            conflicted = True
    if conflicted:  # raced by another instance: each guest claims alone, re-reading the host
        for ask in pending:
            if not ask.settled:
                ask.placement = None
                _one_at_a_time(service, ask)
        return
    _define_and_settle(service, host, store, snapshot, seen, claimed)


def _one_at_a_time(service: PlacementService, ask: Ask) -> None:
    try:
        ask.result = service.acting_through(ask.store).place_alone(
            ask.host, ask.spec, ask.base_xml, start=ask.start, actor_detail=ask.actor_detail)
    except Exception as exc:  # noqa: BLE001 - the caller's own answer
        ask.fail(exc)


def _allocate_in_order(service: PlacementService, host: PlacingHost, snapshot: HostSnapshot,
                       asks: list[Ask]) -> tuple[list[Ask], list[Placement]]:
    """Allocate and render each guest in turn on the host as the ones before it left it (under
    the host lock: the store is read here). Returns the guests to claim, and every placement
    on the host as the claims see it, floating domains not yet narrowed."""
    view = before = service.with_recorded(host, snapshot)
    claimed: list[Ask] = []
    names = set(view.names)
    for ask in asks:
        if ask.spec.name in names:  # asked twice in one batch: the second is refused, as it would be
            ask.fail(already_placed(ask.spec, host.name))
            continue
        try:
            placement = service.allocate_on(host, ask.spec, view)
            xml = service.render(ask.spec, placement, ask.base_xml)
        except Exception as exc:  # noqa: BLE001 - NoFit, a refused document: this guest's answer
            ask.fail(exc)
            continue
        ask.placement, ask.xml = placement, xml
        view, ask.narrowed = _joined(service, view, ask.spec, placement)
        names.add(ask.spec.name)
        claimed.append(ask)
    # as the host is before any floating domain is narrowed: what narrowing starts from
    return claimed, [*before.placements, *(ask.placement for ask in claimed if ask.placement is not None)]


def _joined(service: PlacementService, view: HostSnapshot, spec: GuestSpec, placement: Placement
            ) -> tuple[HostSnapshot, list[Placement]]:
    """`view` with the guest's domain in it, as the host will show it to the next placement: its
    placement, its labels, its anti-affinity, and the floating domains it pushes off its
    exclusive pCPUs narrowed. Returns the view and those narrowed domains."""
    live = {**view.live, spec.name: placement}
    refusals = {spec.name: tuple(spec.anti_affinity)} if spec.anti_affinity else None
    joined = replace(view, live=live, profiles={**view.profiles, spec.name: profile_from_labels(spec.name,
                                                                                                dict(spec.labels))},
                     anti_affinity=joined_refusals(view.anti_affinity, refusals))
    topology = view.topology
    if not exclusive_of(placement) or not may_narrow(joined.placements, topology.reserved):
        return joined, []
    narrowed = [after for after in service.narrowings(topology, joined.placements) if after.guest != spec.name]
    if not narrowed:
        return joined, []
    by_guest = {after.guest: after for after in narrowed}
    live.update({guest: after for guest, after in by_guest.items() if guest in live})
    recorded = tuple(by_guest.get(p.guest, p) for p in joined.recorded)  # a domain listed only on record
    return replace(joined, live=live, recorded=recorded), narrowed


def _define_and_settle(service: PlacementService, host: PlacingHost, store: Any, snapshot: HostSnapshot,
                       claimed_among: list[Placement], claimed: list[Ask]) -> None:
    """Define (and start) each claimed guest; forget the ones libvirt refused; narrow the
    floating domains off the new exclusive pCPUs; settle states and audit entries at once."""
    forgotten: list[str] = []
    failures: list[dict[str, Any]] = []
    started: list[Ask] = []
    for ask in claimed:
        try:
            ask.uuid = host.define(ask.xml, ask.spec.name)
        except HypervisorError as exc:
            ask.fail(exc)
            forgotten.append(ask.spec.name)
            failures.append(_audit_entry(ask, action="define", outcome="failed", host=host.name,
                                         guest=ask.spec.name, message=str(exc), detail=ask.actor_detail))
            continue
        if ask.start:
            started.append(ask)
    if started:  # a domain about to start is on record as defined first (as a lone placement does)
        store.settle([(ask.spec.name, "defined", ask.uuid) for ask in started], [], [])
        for ask in started:
            try:
                host.start(ask.spec.name)
            except HypervisorError as exc:
                service.undo_define(host, ask.spec.name, forget=False)
                ask.fail(exc)
                forgotten.append(ask.spec.name)
                failures.append(_audit_entry(ask, action="start", outcome="failed", host=host.name,
                                             guest=ask.spec.name, message=str(exc), detail=ask.actor_detail))
    if forgotten:  # before narrowing: a refused guest's pCPUs push no floating domain off
        store.settle([], forgotten, failures)
    placed = [ask for ask in claimed if not ask.settled]
    if not placed:
        return
    # narrowing is audited as the first placed guest's caller (a lone placement audits its own)
    narrowed, violations = service.acting_through(placed[0].store).narrow_floating(host, snapshot, claimed_among)
    states, audits = [], []
    for ask in placed:
        assert ask.placement is not None
        state = "running" if ask.start else "defined"
        mine = _narrowed_by(ask, narrowed)
        states.append((ask.spec.name, state, ask.uuid))
        # "place ok": the guest's pCPUs are its own only once the floaters left them
        audits.append(_audit_entry(
            ask, action="place", outcome="ok", host=host.name, guest=ask.spec.name,
            message=ask.placement.describe_pinning(),
            detail={**(ask.actor_detail or {}), "placement": ask.placement.to_dict(), "state": state,
                    "narrowed": [p.guest for p in mine],
                    "isolation_violations": [v.describe() for v in violations]}))
        ask.narrowed = mine
    store.settle(states, [], audits)
    for ask in placed:
        assert ask.placement is not None
        ask.result = PlaceResult(ask.placement, ask.xml, "running" if ask.start else "defined", ask.uuid,
                                 ask.narrowed, list(violations))


def _narrowed_by(ask: Ask, narrowed: list[Placement]) -> list[Placement]:
    """The floating domains this guest's claim pushed off, pinned as its claim left them (as a
    lone placement reports them: later guests of the batch may narrow them further), among
    those narrowed on the host."""
    done = {p.guest for p in narrowed}
    return sorted((p for p in ask.narrowed if p.guest in done), key=lambda p: p.guest)

