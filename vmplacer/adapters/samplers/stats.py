"""Reading libvirt domain statistics in one call, and replaying recorded ones.

Samplers take two snapshots and compare them. A snapshot holds, per domain,
the raw stats dict libvirt returns, the domain's run id (it changes when the
domain restarts, which resets every counter) and when the read started and
ended: a stats call takes about 1 ms per domain, so for windows of a few
milliseconds the time of the read itself must be accounted for.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import libvirt

# libvirt's stats groups, by the names recorded files use.
STATS_GROUPS = {
    "state": libvirt.VIR_DOMAIN_STATS_STATE,
    "cpu_total": libvirt.VIR_DOMAIN_STATS_CPU_TOTAL,
    "vcpu": libvirt.VIR_DOMAIN_STATS_VCPU,
    "perf": libvirt.VIR_DOMAIN_STATS_PERF,
}


@dataclass(frozen=True)
class DomainStats:
    name: str
    run_id: int  # libvirt domain id: a new one after every start
    values: dict[str, Any]


@dataclass(frozen=True)
class StatsSnapshot:
    domains: dict[str, DomainStats]
    started: float  # monotonic seconds when the read began
    finished: float  # ... and when it returned

    @property
    def midpoint(self) -> float:
        return (self.started + self.finished) / 2

    @property
    def uncertainty(self) -> float:
        """Half the read's duration: how far off the midpoint the counters may have been read."""
        return (self.finished - self.started) / 2


class StatsReader(Protocol):
    def read(self, names: Sequence[str]) -> StatsSnapshot: ...


class StatsReadError(RuntimeError):
    """The stats call itself failed (daemon gone, connection lost)."""


class LibvirtStatsReader:
    """One `domainListGetStats` call per snapshot for exactly the domains asked for.

    Domain handles are cached by name; a name that no longer resolves is just
    absent from the snapshot (the sampler reports it as gone).
    """

    def __init__(self, connection: Callable[[], libvirt.virConnect], groups: Sequence[str],
                 clock: Callable[[], float] = time.perf_counter):
        unknown = sorted(set(groups) - set(STATS_GROUPS))
        if unknown:
            raise ValueError(f"unknown libvirt stats groups {unknown} (known: {sorted(STATS_GROUPS)})")
        self._connection = connection
        self._flags = 0
        for group in groups:
            self._flags |= STATS_GROUPS[group]
        self._clock = clock
        self._handles: dict[str, libvirt.virDomain] = {}
        self._lock = threading.Lock()

    def _handles_for(self, names: Sequence[str]) -> list[libvirt.virDomain]:
        conn = self._connection()
        handles = []
        with self._lock:
            for name in names:
                dom = self._handles.get(name)
                if dom is None:
                    try:
                        dom = conn.lookupByName(name)
                    except libvirt.libvirtError:
                        continue  # gone: absent from the snapshot
                    self._handles[name] = dom
                handles.append(dom)
        return handles

    def _forget(self, names: Sequence[str]) -> None:
        with self._lock:
            for name in names:
                self._handles.pop(name, None)

    def read(self, names: Sequence[str]) -> StatsSnapshot:
        handles = self._handles_for(names)
        conn = self._connection()
        started = self._clock()
        try:
            records = conn.domainListGetStats(handles, self._flags) if handles else []
        except libvirt.libvirtError:
            # One of the cached domains vanished (or restarted under a new handle):
            # fall back to listing every active domain and keep the ones asked for.
            self._forget(names)
            started = self._clock()
            try:
                records = conn.getAllDomainStats(self._flags, libvirt.VIR_CONNECT_GET_ALL_DOMAINS_STATS_ACTIVE)
            except libvirt.libvirtError as exc:
                raise StatsReadError(f"domain stats: {exc.get_error_message()}") from None
        finished = self._clock()
        wanted = set(names)
        domains: dict[str, DomainStats] = {}
        for dom, values in records:
            name = dom.name()
            if name in wanted:
                domains[name] = DomainStats(name, dom.ID(), dict(values))
        missing = [n for n in names if n not in domains]
        if missing:
            # libvirt skips handles whose domain is gone; a domain re-created under the
            # same name has a new UUID and needs a new handle. Rare: one more call.
            self._forget(missing)
            retry = self._handles_for(missing)
            if retry:
                try:
                    for dom, values in conn.domainListGetStats(retry, self._flags):
                        domains[dom.name()] = DomainStats(dom.name(), dom.ID(), dict(values))
                except libvirt.libvirtError:
                    pass  # still gone: absent from the snapshot
                finished = self._clock()
        return StatsSnapshot(domains, started, finished)


@dataclass
class RecordedStatsReader:
    """Replays snapshots recorded from a real host (tests/data/libvirt_stats/*.json).

    File format: {"host": ..., "groups": [...], "frames": [{"started": s, "finished": s,
    "domains": {name: {"id": int, "stats": {...}}}}, ...]}. Each `read` returns
    the next frame restricted to the names asked for.
    """

    frames: list[dict[str, Any]]
    position: int = field(default=0)

    @classmethod
    def load(cls, path: str | Path) -> RecordedStatsReader:
        data = json.loads(Path(path).read_text())
        return cls(list(data["frames"]))

    def read(self, names: Sequence[str]) -> StatsSnapshot:
        if self.position >= len(self.frames):
            raise StatsReadError(f"recorded stats exhausted after {len(self.frames)} frames")
        frame = self.frames[self.position]
        self.position += 1
        wanted = set(names)
        domains = {
            name: DomainStats(name, int(entry["id"]), dict(entry["stats"]))
            for name, entry in frame["domains"].items()
            if name in wanted
        }
        return StatsSnapshot(domains, float(frame["started"]), float(frame["finished"]))


def record_frames(reader: StatsReader, names: Sequence[str], count: int, interval_s: float,
                  sleep: Callable[[float], None] = time.sleep) -> Iterator[dict[str, Any]]:
    """Snapshots from a live reader in the recorded-file frame format."""
    for _ in range(count):
        snap = reader.read(names)
        yield {
            "started": snap.started,
            "finished": snap.finished,
            "domains": {n: {"id": d.run_id, "stats": d.values} for n, d in snap.domains.items()},
        }
        sleep(interval_s)
