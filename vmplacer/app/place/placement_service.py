"""Place a guest on a real host: allocate, record the claim, define, start.

Ordering is what keeps the promises: the placement and its exclusive pCPU
claims are committed *before* libvirt sees the domain, so a racing caller
either loses the claim (and re-plans) or sees our guest as occupied; a
failure after the claim undoes everything done so far, so no half-defined
domain and no orphan claim are left behind.
"""

from __future__ import annotations

import json

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from vmplacer.app.place.group_commit import GroupCommit
from vmplacer.app.observe.host_snapshot import HostSnapshot, take_snapshot
# PlaceResult as PlaceResult: re-exported, callers of the service take it from here
from vmplacer.app.place.place_result import PlaceResult as PlaceResult, host_lock
from vmplacer.app.place.placement_batch import Ask, already_placed, batch_capable, place_batch, refuse_listed
from vmplacer.core.placement.allocate import allocate, may_narrow, refresh_shared_pins
from vmplacer.core.placement.fleet_index import HostRoom, host_room
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.interference_scorer import GuestProfile
from vmplacer.core.placement.isolation import IsolationViolation, isolation_violations
from vmplacer.core.placement.occupancy import Occupancy, occupancy_after
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.admit import AllocationOptions
from vmplacer.core.placement.scoring import Scorer
from vmplacer.core.topology.host import HostTopology
from vmplacer.ports import ClaimConflict, DomainGone, DomainInfo, HypervisorError, PlacementStore

MAX_CLAIM_ATTEMPTS = 8
REMOVED = {"undefined": "domain destroyed and undefined", "gone": "domain already gone from the host",
           "kept": "record only: the domain was left defined"}


class PlacingHost(Protocol):
    """What placing needs from a host beyond the `Hypervisor` port."""

    name: str
    uri: str

    def topology(self) -> HostTopology: ...
    def domains(self) -> list[DomainInfo]: ...
    def domain_state(self, name: str) -> tuple[str, str | None]: ...
    def define(self, xml: str, name: str = "") -> str: ...
    def start(self, name: str) -> None: ...
    def destroy(self, name: str) -> None: ...
    def undefine(self, name: str) -> None: ...
    def pin_vcpu(self, name: str, vcpu: int, cpus: frozenset[int]) -> None: ...
    def pin_emulator(self, name: str, cpus: frozenset[int]) -> None: ...


Renderer = Callable[[GuestSpec, Placement, str | None], str]


class Admission(Protocol):
    """Where the engine's scorer for a new guest comes from (app/place/admission.py: the model)."""

    def scorer(self, spec: GuestSpec, neighbours: Mapping[str, GuestProfile]) -> Scorer: ...


def _pin_changes(host: PlacingHost, old: Placement, new: Placement) -> None:
    """Pin what differs between `old` and `new`: vCPUs first, then the emulator threads."""
    for vcpu, cpus in sorted(new.vcpupin.items()):
        if cpus and old.vcpupin.get(vcpu) != cpus:
            host.pin_vcpu(new.guest, vcpu, cpus)
    if new.emulatorpin and old.emulatorpin != new.emulatorpin:
        host.pin_emulator(new.guest, new.emulatorpin)


def _defined(host: PlacingHost, guest: str) -> bool:
    """Whether the host has a domain of that name now (a reservation may have none yet)."""
    try:
        host.domain_state(guest)
    except DomainGone:
        return False
    return True


DRY_PLANS_KEPT = 10_000  # remembered dry runs (host x guest shape), forgotten all at once beyond


