"""Host choice for the whole fleet: which host each guest lands on, and why not the others.

One path for every front end. `FleetPlacement` answers for one guest (the API's
requests, and each guest `vmplacer place` places): it plans the guest on each candidate host's view, ranks the hosts by
the placement's score (best first; ties keep the configured order) and places
best-first through `PlacementService` (claim, define, undo), never over a domain
of the same name. A request of many guests is planned as a batch by
app/place/fleet_planner.py, on views of the hosts' snapshots (`observe_host`, app/observe/host_snapshot.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmplacer.app.observe.host_snapshot import HostSnapshot, RecordedPlacements, take_snapshot
from vmplacer.app.place.place_result import PlaceResult
from vmplacer.app.place.placement_service import PlacementService, PlacingHost
from vmplacer.app.place.fleet_planner import FleetHost
from vmplacer.core.placement.fleet_index import DEFAULT_HOSTS_TO_SCORE, Demand, HostRoom, shortlist
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.topology.host import HostTopology
from vmplacer.core.placement.nofit import NoFit
from vmplacer.core.placement.admit import AllocationOptions, page_options
from vmplacer.ports import ClaimConflict, HypervisorError



# ----- one guest, ranked over the fleet (the API) ---------------------------------------------------------
class NothingFits(Exception):
    """No candidate host took the guest; `failures` says why each one did not."""

    def __init__(self, spec: GuestSpec, failures: list[tuple[str, Exception]], report: list[dict[str, Any]]):
        self.spec = spec
        self.failures = failures
        self.report = report
        super().__init__(f"guest {spec.name} fits on no candidate host")


@dataclass
class Choice:
    host: str
    result: PlaceResult
    report: list[dict[str, Any]] = field(default_factory=list)  # each candidate: its score or why not


Record = Callable[[str, str], None]  # (host, outcome): placed | refused | error | conflict


Room = tuple[int, str, PlacingHost, HostSnapshot, HostRoom, int]  # at, name, host, view, room, shape


RANKINGS_KEPT = 64  # distinct guest shapes whose ranking a memo keeps


class FleetRooms:
    """Every readable host's view, free room and shape as one survey read them, with the
    rankings of the guest shapes asked since (what the memo keeps while nothing changes)."""

    def __init__(self, rooms: list[Room]):
        self.rooms = {room[0]: room for room in rooms}
        self.shapes: dict[int, HostTopology] = {}
        self.named: dict[str, set[int]] = {}  # guest name -> the hosts (by index) where it is in use
        for at, _name, _host, view, _room, shape in rooms:
            self.shapes.setdefault(shape, view.topology)
            for guest in view.names:
                self.named.setdefault(guest, set()).add(at)
        self._rankings: dict[tuple[tuple[int, Demand], ...], list[tuple[Any, int, int]]] = {}

    def ranked(self, demands: dict[int, Demand]) -> list[tuple[Any, int, int]]:
        """(rank, host index, shape) of every host whose room may take a guest asking `demands`
        (one per host shape), remembered per distinct ask."""
        key = tuple(sorted(demands.items(), key=lambda item: item[0]))
        known = self._rankings.get(key)
        if known is None:
            known = [(judged, at, shape) for at, _name, _host, _view, room, shape in self.rooms.values()
                     if (judged := room.rank_for(demands[shape])) is not None]
            if len(self._rankings) < RANKINGS_KEPT:
                self._rankings[key] = known
        return known


class SurveyMemo:
    """The fleet's rooms as the last survey read them, kept while no host's snapshot changed:
    host choice among a thousand hosts then ranks their rooms without reading each one's cache."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[Any, ...] | None = None
        self._rooms: FleetRooms | None = None

    def get(self, key: tuple[Any, ...]) -> FleetRooms | None:
        with self._lock:
            return self._rooms if key == self._key else None

    def put(self, key: tuple[Any, ...], rooms: FleetRooms) -> None:
        with self._lock:
            self._key, self._rooms = key, rooms


