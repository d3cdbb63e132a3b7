"""Observe a host: the one read every planning path starts from.

Placing a guest (dry run or real), the fleet's batch plan, the rebalancer and the
API's short-lived cache all see a host the same way: its topology, its domains
(each one's placement; a domain read without pinning floats over the whole host
with its vCPUs and memory), what admission knows of each guest (its labels) and,
when asked, the placements recorded in the store but not (yet) defined in libvirt.
`take_snapshot` is the only code that reads them from a host, so every path plans
on the same picture and pays for the same reads: one topology read and one domain
read per snapshot.

Reconciling reads no snapshot: it compares the store's records (state, UUID, age)
with libvirt's domain listing, and needs no topology.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from vmplacer.app.place.admission import profiles_of
from vmplacer.core.placement.interference_scorer import GuestProfile, profile_from_labels
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import HostTopology
from vmplacer.ports import DomainInfo


class ObservedHost(Protocol):
    """What a snapshot reads of a host (a `Hypervisor`, a `PlacingHost`, a cached view)."""

    name: str

    def topology(self) -> HostTopology: ...
    def domains(self) -> list[DomainInfo]: ...


class RecordedPlacements(Protocol):
    """The store's side of a snapshot: placements recorded on a host (claims included)."""

    def occupied(self, host: str) -> list[Placement]: ...
    def occupied_and_refusals(self, host: str) -> tuple[list[Placement], dict[str, tuple[str, ...]]]: ...


@dataclass(frozen=True)
class HostSnapshot:
    """A host as planning sees it at one moment."""

    host: str
    topology: HostTopology
    live: Mapping[str, Placement]  # each defined domain's placement by name, in the order libvirt listed them
    profiles: Mapping[str, GuestProfile]  # what admission knows of each domain's guest (its labels)
    domains: tuple[DomainInfo, ...] | None = None  # the full listing (states, UUIDs), when asked for
    recorded: tuple[Placement, ...] = ()  # recorded in the store, not (yet) defined in libvirt
    # guests that refuse neighbours, by their records and by their domains' XML metadata:
    # guest -> refused guests (binds both ways)
    anti_affinity: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def placements(self) -> list[Placement]:
        """Everything that occupies the host: its domains, then the placements only recorded."""
        return [*self.live.values(), *self.recorded]

    @property
    def names(self) -> frozenset[str]:
        """The guest names in use on the host (domains and recorded guests)."""
        return frozenset(self.live) | {p.guest for p in self.recorded}

    def with_recorded(self, recorded: Iterable[Placement],
                      anti_affinity: Mapping[str, tuple[str, ...]] | None = None) -> HostSnapshot:
        """This snapshot plus the recorded placements libvirt does not show (a domain's own
        view wins over its record; the first record of a guest wins over later ones), and
        the recorded guests' anti-affinity (joined with what their domains declare)."""
        seen = set(self.live) | {p.guest for p in self.recorded}
        kept = list(self.recorded)
        for placement in recorded:
            if placement.guest not in seen:
                seen.add(placement.guest)
                kept.append(placement)
        return replace(self, recorded=tuple(kept), anti_affinity=joined_refusals(self.anti_affinity, anti_affinity))


def joined_refusals(*sources: Mapping[str, tuple[str, ...]] | None) -> dict[str, tuple[str, ...]]:
    """Every guest's refusals from every source, each peer once: a rule a record or a domain
    states binds, whichever of them is missing."""
    joined: dict[str, tuple[str, ...]] = {}
    for source in sources:
        for guest, peers in (source or {}).items():
            joined[guest] = tuple(dict.fromkeys((*joined.get(guest, ()), *peers)))
    return {guest: peers for guest, peers in joined.items() if peers}


def declared_refusals(placements: Iterable[Placement]) -> dict[str, tuple[str, ...]]:
    """The anti-affinity the domains' XML metadata declares (`Placement.anti_affinity`)."""
    return {p.guest: p.anti_affinity for p in placements if p.anti_affinity}


def floating(domain: DomainInfo, host: str) -> Placement:
    """A domain's placement; one read without pinning floats anywhere with its vCPUs and memory."""
    if domain.placement is not None:
        return domain.placement
    return Placement(guest=domain.name, host=host, vcpupin={v: frozenset() for v in range(domain.vcpus)},
                     memory_kib=domain.memory_kib)


def take_snapshot(host: ObservedHost, store: RecordedPlacements | None = None, *,
                  listing: bool = False) -> HostSnapshot:
    """Read `host` once: its topology, then its domains (and, with `store`, the placements
    recorded there and not defined). `listing` keeps libvirt's full domain listing (states,
    UUIDs: the rebalancer's need); without it a host that offers the cheaper read of
    placements and labels alone (`labelled_placements`, one call per domain) is read so."""
    topology = host.topology()
    labelled = None if listing else getattr(host, "labelled_placements", None)
    if labelled is not None:
        read = labelled()
        live = {name: p for name, (p, _) in read.items()}
        snapshot = HostSnapshot(host.name, topology, live,
                                {name: profile_from_labels(name, labels) for name, (_, labels) in read.items()},
                                anti_affinity=declared_refusals(live.values()))
    else:
        listed = host.domains()
        live = {d.name: floating(d, host.name) for d in listed}
        snapshot = HostSnapshot(host.name, topology, live, profiles_of(listed), tuple(listed),
                                anti_affinity=declared_refusals(live.values()))
    if store is None:
        return snapshot
    return snapshot.with_recorded(*store.occupied_and_refusals(host.name))
