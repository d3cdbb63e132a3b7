"""The batch dry run for a request of many guests: which host each guest lands on, and why
each other host was refused.

The guests are placed hardest first on in-memory views of the candidate hosts (each
on the host where it scores best), with a bounded search for a better order when a
guest is left out (core/placement/batch.py). Nothing here reads a host or a database: callers
build the views (app/fleet_placement.observe_host from a host snapshot for live hosts, a capabilities
file for an offline one), so an offline plan stays light.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vmplacer.core.placement.allocate import allocate
from vmplacer.core.placement.batch import DEFAULT_BUDGET_S, DEFAULT_MAX_PASSES, BatchResult, Fitted, Refused, place_batch
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.fleet_index import DEFAULT_HOSTS_TO_SCORE, Demand, HostRoom, host_room, shortlist
from vmplacer.core.placement.nofit import NoFit, NoFitReason
from vmplacer.core.placement.occupancy import Occupancy, occupancy_after
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.admit import AllocationOptions, page_options
from vmplacer.core.topology.host import HostTopology


# ----- why a host was refused -------------------------------------------------------------------------
@dataclass(frozen=True)
class Refusal:
    """Why a host takes no guest (maintenance, unreadable) or not this one (no-fit, exists, ...)."""

    host: str
    kind: str  # maintenance | unreadable | no-fit | exists | xml-policy | invalid-xml
    message: str
    reasons: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "kind": self.kind, "message": self.message, "reasons": list(self.reasons)}


def exists_reason(guest: str, host: str) -> NoFitReason:
    return NoFitReason("name", f"host {host}", "a domain name not in use on the host",
                       f"a domain named {guest} exists", "libvirt would replace its definition")


def no_fit_refusal(exc: NoFit, host: str) -> Refusal:
    kind = "exists" if any(r.constraint == "name" for r in exc.reasons) else "no-fit"
    return Refusal(host, kind, "; ".join(str(r) for r in exc.reasons) or str(exc),
                   tuple(r.to_dict() for r in exc.reasons))


# ----- a request of many guests, as a batch (the CLI) -------------------------------------------------------
def host_classes(hosts: Sequence[FleetHost], *, shape_only: bool = False) -> list[int]:
    """Per host, the first host it cannot be told apart from when nothing is on either: the
    same topology but for its name, knobs and scorers. A host with guests, domains or records
    is its own class (its index), unless `shape_only` (then only how the hosts are built counts)."""
    classes: list[int] = []
    firsts: dict[tuple[Hashable, ...], list[tuple[HostTopology, int]]] = {}
    for at, host in enumerate(hosts):
        if not shape_only and (host.existing or host.domains or host.profiles or host.anti_affinity):
            classes.append(at)
            continue
        shape = replace(host.topology, name="")
        key = (len(shape.cpus), tuple(sorted(shape.nodes)), host.options, id(host.admission))
        same = firsts.setdefault(key, [])
        match = next((first for topology, first in same if topology == shape), None)
        if match is None:
            same.append((shape, at))
            match = at
        classes.append(match)
    return classes



@dataclass
class FleetHost:
    """A candidate host as planning sees it: topology, what occupies it, its knobs."""

    name: str
    topology: HostTopology
    existing: list[Placement] = field(default_factory=list)
    domains: frozenset[str] = frozenset()  # names in use on the host (domains and recorded guests)
    profiles: dict[str, Any] = field(default_factory=dict)  # what admission knows of the guests there
    options: AllocationOptions = field(default_factory=AllocationOptions)
    admission: Any = None  # scorers from the model; None: topology scorers only
    anti_affinity: dict[str, tuple[str, ...]] = field(default_factory=dict)  # guests there that refuse others


# Called before allocating (placement None: e.g. the guest's base XML) and after: a refusal
# there refuses the host for the guest.
Vet = Callable[[GuestSpec, FleetHost, "Placement | None"], "Refusal | None"]


@dataclass
class GuestPlan:
    """One guest of the request: where it goes (or not) and why each other host was refused."""

    index: int
    spec: GuestSpec
    host: str | None = None
    placement: Placement | None = None
    refusals: list[Refusal] = field(default_factory=list)
    ranking: list[tuple[str, float]] = field(default_factory=list)  # hosts it fitted in its turn, best first
    candidates: list[Placement] = field(default_factory=list)  # with `why`: every candidate on its host
    scorer: Any = None
    occupied: list[Placement] = field(default_factory=list)  # what was on its host before it


@dataclass
class FleetPlan:
    guests: list[GuestPlan]
    hosts: list[FleetHost]
    closed: list[Refusal]  # hosts that took no guest at all (maintenance, unreadable)
    placed_in_order: list[int]  # guest indices in the order they were placed
    passes: int = 1
    greedy_placed: int = 0

    def on_host(self, name: str) -> list[GuestPlan]:
        placed = [g for g in self.guests if g.host == name]
        order = {index: at for at, index in enumerate(self.placed_in_order)}
        return sorted(placed, key=lambda g: order[g.index])


class FleetPlanner:
    def __init__(self, *, budget_s: float = DEFAULT_BUDGET_S, max_passes: int = DEFAULT_MAX_PASSES,
                 clock: Callable[[], float] = time.process_time, hosts_to_score: int = DEFAULT_HOSTS_TO_SCORE):
        """The batch search stops after `budget_s` of CPU time (`clock`) or `max_passes`. With more
        than `hosts_to_score` hosts, each guest is allocated on that many of the hosts whose free
        room may take it, the most promising first (core/placement/fleet_index.py; 0: on every host)."""
        self.budget_s = budget_s
        self.max_passes = max_passes
        self.clock = clock
        self.hosts_to_score = hosts_to_score

    def plan(self, specs: Sequence[GuestSpec], hosts: Sequence[FleetHost], *, closed: Sequence[Refusal] = (),
             vet: Vet | None = None, why: bool = False, order: Sequence[int] | None = None) -> FleetPlan:
        """Place `specs` as a batch on `hosts` (nothing is written). `vet` may refuse a
        placement (e.g. the rendered XML breaks the host's policy): that host is refused for
        the guest. `order`: place in this order (indices) instead of hardest first."""
        hosts = list(hosts)
        self._memo: dict[tuple[int, str, tuple[int, ...]], Placement] = {}
        self._occupancies: dict[tuple[str, tuple[int, ...]], Occupancy] = {}

        def fit(guest: int, host_at: int, earlier: tuple[int, ...]) -> Fitted | Refused:
            return self._fit(specs, guest, hosts[host_at], earlier, vet, why)

        bounded = 0 < self.hosts_to_score < len(hosts)
        batch = place_batch(specs, len(hosts), fit, budget_s=self.budget_s, max_passes=self.max_passes,
                            clock=self.clock, order=order,
                            shortlist=self._shortlister(specs, hosts, vet) if bounded else None)
        return self._assemble(specs, hosts, list(closed), batch)

    def _fit(self, specs: Sequence[GuestSpec], guest: int, host: FleetHost, earlier: tuple[int, ...],
             vet: Vet | None, why: bool) -> Fitted | Refused:
        spec = specs[guest]
        if spec.name in host.domains:
            return Refused(no_fit_refusal(NoFit(spec.name, host.name, [exists_reason(spec.name, host.name)]),
                                          host.name))
        if vet is not None:
            refusal = vet(spec, host, None)
            if refusal is not None:
                return Refused(refusal)
        occupied = self._occupancy(specs, host, earlier, vet)
        profiles = dict(host.profiles)
        anti: dict[str, tuple[str, ...]] = dict(host.anti_affinity)
        for other in earlier:  # the batch's guests placed here before it (their placements are cached)
            anti[specs[other].name] = specs[other].anti_affinity
            if host.admission is not None:
                from vmplacer.core.placement.interference_scorer import profile_of_spec

                profiles[specs[other].name] = profile_of_spec(specs[other])
        scorer = host.admission.scorer(spec, profiles) if host.admission is not None else None
        candidates: list[Placement] = []
        try:
            placement = allocate(host.topology, spec, occupied, scorer=scorer, options=host.options,
                                 anti_affinity_of_others=anti, candidates=candidates if why else None)
        except NoFit as exc:
            return Refused(no_fit_refusal(exc, host.name))
        if vet is not None:
            refusal = vet(spec, host, placement)
            if refusal is not None:
                return Refused(refusal)
        return Fitted(placement.score, (placement, candidates, scorer, occupied))

    def _shortlister(self, specs: Sequence[GuestSpec], hosts: list[FleetHost], vet: Vet | None
                     ) -> Callable[[int, Sequence[tuple[int, ...]]], list[int]]:
        """The hosts worth allocating each guest on, from each host state's free room (computed
        once per state: after a guest lands, only its host's room is new); identical hosts with
        nothing on them are one candidate, the first of them."""
        classes = host_classes(hosts)
        shapes = host_classes(hosts, shape_only=True)
        rooms: dict[tuple[int, tuple[int, ...]], HostRoom] = {}
        demands: dict[tuple[int, int], Demand] = {}

        def room(at: int, held: tuple[int, ...]) -> HostRoom:
            key = (classes[at], held) if not held else (at, held)
            if key not in rooms:
                host = hosts[at]
                rooms[key] = host_room(host.topology, self._occupancy(specs, host, held, vet).usage(host.topology),
                                       host.options)
            return rooms[key]

        def pick(guest: int, held: Sequence[tuple[int, ...]]) -> list[int]:
            spec = specs[guest]
            seen: set[tuple[int, tuple[int, ...]]] = set()
            ranked = []
            for at, host in enumerate(hosts):
                key = (classes[at], held[at]) if not held[at] else (at, held[at])
                if key in seen or spec.name in host.domains:
                    continue
                seen.add(key)
                demand = demands.get((guest, shapes[at]))
                if demand is None:
                    demand = demands[(guest, shapes[at])] = Demand.of(spec, page_options(spec, host.topology))
                judged = room(at, held[at]).rank_for(demand)  # kept per room: guests of a kind ask alike
                if judged is not None:
                    ranked.append((judged, at, shapes[at]))
            return shortlist(ranked, self.hosts_to_score)

        return pick

    def _occupancy(self, specs: Sequence[GuestSpec], host: FleetHost, earlier: tuple[int, ...],
                   vet: Vet | None) -> Occupancy:
        """What is on `host` once the batch's `earlier` guests were placed there: its usage is
        the one of `earlier[:-1]` plus the last guest's placement (never rebuilt over the host)."""
        key = (host.name, earlier)
        found = self._occupancies.get(key)
        if found is None:
            if earlier:
                parent = self._occupancy(specs, host, earlier[:-1], vet)
                last = self._placed(specs, earlier[-1], host, earlier[:-1], vet)
                found = occupancy_after(parent, host.topology, [*parent, last])
            else:
                found = Occupancy(host.existing)
            self._occupancies[key] = found
        return found

    def _placed(self, specs: Sequence[GuestSpec], guest: int, host: FleetHost, earlier: tuple[int, ...],
                vet: Vet | None) -> Placement:
        key = (guest, host.name, earlier)
        if key not in self._memo:
            answer = self._fit(specs, guest, host, earlier, vet, False)
            assert isinstance(answer, Fitted), "an earlier guest of the batch fitted in its turn"
            self._memo[key] = answer.payload[0]
        return self._memo[key]

    @staticmethod
    def _assemble(specs: Sequence[GuestSpec], hosts: list[FleetHost], closed: list[Refusal],
                  batch: BatchResult) -> FleetPlan:
        guests = [GuestPlan(i, spec) for i, spec in enumerate(specs)]
        for index, (host_at, fitted) in batch.placed.items():
            placement, candidates, scorer, occupied = fitted.payload
            guest = guests[index]
            guest.host, guest.placement = hosts[host_at].name, placement
            guest.candidates, guest.scorer, guest.occupied = candidates, scorer, occupied
        for index, refused in batch.refused.items():
            guests[index].refusals = [r.reason for _, r in sorted(refused.items())]
        for guest in guests:
            guest.refusals = list(closed) + guest.refusals
        return FleetPlan(guests, hosts, closed, [g for g in batch.order if g in batch.placed],
                         batch.passes, batch.greedy_placed)

    def explain_others(self, plan: FleetPlan, specs: Sequence[GuestSpec], vet: Vet | None = None) -> None:
        """For each placed guest, why the other hosts were not chosen: each one's answer
        for the guest next to what the batch put there before it (a lower score or a refusal)."""
        placed_before: dict[str, list[int]] = {h.name: [] for h in plan.hosts}
        for index in plan.placed_in_order:
            guest = plan.guests[index]
            scores: list[tuple[str, float]] = []
            for host in plan.hosts:
                answer = self._fit(specs, index, host, tuple(placed_before[host.name]), vet, False)
                if isinstance(answer, Fitted):
                    scores.append((host.name, answer.score))
                elif host.name != guest.host:
                    guest.refusals.append(answer.reason)
            guest.ranking = sorted(scores, key=lambda item: -item[1])
            placed_before[guest.host or ""].append(index)