class FleetPlacement:
    def __init__(self, planning: PlacementService, view: Callable[[str], PlacingHost],
                 live: Callable[[str], PlacingHost], *,
                 on_libvirt_error: Callable[[HypervisorError], None] | None = None,
                 invalidate: Callable[[str], None] | None = None,
                 refusals: tuple[type[Exception], ...] = (), hosts_to_score: int = DEFAULT_HOSTS_TO_SCORE,
                 memo: SurveyMemo | None = None, changes: Callable[[], int] | None = None):
        """`planning` dry-runs on `view(host)` (e.g. a short-lived snapshot); placing reads
        `live(host)`; `invalidate(host)` drops a host's view after a placement touched it;
        `refusals`: the host errors that refuse the document itself (no other host is tried).
        With `memo` and `changes` (a number that changes whenever any view may have), the
        hosts' rooms are read once per change, not once per guest."""
        self._memo = memo if changes is not None else None
        self._changes = changes
        self._refusals = refusals
        self._hosts_to_score = hosts_to_score
        self._planning = planning
        self._view = view
        self._live = live
        self._on_libvirt_error = on_libvirt_error or (lambda _exc: None)
        self._invalidate = invalidate or (lambda _host: None)

    def survey(self, spec: GuestSpec, hosts: Sequence[str], base_xml: str | None, *, report_errors: bool = True
               ) -> tuple[list[tuple[str, PlaceResult]], list[tuple[str, Exception]], list[dict[str, Any]]]:
        """Each host's dry run: the ranked fits (best first, ties in host order), the hosts
        that refused (NoFit) or could not be read, and a report entry per host dry-run.

        With more hosts than `hosts_to_score`, only the hosts whose free room may take the guest
        are dry-run, the most promising of them (core/placement/fleet_index.py); when none of those takes
        it, every host is (so whether it fits somewhere is never bounded)."""
        if not 0 < self._hosts_to_score < len(hosts):
            return self._dry_runs(spec, hosts, base_xml, report_errors, {})
        views: dict[str, tuple[PlacingHost, HostSnapshot]] = {}
        failures: list[tuple[str, Exception]] = []
        report: list[dict[str, Any]] = []
        fleet = self._rooms(hosts, report_errors, failures, report)
        demands = {shape: Demand.of(spec, page_options(spec, topology)) for shape, topology in fleet.shapes.items()}
        taken = fleet.named.get(spec.name, set())
        ranked = [entry for entry in fleet.ranked(demands) if entry[1] not in taken]
        chosen_at = shortlist(ranked, self._hosts_to_score)
        for at in chosen_at:
            _, name, host, view, _, _ = fleet.rooms[at]
            views[name] = (host, view)
        chosen = [hosts[at] for at in chosen_at]
        planned, refused, dry = self._dry_runs(spec, chosen, base_xml, report_errors, views)
        if not planned:  # none of the most promising: every host, for the fit or for each one's reasons
            return self._dry_runs(spec, hosts, base_xml, report_errors, {})
        return planned, failures + refused, report + dry

    def _rooms(self, hosts: Sequence[str], report_errors: bool, failures: list[tuple[str, Exception]],
               report: list[dict[str, Any]]) -> FleetRooms:
        """Each readable host's view, free room and shape (the unreadable ones reported), from the
        memo while nothing changed; a survey that found a host unreadable is not kept (the host
        is tried again by the next)."""
        if self._memo is None or self._changes is None:
            return self._read_rooms(hosts, report_errors, failures, report)[0]
        for _ in range(2):  # a walk that read something new (the first) is done again, from the caches
            key = (tuple(hosts), self._changes())
            kept = self._memo.get(key)
            if kept is not None:
                return kept
            fleet, unreadable = self._read_rooms(hosts, report_errors, failures, report)
            if unreadable:
                return fleet
            if self._changes() == key[1]:  # nothing changed while it was read: good until something does
                self._memo.put(key, fleet)
                return fleet
            failures.clear()
            report.clear()
        return fleet

    def _read_rooms(self, hosts: Sequence[str], report_errors: bool, failures: list[tuple[str, Exception]],
                    report: list[dict[str, Any]]) -> tuple[FleetRooms, bool]:
        rooms: list[Room] = []
        unreadable = False
        for at, name in enumerate(hosts):
            try:
                host = self._view(name)
                view, room = self._planning.room(host)
            except HypervisorError as exc:
                self._unreadable(name, exc, report_errors, failures, report)
                unreadable = True
                continue
            rooms.append((at, name, host, view, room, self._planning.shape_of(view.topology)))
        return FleetRooms(rooms), unreadable

    def _dry_runs(self, spec: GuestSpec, hosts: Sequence[str], base_xml: str | None, report_errors: bool,
                  views: dict[str, tuple[PlacingHost, HostSnapshot]]
                  ) -> tuple[list[tuple[str, PlaceResult]], list[tuple[str, Exception]], list[dict[str, Any]]]:
        planned: list[tuple[str, PlaceResult]] = []
        failures: list[tuple[str, Exception]] = []
        report: list[dict[str, Any]] = []
        for name in hosts:
            try:
                host, view = views.get(name) or (self._view(name), None)
                result = self._planning.plan(host, spec, base_xml, render=False, view=view)
            except NoFit as exc:
                failures.append((name, exc))
                report.append({"host": name, "reasons": [r.to_dict() for r in exc.reasons]})
                continue
            except HypervisorError as exc:
                self._unreadable(name, exc, report_errors, failures, report)
                continue
            planned.append((name, result))
            report.append({"host": name, "score": result.placement.score})
        planned.sort(key=lambda item: -item[1].placement.score)  # stable: ties keep host order
        return planned, failures, report

    def _unreadable(self, name: str, exc: HypervisorError, report_errors: bool,
                    failures: list[tuple[str, Exception]], report: list[dict[str, Any]]) -> None:
        """A host that could not be read or refused the dry run: counted (unless placing will
        count it) and reported."""
        if report_errors:
            self._on_libvirt_error(exc)
        failures.append((name, exc))
        report.append({"host": name, "error": str(exc)})

    def plan(self, spec: GuestSpec, hosts: Sequence[str], base_xml: str | None) -> Choice:
        """Dry run: the best host and its placement (its XML rendered), or NothingFits."""
        planned, failures, report = self.survey(spec, hosts, base_xml)
        if not planned:
            raise NothingFits(spec, failures, report)
        host, result = planned[0]
        result.xml = self._planning.render(spec, result.placement, base_xml)
        return Choice(host, result, report)

    def ranked(self, spec: GuestSpec, hosts: Sequence[str], base_xml: str | None
               ) -> tuple[list[str], list[dict[str, Any]]]:
        """Hosts best first; those that seemed full come last (a view may be a second old),
        unreachable ones are still tried."""
        if len(hosts) == 1:
            return list(hosts), []
        planned, failures, report = self.survey(spec, hosts, base_xml, report_errors=False)  # placing reports them
        order = [name for name, _ in planned] + [name for name, _ in failures]
        tried = set(order)
        return order + [name for name in hosts if name not in tried], report  # not dry-run: last

    def place(self, spec: GuestSpec, hosts: Sequence[str], base_xml: str | None, *, service: PlacementService,
              define: bool = True, start: bool = False, actor: dict[str, Any] | None = None,
              record: Record | None = None, order: Sequence[str] | None = None) -> Choice:
        """Try the hosts best first (or in `order`) through `service`: claim, define (and
        start), undone on failure; `define=False` stops after the claim. A host with a domain
        of the guest's name is skipped. Raises NothingFits, or the first error that is not a
        host's to skip (a refusal of the XML, a lost claim, a host error when no other host
        may be tried)."""
        record = record or (lambda _host, _outcome: None)
        if order is None:
            order, report = self.ranked(spec, hosts, base_xml)
        else:
            report = []
        failures: list[tuple[str, Exception]] = []
        for name in order:
            host = self._live(name)
            try:
                if define:  # the service refuses a host with a domain of that name (refuse_listed)
                    result = service.place(host, spec, base_xml, start=start, actor_detail=actor)
                else:
                    result = service.reserve(host, spec, base_xml, actor_detail=actor)
            except NoFit as exc:
                failures.append((name, exc))
                continue
            except HypervisorError as exc:
                if isinstance(exc, self._refusals):  # libvirt refused the document: so would the others
                    record(name, "refused")
                    raise
                self._on_libvirt_error(exc)
                if not exc.retriable or len(order) == 1:
                    record(name, "error")
                    raise
                failures.append((name, exc))
                continue
            except ClaimConflict:
                record(name, "conflict")
                raise
            finally:
                self._invalidate(name)
            record(name, "placed")
            return Choice(name, result, report)
        raise NothingFits(spec, failures, report)


def observe_host(host: PlacingHost, options: AllocationOptions, admission: Any = None,
                 store: RecordedPlacements | None = None) -> FleetHost:
    """A live host's planning view: its snapshot (with `store`, the placements recorded but
    not yet defined too), its allocation knobs and admission's scorers."""
    return fleet_host(take_snapshot(host, store, listing=True), options, admission)


def fleet_host(snapshot: HostSnapshot, options: AllocationOptions, admission: Any = None) -> FleetHost:
    """The batch planner's view of a host snapshot."""
    return FleetHost(snapshot.host, snapshot.topology, snapshot.placements, snapshot.names,
                     dict(snapshot.profiles), options, admission, dict(snapshot.anti_affinity))