class PlacementService:
    def __init__(self, store: PlacementStore, render: Renderer,
                 options: Callable[[str], AllocationOptions] | None = None,
                 admission: Admission | None = None, *, occupancies: dict[str, Occupancy] | None = None,
                 groups: GroupCommit[Ask] | None = None, admit_host: Callable[[str], None] | None = None):
        """`options` gives each host's allocation knobs (overcommit, memory reserve) by host name;
        `admission` the scorer for each new guest (None: the topology scorers alone).
        `occupancies` holds each host's last occupancy, whose usage the next placement extends
        instead of rebuilding it over every guest (shared by the services `acting_through` makes);
        `groups` batches the placements that arrive together on a host (app/place/group_commit.py:
        shared likewise, so requests acting as different callers share a batch); `admit_host(host)`
        raises when the host takes no new guest now (maintenance): each batch asks it once."""
        self._store = store
        self._render = render
        self._options = options or (lambda _host: AllocationOptions())
        self._admission = admission
        self._occupancies: dict[str, Occupancy] = occupancies if occupancies is not None else {}
        self.admit_host = admit_host or (lambda _host: None)
        self._groups: GroupCommit[Ask] = groups if groups is not None else GroupCommit(
            lambda _host, asks: place_batch(self, asks), lambda ask: ask.settled, Ask.fail)
        self._shapes: list[HostTopology] = []  # one topology (unnamed) per host shape seen
        self._shape_of: dict[int, tuple[HostTopology, int]] = {}  # id(topology) -> (it, its shape)
        self._shapes_lock = threading.Lock()
        self._rooms: dict[str, tuple[tuple[Any, ...], HostSnapshot, HostRoom]] = {}  # host -> last room()
        # (host, guest shape) -> (the view, the model, the placement): a survey's dry run of one
        # kind of guest on an unchanged host gives what the last one gave
        self._dry_plans: dict[tuple[str, str], tuple[HostSnapshot, Any, Placement]] = {}

    @property
    def groups(self) -> GroupCommit[Ask]:
        """The batches of placements that arrived together, per host (shared with `acting_through`'s)."""
        return self._groups

    def acting_through(self, store: PlacementStore) -> PlacementService:
        """The same service recording (and auditing) through `store`, e.g. one that names
        the caller a request came from."""
        return PlacementService(store, self._render, self._options, self._admission,
                                occupancies=self._occupancies, groups=self._groups, admit_host=self.admit_host)

    def _with_recorded(self, host: PlacingHost, snapshot: HostSnapshot) -> HostSnapshot:
        """`snapshot` plus the placements recorded for the host now and not (yet) seen in
        libvirt, with the recorded guests' anti-affinity (the store is read here: under the
        host lock when claiming)."""
        return snapshot.with_recorded(*self._store.occupied_and_refusals(host.name))

    def with_recorded(self, host: PlacingHost, snapshot: HostSnapshot) -> HostSnapshot:
        """`snapshot` with the store's records of the host (read now): a batch's one store read."""
        return self._with_recorded(host, snapshot)

    def allocate_on(self, host: PlacingHost, spec: GuestSpec, view: HostSnapshot) -> Placement:
        """Allocate `spec` on `view` exactly as a placement does (the batch's per-guest step)."""
        return self._allocate(host, spec, view)

    def narrow_floating(self, host: PlacingHost, snapshot: HostSnapshot, claimed_among: list[Placement]
                        ) -> tuple[list[Placement], list[IsolationViolation]]:
        """Floating domains narrowed off the pCPUs now claimed (see `_narrow_floating`)."""
        return self._narrow_floating(host, snapshot, claimed_among)

    def narrowings(self, topology: HostTopology, placements: list[Placement]) -> list[Placement]:
        return self._narrowings(topology, placements)

    def undo_define(self, host: PlacingHost, guest: str, *, forget: bool = True) -> None:
        """Destroy and undefine a domain whose placement failed (and, with `forget`, its record)."""
        for step in (host.destroy, host.undefine):
            try:
                step(guest)
            except HypervisorError:
                pass
        if forget:
            self._store.forget(guest)

    def _allocate(self, host: PlacingHost, spec: GuestSpec, view: HostSnapshot) -> Placement:
        """Anti-affinity binds both ways: the guest keeps off the nodes of the guests it
        refuses, and off those of the guests on record that refuse it."""
        topology = view.topology
        scorer = self._admission.scorer(spec, view.profiles) if self._admission is not None else None
        occupancy = occupancy_after(self._occupancies.get(host.name), topology, view.placements)
        try:
            return allocate(topology, spec, occupancy, scorer=scorer, options=self._options(host.name),
                            anti_affinity_of_others=view.anti_affinity)
        finally:
            self._occupancies[host.name] = occupancy  # its usage is built now: the next one extends it

    def plan(self, host: PlacingHost, spec: GuestSpec, base_xml: str | None = None, *,
             render: bool = True, view: HostSnapshot | None = None) -> PlaceResult:
        """Dry run: the placement and XML vmplacer would use now; nothing is written. Without
        `render` the XML is left empty (a survey of many hosts renders the winner's only);
        `view`: the host as `room` read it (no second read)."""
        if view is not None and not render:
            placement = self._remembered_plan(host, spec, view)
        else:
            placement = self._allocate(host, spec, view or self._with_recorded(host, take_snapshot(host)))
        return PlaceResult(placement, self.render(spec, placement, base_xml) if render else "", "planned")

    def _remembered_plan(self, host: PlacingHost, spec: GuestSpec, view: HostSnapshot) -> Placement:
        """The dry run of `spec` on `view`, remembered per guest shape (everything but its name)
        while the view and the model are the very objects it was made from: the allocation is a
        function of them. A guest whose name a neighbour refuses is always planned anew."""
        betas = getattr(self._admission, "betas", None)
        model = betas() if callable(betas) else None
        if (self._admission is not None and model is None) or any(
                spec.name in refused for refused in view.anti_affinity.values()):
            return self._allocate(host, spec, view)
        shape = json.dumps({k: v for k, v in spec.to_dict().items() if k != "name"}, sort_keys=True, default=str)
        key = (host.name, shape)
        known = self._dry_plans.get(key)
        if known is not None and known[0] is view and known[1] is model:
            return replace(known[2], guest=spec.name)
        placement = self._allocate(host, spec, view)
        if len(self._dry_plans) >= DRY_PLANS_KEPT:
            self._dry_plans.clear()
        self._dry_plans[key] = (view, model, placement)
        return placement

    def render(self, spec: GuestSpec, placement: Placement, base_xml: str | None = None) -> str:
        return self._render(spec, placement, base_xml)

    def shape_of(self, topology: HostTopology) -> int:
        """Which host shape (the same topology but for the name) `topology` is, remembered per
        topology object (a host's cached topology is looked at once)."""
        with self._shapes_lock:
            hit = self._shape_of.get(id(topology))
            if hit is not None and hit[0] is topology:
                return hit[1]
            plain = replace(topology, name="")
            shape = next((at for at, known in enumerate(self._shapes) if known == plain), None)
            if shape is None:
                self._shapes.append(plain)
                shape = len(self._shapes) - 1
            if len(self._shape_of) > 100_000:  # topologies re-read over days: forget the old ones
                self._shape_of.clear()
            self._shape_of[id(topology)] = (topology, shape)
            return shape

    def room(self, host: PlacingHost) -> tuple[HostSnapshot, HostRoom]:
        """The host as a dry run reads it now, and its free room (core/placement/fleet_index.py). A host
        read from a cache (api/hostcache.py) whose topology, domains read and records are the very
        objects of the last call is answered from that call: host choice among a thousand hosts
        looks at each one's cache, not at each one's guests."""
        sources = self._sources(host)
        if sources is not None:
            hit = self._rooms.get(host.name)
            if hit is not None and all(a is b for a, b in zip(hit[0], sources)):
                return hit[1], hit[2]
        view, room = self._room(host)
        if sources is not None:
            self._rooms[host.name] = (sources, view, room)
        return view, room

    def _sources(self, host: PlacingHost) -> tuple[Any, ...] | None:
        """What a cached host's snapshot is made of (None: a live host, read anew each time)."""
        cached = getattr(host, "snapshots", None)
        if cached is None:
            return None
        # the very read take_snapshot makes of it: the placements' read where the host offers it
        listing = getattr(host, "labelled_placements", None)
        domains = listing() if listing is not None else host.domains()
        return (host.topology(), domains, self._store.occupied_and_refusals(host.name))

    def _room(self, host: PlacingHost) -> tuple[HostSnapshot, HostRoom]:
        view = self._with_recorded(host, take_snapshot(host))
        topology = view.topology
        occupancy = occupancy_after(self._occupancies.get(host.name), topology, view.placements)
        self._occupancies[host.name] = occupancy
        return view, host_room(topology, occupancy.usage(topology), self._options(host.name))

    def place(
        self,
        host: PlacingHost,
        spec: GuestSpec,
        base_xml: str | None = None,
        *,
        start: bool = False,
        actor_detail: dict[str, Any] | None = None,
    ) -> PlaceResult:
        """Claim, render, define (and start); on any failure after the claim, undo it all.

        Placements on the same host that arrive together are placed as one batch: one read
        of the host, one transaction for their claims (app/place/placement_batch.py); a store
        without batch writes places each one alone (`place_alone`)."""
        if not batch_capable(self._store):
            return self.place_alone(host, spec, base_xml, start=start, actor_detail=actor_detail)
        ask = Ask(host, spec, base_xml, start, actor_detail, self._store)
        self._groups.submit(host.name, ask)
        if ask.error is not None:
            raise ask.error
        assert ask.result is not None
        return ask.result

    def place_alone(
        self,
        host: PlacingHost,
        spec: GuestSpec,
        base_xml: str | None = None,
        *,
        start: bool = False,
        actor_detail: dict[str, Any] | None = None,
    ) -> PlaceResult:
        """One placement by itself: claim, render, define (and start); on any failure after the
        claim, undo it all.

        The host lock covers only choosing the pCPUs and committing their claim. Reading
        libvirt happens before it: every placement vmplacer made is in the store, which is
        read inside the lock, so the claim is never planned on a stale view of vmplacer's
        own work (and the claims' unique key keeps that true across instances). Rendering
        and libvirt's define run after it: until they succeed, the committed claim keeps
        the pCPUs from every other placement, and a failure forgets it."""
        snapshot = take_snapshot(host)
        refuse_listed(spec, host.name, snapshot)
        if self.is_placed(spec.name):
            raise already_placed(spec, host.name)
        with host_lock(host.name):
            placement, claimed_among = self._claim(host, spec, snapshot)
        xml = self._render_claimed(spec, placement, base_xml)
        try:
            uuid = host.define(xml, spec.name)
        except HypervisorError as exc:
            self._store.forget(spec.name)
            self._audit("define", "failed", host, spec, str(exc), actor_detail)
            raise
        state = "running" if start else "defined"
        if start:
            self._store.set_state(spec.name, "defined", uuid)
            try:
                host.start(spec.name)
            except HypervisorError as exc:
                self._undo_define(host, spec.name)
                self._audit("start", "failed", host, spec, str(exc), actor_detail)
                raise
        narrowed, violations = self._narrow_floating(host, snapshot, claimed_among)
        # "place ok" comes last: the guest's pCPUs are its own only once the floaters left them
        placed: dict[str, object] = {
            "action": "place", "outcome": "ok", "host": host.name, "guest": spec.name,
            "message": placement.describe_pinning(),
            "detail": {**(actor_detail or {}), "placement": placement.to_dict(), "state": state,
                       "narrowed": [p.guest for p in narrowed],
                       "isolation_violations": [v.describe() for v in violations]}}
        self._store.set_state(spec.name, state, uuid, audit=placed)
        return PlaceResult(placement, xml, state, uuid, narrowed, violations)

    def is_placed(self, guest: str) -> bool:
        """Whether the store records a placement of that name (an indexed lookup where the store has one)."""
        is_placed = getattr(self._store, "is_placed", None)
        return bool(is_placed(guest)) if is_placed is not None else self._store.get(guest) is not None

    def reserve(self, host: PlacingHost, spec: GuestSpec, base_xml: str | None = None, *,
                actor_detail: dict[str, Any] | None = None) -> PlaceResult:
        """Claim the pCPUs and record the placement as `planned` without defining the
        domain: the caller defines it from the returned XML (an orchestrator that owns
        domain definition). The claimed pCPUs are exclusive from now on."""
        snapshot = take_snapshot(host)
        refuse_listed(spec, host.name, snapshot)
        with host_lock(host.name):
            placement, claimed_among = self._claim(host, spec, snapshot)
        xml = self._render_claimed(spec, placement, base_xml)
        narrowed, violations = self._narrow_floating(host, snapshot, claimed_among)
        self._audit("reserve", "ok", host, spec, placement.describe_pinning(),
                    {**(actor_detail or {}), "placement": placement.to_dict(), "state": "planned",
                     "isolation_violations": [v.describe() for v in violations]})
        return PlaceResult(placement, xml, "planned", None, narrowed, violations)

    def _claim(self, host: PlacingHost, spec: GuestSpec, snapshot: HostSnapshot
               ) -> tuple[Placement, list[Placement]]:
        """Allocate and commit the claim (under the host lock); on a lost race (another
        instance claimed first), re-read the host and try again. Returns the placement and
        everything on the host with it, as the claim saw them."""
        last_conflict: ClaimConflict | None = None
        for attempt in range(MAX_CLAIM_ATTEMPTS):
            if attempt:
                snapshot = take_snapshot(host)
            view = self._with_recorded(host, snapshot)
            placement = self._allocate(host, spec, view)
            try:
                self._store.record(host.name, host.uri, placement, spec.to_dict())
            except ClaimConflict as exc:
                last_conflict = exc
                continue
            return placement, [*view.placements, placement]
        assert last_conflict is not None
        raise last_conflict

    def _render_claimed(self, spec: GuestSpec, placement: Placement, base_xml: str | None) -> str:
        """The domain XML of a committed claim; a document that cannot be rendered (or that the
        host's XML policy refuses) forgets the claim before the error goes on."""
        try:
            return self._render(spec, placement, base_xml)
        except BaseException:
            self._store.forget(spec.name)
            raise

    def _undo_define(self, host: PlacingHost, guest: str) -> None:
        self.undo_define(host, guest)

    def _narrow_floating(self, host: PlacingHost, snapshot: HostSnapshot,
                         claimed_among: list[Placement]) -> tuple[list[Placement], list[IsolationViolation]]:
        """Floating (shared) vCPUs and emulator threads of defined domains leave pCPUs that became
        exclusive, live and in the persistent config, and their records follow (reservations
        without a domain yet get narrow pins when they are defined). Returns the narrowed
        placements as now pinned, and what still breaks the isolation invariant (a domain
        libvirt refused to narrow).

        Under the host lock, from `snapshot` (read before the claim) and the store read now: every
        exclusive claim vmplacer committed is in the store, and narrowing only ever takes
        claimed pCPUs away, so a view of a domain older than another request's narrowing of it
        never widens it back. Only the domains whose pins change are looked up.

        Whether there is anything to do is asked of `claimed_among`, the host as the claim saw
        it: a floater on this claim's pCPUs was there then (a guest placed later avoids them)."""
        topology = snapshot.topology
        if not self._narrowings(topology, claimed_among):
            return [], []  # nothing floats on a claimed pCPU: the usual case, no lock, no read
        with host_lock(host.name):
            placements = self._with_recorded(host, snapshot).placements
            before = {p.guest: p for p in placements}
            narrowed: list[Placement] = []
            for after in self._narrowings(topology, placements):
                if not _defined(host, after.guest):
                    continue
                try:
                    _pin_changes(host, before[after.guest], after)
                    narrowed.append(after)
                    self._store.audit(action="narrow-shared-pins", outcome="ok", host=host.name,
                                      guest=after.guest, message=after.describe_pinning())
                except HypervisorError as exc:
                    self._store.audit(action="narrow-shared-pins", outcome="failed", host=host.name,
                                      guest=after.guest, message=str(exc))
            self._store.update_pins(narrowed)
            narrowed.sort(key=lambda p: p.guest)  # reported by name, whatever order libvirt listed them in
            now = {p.guest: p for p in narrowed}
            kept = [now.get(p.guest, p) for p in placements]
            emulator_cpus = self._options(host.name).emulator_cpus
            return narrowed, isolation_violations(topology, kept, emulator_cpus=emulator_cpus)

    @staticmethod
    def _narrowings(topology: HostTopology, placements: list[Placement]) -> list[Placement]:
        """The placements whose floating pins must leave pCPUs others claimed, narrowed."""
        if not may_narrow(placements, topology.reserved):
            return []
        before = {p.guest: p for p in placements}
        return [after for after in refresh_shared_pins(topology, placements)
                if after.guest in before and before[after.guest] != after]

    def remove(self, host: PlacingHost, guest: str, *, undefine: bool = True) -> str:
        """Forget a placement, by default destroying and undefining its domain first.

        Returns what became of the domain: "undefined" (now), "gone" (it was not
        defined any more) or "kept" (undefine=False). A host that refuses to undefine
        keeps the record (the error is raised): forgetting it would free pCPUs that a
        domain still holds."""
        domain = "kept"
        with host_lock(host.name):
            if undefine:
                try:
                    domain = self._undefine(host, guest)
                except HypervisorError as exc:
                    self._store.audit(action="remove", outcome="failed", host=host.name, guest=guest,
                                      message=str(exc), detail={"undefine": True, "undefined": False})
                    raise
            self._store.forget(guest)
        self._store.audit(action="remove", outcome="ok", host=host.name, guest=guest, message=REMOVED[domain],
                          detail={"undefine": undefine, "undefined": domain == "undefined", "domain": domain})
        return domain

    @staticmethod
    def _undefine(host: PlacingHost, guest: str) -> str:
        try:
            host.destroy(guest)
        except DomainGone:
            return "gone"
        try:
            host.undefine(guest)
        except DomainGone:
            pass  # transient: destroying it was the end of it
        return "undefined"

    def _audit(self, action: str, outcome: str, host: PlacingHost, spec: GuestSpec, message: str,
               detail: dict[str, Any] | None) -> None:
        self._store.audit(action=action, outcome=outcome, host=host.name, guest=spec.name,
                          message=message, detail=detail)
