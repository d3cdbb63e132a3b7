"""Short-lived snapshots of each host for dry runs.

A dry-run placement takes the host's snapshot (app/observe/host_snapshot.py: its
topology, its domains with their pinning, parsed from XML, and the placements
recorded in the database) through the same `take_snapshot` as every other
path, from a `CachedHost` view and a `SnapshotStore`: this module caches the
three parts it reads (the recorded placements and their guests' refusals are one
read of the store, one version query).

Reading all of that costs ~10 ms on a real libvirtd plus a database round
trip, which would cap dry runs at a few dozen per second, so bursts share a
snapshot: the topology is kept for TOPOLOGY_TTL_S, the domains' placements and
labels for DOMAINS_TTL_S, the recorded placements for RECORDED_TTL_S. When a domain list
is due, one request refreshes it while the others go on with the previous
one (never older than twice its TTL), so a refresh never stalls a burst. In
`vmplacer serve` a background thread (`keep_fresh`) does the refreshing for the
whole fleet, and `changes()` counts the refreshes that read something new: host
choice among a thousand hosts then ranks a remembered fleet (app/place/fleet_placement.py,
`SurveyMemo`) instead of reading a few dozen domain lists per request. The
refresher reads what placing reads, the way a real placement reads it
(`labelled_placements`: one listing per host, and the XML only of domains whose
libvirt events say they changed), not the full listing with each domain's state
and sizes (three calls a domain): that one is read only when asked for (the web
view's guest list), so keeping a fleet fresh costs a call per host.

Only dry runs read snapshots. Placements that change a host read everything
live and claim their pCPUs in the database (the unique key that makes double
booking impossible), and every write through this instance drops the host's
snapshot. So a dry run may lag behind by at most DOMAINS_TTL_S for domains
created outside vmplacer, and RECORDED_TTL_S for placements made by another
instance; a real placement never does. The hosts in maintenance are read the
same way for dry runs (MAINTENANCE_TTL_S; maintenance changed through this
instance drops it at once): a database query per dry run cost a quarter of its
time and serialised on SQLite under load.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vmplacer.app.observe.host_snapshot import floating
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import HostTopology
from vmplacer.ports import DomainInfo

TOPOLOGY_TTL_S = 60.0
DOMAINS_TTL_S = 2.0
RECORDED_TTL_S = 1.0
MAINTENANCE_TTL_S = 1.0

Records = tuple[list[Placement], dict[str, tuple[str, ...]]]  # placements, guest -> refused guests


@dataclass
class _Cached:
    """One cached value with its age; `refreshing` marks a refresh in flight."""

    value: Any = None
    at: float = -float("inf")
    generation: int = 0
    refreshing: bool = False


@dataclass
class _Entry:
    lock: threading.Lock = field(default_factory=threading.Lock)
    topology: _Cached = field(default_factory=_Cached)
    domains: _Cached = field(default_factory=_Cached)
    placements: _Cached = field(default_factory=_Cached)  # labelled placements: what placing reads
    records: _Cached = field(default_factory=_Cached)  # (placements, refusals)


NO_RECORDS: Records = ([], {})


class HostSnapshots:
    def __init__(self, hosts: Callable[[str], Any], records: Callable[[str], Records], *,
                 topology_ttl_s: float = TOPOLOGY_TTL_S, domains_ttl_s: float = DOMAINS_TTL_S,
                 recorded_ttl_s: float = RECORDED_TTL_S, clock: Callable[[], float] = time.monotonic,
                 every_host_records: Callable[[], dict[str, Records]] | None = None):
        """`records` reads the store once for a host's recorded placements and the recorded
        guests' refusals (`PlacementStore.occupied_and_refusals`); `every_host_records`, when
        given, reads them for every host at once: a fleet's hosts then cost one read per
        `recorded_ttl_s`, not one each."""
        self._hosts = hosts
        self._records = records
        self._fleet_records = (TimedValue(every_host_records, recorded_ttl_s, clock, on_change=self._changed)
                               if every_host_records is not None else None)
        self.ttl = {"topology": topology_ttl_s, "domains": domains_ttl_s, "placements": domains_ttl_s,
                    "records": recorded_ttl_s}
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._guard = threading.Lock()
        self._changes = 0  # bumped whenever any host's cached value changes or is dropped
        # With a refresher running (keep_fresh), requests leave the refreshing to it: they read
        # what is cached up to this many TTLs old (a refresher that fell behind), then read themselves.
        self._request_ttl_factor = 1.0

    def _entry(self, name: str) -> _Entry:
        entry = self._entries.get(name)  # the usual case: no lock (a dict read is atomic)
        if entry is None:
            with self._guard:
                entry = self._entries.setdefault(name, _Entry())
        return entry

    def changes(self) -> int:
        """A number that changes whenever any host's snapshot may have (a refresh that read
        something new, a write's invalidation): equal numbers mean equal snapshots, so whatever
        was computed from every host's snapshot still holds (the fleet survey's memo)."""
        if self._fleet_records is not None:
            self._fleet_records.get()  # due for a refresh: one read, a change counted
        return self._changes

    def _changed(self) -> None:
        with self._guard:
            self._changes += 1

    def _get(self, name: str, what: str, load: Callable[[], Any], *, refreshing: bool = False) -> Any:
        entry = self._entry(name)
        cached: _Cached = getattr(entry, what)
        kept_fresh = what in ("topology", "placements")  # what the refresher keeps (keep_fresh)
        ttl = self.ttl[what] * (self._request_ttl_factor if kept_fresh and not refreshing else 1.0)
        value, at = cached.value, cached.at  # fresh: served without the lock (host choice reads
        if value is not None and self._clock() - at < ttl:  # every host's cache on each request)
            return value
        with entry.lock:
            age = self._clock() - cached.at
            if cached.value is not None and (age < ttl or (cached.refreshing and age < 2 * ttl)):
                return cached.value  # fresh, or someone is refreshing a still usable one
            cached.refreshing = True
            generation = cached.generation
        try:
            value = load()
        finally:
            with entry.lock:
                cached.refreshing = False
        with entry.lock:
            if generation == cached.generation:  # not invalidated by a write meanwhile
                if cached.value is not None and cached.value == value:
                    value = cached.value  # unchanged: the same object, so what was computed from it is found again
                changed = value is not cached.value
                cached.value, cached.at = value, self._clock()
            else:
                changed = False
        if changed:
            self._changed()
        return value

    def keep_fresh(self, names: Callable[[], list[str]], stop: threading.Event) -> None:
        """Refresh every host's topology and domains as they come due, in the calling thread,
        until `stop` is set: requests then read what is cached instead of refreshing a share
        of the fleet each (host choice among a thousand hosts would otherwise re-read a few
        dozen domain lists per request). A host that cannot be read is left to the requests,
        which report it."""
        self._request_ttl_factor = 4.0
        try:
            while not stop.is_set():
                started = self._clock()
                for name in names():
                    if stop.is_set():
                        return
                    for what, read in (("topology", lambda n: self._hosts(n).topology()),
                                       ("placements", lambda n: _labelled_placements(self._hosts(n)))):
                        try:
                            self._get(name, what, lambda: read(name), refreshing=True)
                        except Exception:  # noqa: BLE001 - unreadable now: the requests say so
                            break
                stop.wait(max(0.05, self.ttl["domains"] / 2 - (self._clock() - started)))
        finally:
            self._request_ttl_factor = 1.0

    def topology(self, name: str) -> HostTopology:
        return self._get(name, "topology", lambda: self._hosts(name).topology())

    def domains(self, name: str) -> list[DomainInfo]:
        return self._get(name, "domains", lambda: self._hosts(name).domains())

    def labelled_placements(self, name: str) -> dict[str, tuple[Placement, dict[str, str]]]:
        """Each domain's placement and labels: what placing reads. A host that offers it reads
        only the domains libvirt's events say changed, so the refresher keeps a fleet's hosts
        fresh with one listing each, not three calls per domain as `domains` makes."""
        return self._get(name, "placements", lambda: _labelled_placements(self._hosts(name)))

    def records(self, name: str) -> Records:
        if self._fleet_records is not None:
            return self._fleet_records.get().get(name, NO_RECORDS)
        return self._get(name, "records", lambda: self._records(name))

    def recorded(self, name: str) -> list[Placement]:
        return self.records(name)[0]

    def anti_affinity(self, name: str) -> dict[str, tuple[str, ...]]:
        return self.records(name)[1]

    def invalidate(self, name: str) -> None:
        """Forget what a write changes (domains, recorded placements); the topology stays."""
        entry = self._entry(name)
        with entry.lock:
            for cached in (entry.domains, entry.placements, entry.records):
                cached.generation += 1
                cached.value = None
        if self._fleet_records is not None:
            self._fleet_records.invalidate()
        self._changed()

    def view(self, name: str) -> CachedHost:
        host = self._hosts(name)
        return CachedHost(host.name, host.uri, self)


@dataclass(frozen=True)
class CachedHost:
    """The read side of a host, served from the cache (what `take_snapshot` reads)."""

    name: str
    uri: str
    snapshots: HostSnapshots

    def topology(self) -> HostTopology:
        return self.snapshots.topology(self.name)

    def domains(self) -> list[DomainInfo]:
        return self.snapshots.domains(self.name)

    def labelled_placements(self) -> dict[str, tuple[Placement, dict[str, str]]]:
        return self.snapshots.labelled_placements(self.name)


def _labelled_placements(host: Any) -> dict[str, tuple[Placement, dict[str, str]]]:
    """`labelled_placements` of a host, or built from its domain listing when it offers none
    (as `take_snapshot` reads it: a domain without a readable placement floats)."""
    read = getattr(host, "labelled_placements", None)
    if read is not None:
        return read()
    return {d.name: (floating(d, host.name), dict(d.labels)) for d in host.domains()}


class SnapshotStore:
    """The one `PlacementStore` read a dry run makes (`occupied`), from the cache."""

    def __init__(self, snapshots: HostSnapshots):
        self.snapshots = snapshots

    def occupied(self, host: str) -> list[Placement]:
        return self.snapshots.recorded(host)

    def occupied_and_refusals(self, host: str) -> Records:
        return self.snapshots.records(host)


class TimedValue:
    """One value read at most once per `ttl_s` (concurrent readers of a stale value wait
    for one read), dropped by `invalidate`."""

    def __init__(self, load: Callable[[], Any], ttl_s: float, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[], None] | None = None):
        """`on_change` is called after a read that found something new (an equal value read
        again stays the very same object)."""
        self._load = load
        self._ttl = ttl_s
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self._value: Any = None
        self._at = -float("inf")
        self._generation = 0

    def get(self) -> Any:
        value, at = self._value, self._at
        if value is not None and self._clock() - at < self._ttl:
            return value
        with self._lock:
            if self._value is not None and self._clock() - self._at < self._ttl:
                return self._value
            generation = self._generation
            value = self._load()
            if generation == self._generation:
                if self._value is not None and self._value == value:
                    value = self._value
                changed = value is not self._value
                self._value, self._at = value, self._clock()
                if changed and self._on_change is not None:
                    self._on_change()
            return value

    def invalidate(self) -> None:
        self._generation += 1
        self._value = None
