"""Samplers that compare two libvirt stats snapshots (cpu and ipc share this).

A sample is valid only when the domain ran the whole window under the same
run id and every counter moved forward within physical bounds; otherwise it
is returned with valid=False and the reason, so the profiler can drop and
count it (the seed's "performance sampling for VMs is ragged").
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from vmplacer.adapters.samplers.stats import DomainStats, StatsReader, StatsSnapshot
from vmplacer.ports import Sample

RUNNING = 1  # libvirt VIR_DOMAIN_RUNNING


@dataclass(frozen=True)
class Window:
    """The time between two snapshots and how uncertain it is (reads take time)."""

    seconds: float
    slack: float  # the counters may cover up to `seconds + slack`


@dataclass(frozen=True)
class _Token:
    domains: tuple[str, ...]
    before: StatsSnapshot


class CounterSampler:
    """Base: `begin` snapshots, `end` snapshots again and asks `measure` per domain."""

    metric = "counter"
    groups: tuple[str, ...] = ("state",)

    def __init__(self, reader: StatsReader):
        self.reader = reader
        self.dropped: Counter[str] = Counter()
        self._lock = threading.Lock()

    def begin(self, domains: list[str]) -> object:
        return _Token(tuple(domains), self.reader.read(domains))

    def end(self, token: object) -> dict[str, Sample]:
        assert isinstance(token, _Token), "end() takes the token begin() returned"
        after = self.reader.read(token.domains)
        window = Window(
            seconds=after.midpoint - token.before.midpoint,
            slack=token.before.uncertainty + after.uncertainty,
        )
        samples = {}
        for name in token.domains:
            sample = self._sample(name, token.before.domains.get(name), after.domains.get(name), window)
            if not sample.valid:
                with self._lock:
                    self.dropped[sample.reason.split(":")[0]] += 1
            samples[name] = sample
        return samples

    def _sample(self, name: str, before: DomainStats | None, after: DomainStats | None,
                window: Window) -> Sample:
        def invalid(reason: str) -> Sample:
            return Sample(name, self.metric, 0.0, window.seconds, valid=False, reason=reason)

        if before is None or after is None:
            return invalid("domain gone: not found at both ends of the window")
        if before.run_id != after.run_id:
            return invalid(f"domain restarted: run id {before.run_id} -> {after.run_id}")
        for snap in (before, after):
            if snap.values.get("state.state", RUNNING) != RUNNING:
                return invalid("not running: paused or stopped during the window")
        if window.seconds <= 0:
            return invalid(f"bad window: {window.seconds:.6f} s")
        try:
            value = self.measure(before.values, after.values, window)
        except RaggedSample as exc:
            return invalid(str(exc))
        return Sample(name, self.metric, value, window.seconds)

    def measure(self, before: dict, after: dict, window: Window) -> float:
        raise NotImplementedError


class RaggedSample(ValueError):
    """Counters that cannot be trusted for this window; the message starts with a short category."""


def counter_delta(before: dict, after: dict, key: str) -> float:
    if key not in before or key not in after:
        raise RaggedSample(f"missing counter: {key}")
    delta = float(after[key]) - float(before[key])
    if delta < 0:
        raise RaggedSample(f"counter reset: {key} went back by {-delta:.0f}")
    return delta


def vcpu_count(values: dict) -> int:
    return int(values.get("vcpu.current", values.get("vcpu.maximum", 1)) or 1)


def vcpu_indexes(before: dict, after: dict, suffix: str) -> Sequence[int]:
    """vCPU indexes reporting `vcpu.N.<suffix>` at both ends (hot-plug may change the set)."""
    found = []
    for key in before:
        if key.startswith("vcpu.") and key.endswith("." + suffix):
            index = key[5:-len(suffix) - 1]
            if index.isdigit() and key in after:
                found.append(int(index))
    return sorted(found)
