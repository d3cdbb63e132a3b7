"""The `probe` sampler: an application metric the guest exposes, as a rate over the window.

Where the host has no counters and CPU share is not the performance that
matters (a web server's requests, a batch job's progress), the guest's own
number is the best ζ. A probe is one of:

- a command (argv list, run without a shell) printing a number;
- an HTTP(S) URL whose body is a number;
- a file the guest writes through its serial console, whose last line
  matching a regular expression holds a counter (group `value`) and
  optionally the guest's timestamp for it (group `time`).

Counters (the default) give ζ = Δvalue / Δtime; gauges give the value read
at the end of the window. A probe's own resolution bounds the window: a
console line printed every 250 ms cannot measure a 10 ms window, and such
samples come back invalid ("no new reading") instead of as zeros.
"""

from __future__ import annotations

import math
import re
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vmplacer.ports import Sample

# The progress line vmplacer's test guest prints: "VMPLACER-PROGRESS <seq> <uptime-s> <work>".
PROGRESS_LINE = r"VMPLACER-PROGRESS\s+\d+\s+(?P<time>\d+(?:\.\d+)?)\s+(?P<value>\d+)"
TAIL_BYTES = 8192


class ProbeError(RuntimeError):
    """The probe could not produce a number; the message says which probe and why."""


@dataclass(frozen=True)
class ProbeReading:
    value: float
    at: float  # seconds on the probe's own clock (the host's monotonic clock unless the probe has one)


class ProbeSource(Protocol):
    def read(self) -> ProbeReading: ...


def _number(text: str, what: str) -> float:
    try:
        value = float(text.strip().split()[0])
    except (ValueError, IndexError):
        raise ProbeError(f"{what}: not a number: {text.strip()[:80]!r}") from None
    if not math.isfinite(value):
        raise ProbeError(f"{what}: not a finite number: {value}")
    return value


@dataclass(frozen=True)
class CommandProbe:
    argv: tuple[str, ...]
    timeout_s: float = 2.0
    clock: Callable[[], float] = time.monotonic

    def read(self) -> ProbeReading:
        what = f"probe command {list(self.argv)}"
        try:
            done = subprocess.run(list(self.argv), capture_output=True, text=True, timeout=self.timeout_s,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ProbeError(f"{what}: {exc}") from None
        if done.returncode != 0:
            raise ProbeError(f"{what}: exit status {done.returncode}: {done.stderr.strip()[:200]}")
        return ProbeReading(_number(done.stdout, what), self.clock())


@dataclass(frozen=True)
class HttpProbe:
    url: str
    timeout_s: float = 2.0
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"probe URL must be http:// or https://, got {self.url!r}")

    def read(self) -> ProbeReading:
        what = f"probe URL {self.url}"
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:  # noqa: S310 - scheme checked
                body = response.read(4096).decode("utf-8", errors="replace")
        except OSError as exc:
            raise ProbeError(f"{what}: {exc}") from None
        return ProbeReading(_number(body, what), self.clock())


@dataclass(frozen=True)
class ConsoleCounterProbe:
    """The last line of a console log file matching `pattern` (groups `value`, optional `time`)."""

    path: Path
    pattern: str = PROGRESS_LINE
    clock: Callable[[], float] = time.monotonic

    def read(self) -> ProbeReading:
        what = f"probe console {self.path}"
        regex = re.compile(self.pattern)
        try:
            with Path(self.path).open("rb") as handle:
                handle.seek(0, 2)
                size = handle.tell()
                handle.seek(max(0, size - TAIL_BYTES))
                tail = handle.read().decode("utf-8", errors="replace")
        except OSError as exc:
            raise ProbeError(f"{what}: {exc}") from None
        for line in reversed(tail.splitlines()):
            match = regex.search(line)
            if match:
                value = _number(match.group("value"), what)
                stamp = match.groupdict().get("time")
                return ProbeReading(value, _number(stamp, what) if stamp else self.clock())
        raise ProbeError(f"{what}: no line matches {self.pattern!r}")


@dataclass(frozen=True)
class _Token:
    domains: tuple[str, ...]
    readings: dict[str, ProbeReading | str]  # a reading, or why there is none
    started: float


class ProbeSampler:
    """ζ from per-domain probes; `kind` "counter" (rate) or "gauge" (value at the end)."""

    metric = "probe"

    def __init__(self, sources: Mapping[str, ProbeSource], kind: str = "counter",
                 clock: Callable[[], float] = time.monotonic):
        if kind not in ("counter", "gauge"):
            raise ValueError(f"probe kind must be counter or gauge, got {kind!r}")
        self.sources = dict(sources)
        self.kind = kind
        self.clock = clock
        self.dropped: Counter[str] = Counter()

    def _read_all(self, domains: Sequence[str]) -> dict[str, ProbeReading | str]:
        readings: dict[str, ProbeReading | str] = {}
        for name in domains:
            source = self.sources.get(name)
            if source is None:
                readings[name] = "no probe: none configured for this domain"
                continue
            try:
                readings[name] = source.read()
            except ProbeError as exc:
                readings[name] = f"probe failed: {exc}"
        return readings

    def begin(self, domains: list[str]) -> object:
        return _Token(tuple(domains), self._read_all(domains), self.clock())

    def end(self, token: object) -> dict[str, Sample]:
        assert isinstance(token, _Token), "end() takes the token begin() returned"
        after = self._read_all(token.domains)
        window = self.clock() - token.started
        samples = {}
        for name in token.domains:
            sample = self._sample(name, token.readings[name], after[name], window)
            if not sample.valid:
                self.dropped[sample.reason.split(":")[0]] += 1
            samples[name] = sample
        return samples

    def _sample(self, name: str, before: ProbeReading | str, after: ProbeReading | str,
                window: float) -> Sample:
        def invalid(reason: str) -> Sample:
            return Sample(name, self.metric, 0.0, window, valid=False, reason=reason)

        for reading in (before, after):
            if isinstance(reading, str):
                return invalid(reading)
        assert isinstance(before, ProbeReading) and isinstance(after, ProbeReading)
        if self.kind == "gauge":
            if after.value < 0:
                return invalid(f"outside physical bounds: gauge {after.value} < 0")
            return Sample(name, self.metric, after.value, window)
        elapsed = after.at - before.at
        if elapsed <= 0:
            return invalid(f"no new reading: the probe did not update within {window * 1e3:.1f} ms")
        delta = after.value - before.value
        if delta < 0:
            return invalid(f"counter reset: went back by {-delta:g}")
        return Sample(name, self.metric, delta / elapsed, elapsed)
