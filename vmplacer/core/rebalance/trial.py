"""Measured trials: a layout is kept only when Freeze'nSense agrees it is better.

The rebalancer chooses layouts by the interference model's prediction, and a
prediction is only as good as the samples behind it. A trial asks the guests
themselves: after the moves, a probe measures each guest's share of its
isolated performance (ζ/ζb, time sharing included), and the host's measured
objective — the plan's own J = Σ w_v · (p_v − φ · max(0, 1 − p_v)²) over the
guests measured both times, per unit of weight — is compared with the one
measured before the moves:

* a **confirm** trial (moves the policy is sure of) is undone only when the
  measurement says they made things worse by more than `tolerance`;
* an **explore** trial (a layout the model prefers but cannot back, or the
  blind spread tried against the model's layout) stays only when the
  measurement says it is better by at least `min_gain`;
* a **close call** (measured within a margin of its bar) is measured once more
  and judged on both measurements, pooled.

Pure: measurements come in, a verdict goes out.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

TRIAL_KINDS = ("confirm", "explore")
CLOSE_CALL_NOTE = "a close call, measured twice"  # ends the verdict of a trial probed a second time
# A verdict's ruling: kept or undone on measurement, or unmeasured (nothing to compare: the kind decided).
RULINGS = ("kept", "undone", "unmeasured")
# Whether a verdict was a close call: no, measured twice, or rested on one probe when the second failed.
CLOSE_CALLS = ("no", "measured_twice", "second_probe_failed")


class TrialError(ValueError):
    """A trial's parameters or measurements that cannot be used; names the field."""


@dataclass(frozen=True)
class Measured:
    """What one profiling run saw on a host: each guest's measured share of its isolated
    performance (mean over its valid samples) and how many samples back it."""

    host: str
    performance: Mapping[str, float] = field(default_factory=dict)
    samples: Mapping[str, int] = field(default_factory=dict)
    message: str = ""

    def __post_init__(self) -> None:
        for guest, value in self.performance.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise TrialError(f"measurement of {self.host}: guest {guest!r}: performance must be a finite "
                                 f"number >= 0, got {value!r}")


def pooled(first: Measured | None, second: Measured) -> Measured:
    """Two measurements of the same layout as one: each guest's mean weighted by its samples."""
    if first is None:
        return second
    performance: dict[str, float] = {}
    samples: dict[str, int] = {}
    for guest in sorted(set(first.performance) | set(second.performance)):
        parts = [(m.performance[guest], max(1, int(m.samples.get(guest, 1)))) for m in (first, second)
                 if guest in m.performance]
        count = sum(n for _, n in parts)
        performance[guest] = sum(p * n for p, n in parts) / count
        samples[guest] = count
    return Measured(second.host, performance, samples, second.message)


def combined(host: str, parts: Iterable[Measured | None]) -> Measured | None:
    """Measurements of several hosts as one, so a trial of migrations judges its hosts together:
    a guest that moved counts with what it measured before on one host and after on the other.
    None when any host is unmeasured: a comparison missing one side of a move is no comparison."""
    performance: dict[str, float] = {}
    samples: dict[str, int] = {}
    for part in parts:
        if part is None:
            return None
        performance.update(part.performance)
        samples.update(part.samples)
    return Measured(host, performance, samples)


@dataclass(frozen=True)
class Verdict:
    """A trial's outcome: keep the new layout or go back, with the numbers that decided."""

    keep: bool
    before: float | None
    after: float | None
    delta: float | None
    guests: int
    text: str
    close_call: str = "no"  # one of CLOSE_CALLS, so counting close calls needs no parsing of `text`

    @property
    def ruling(self) -> str:
        """One of RULINGS. Unmeasured when nothing could be compared (or judged): then the trial's
        kind decided, so a kept or undone count means only what was measured."""
        if self.delta is None:
            return "unmeasured"
        return "kept" if self.keep else "undone"


def measured_objective(performance: Mapping[str, float], weights: Mapping[str, float], fairness: float,
                       guests: list[str]) -> float:
    """The plan's objective over `guests`, per unit of weight (a mean, so hosts of any size compare)."""
    total = sum(weights.get(g, 1.0) for g in guests)
    if total <= 0:
        raise TrialError("trial: the guests' weights must add up to more than 0")
    value = 0.0
    for g in guests:
        p = float(performance[g])
        short = max(0.0, 1.0 - p)
        value += weights.get(g, 1.0) * (p - fairness * short * short)
    return value / total


def judge(before: Measured | None, after: Measured | None, *, kind: str, weights: Mapping[str, float],
          fairness: float, min_gain: float, tolerance: float) -> Verdict:
    """Keep or undo the moves of one host, from its measurements before and after them.

    Without a measurement on either side nothing can be confirmed: a confirm trial keeps
    the moves (the policy was sure of them), an explore trial undoes them.
    """
    if kind not in TRIAL_KINDS:
        raise TrialError(f"trial: field 'kind' must be one of {', '.join(TRIAL_KINDS)}, got {kind!r}")
    common = sorted(set(before.performance if before else ()) & set(after.performance if after else ())
                    & set(weights))
    if before is None or after is None or not common:
        missing = "before the moves" if before is None or not before.performance else "after them"
        keep = kind == "confirm"
        return Verdict(keep, None, None, None, 0,
                       f"no measurement {missing}: {'kept as planned' if keep else 'undone, nothing backs it'}")
    value_before = measured_objective(before.performance, weights, fairness, common)
    value_after = measured_objective(after.performance, weights, fairness, common)
    delta = value_after - value_before
    if kind == "confirm":
        keep = delta >= -tolerance
        rule = (f"kept unless worse by more than {tolerance:g}" if tolerance >= 0
                else f"kept only if better by at least {-tolerance:g}, its host's last plan measured worse")
    else:
        keep = delta >= min_gain
        rule = f"kept only if better by at least {min_gain:g}"
    text = (f"measured {value_before:.3f} → {value_after:.3f} ({delta:+.3f} per guest, {len(common)} guests): "
            f"{'kept' if keep else 'undone'} ({kind}: {rule})")
    return Verdict(keep, value_before, value_after, delta, len(common), text)


def close_call(verdict: Verdict, *, kind: str, min_gain: float, tolerance: float, margin: float) -> bool:
    """Whether a verdict is too close to its bar to rest on one measurement: the measured change is
    within `margin` per guest of the bar (confirm: −tolerance; explore: min_gain). One probe's error
    is about 0.003 per guest, as large as the steps that are left to decide on a settled host, so
    such a call is measured again before the moves are kept or undone. 0 turns it off."""
    if margin <= 0 or verdict.delta is None:
        return False
    bar = -tolerance if kind == "confirm" else min_gain
    return abs(verdict.delta - bar) < margin


def layout_key(host: str, layout: Mapping[str, Mapping[int, frozenset[int]] | Mapping[int, list[int]]]) -> str:
    """A short stable name of a host's layout (guest → vCPU → pCPUs), to remember trials by."""
    canonical = {g: _canonical_pins(pins) for g, pins in sorted(layout.items())}
    text = json.dumps([host, canonical], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _canonical_pins(pins: Mapping[int, frozenset[int]] | Mapping[int, list[int]]) -> dict[str, list[int]]:
    """vCPU (as text) → its pCPUs in order. A guest of one vCPU (most of them) skips the sort:
    plans key every host's layout several times over."""
    if len(pins) == 1:
        ((vcpu, cpus),) = pins.items()
        int(vcpu)  # a vCPU that is no number is refused as the sort by number refuses it
        return {str(vcpu): sorted(map(int, cpus))}
    return {str(v): sorted(map(int, cpus)) for v, cpus in sorted(pins.items(), key=lambda kv: int(kv[0]))}


def hosts_key(hosts: Sequence[str], where: Mapping[str, tuple[str, Mapping[int, frozenset[int]]]]) -> str:
    """The layout key of hosts judged together (guest → (host, pins)): each guest named with its
    host, so a guest that moved makes another layout."""
    return layout_key("+".join(hosts), {f"{g}@{host}": pins for g, (host, pins) in where.items()})


@dataclass(frozen=True)
class TrialOutcome:
    """A finished trial: which layout it left (`from_key`), which it tried (`to_key`), kept or not."""

    kind: str
    from_key: str
    to_key: str
    kept: bool
    host: str = ""
    at: float = 0.0  # epoch seconds the trial's probe finished
    hosts: tuple[str, ...] = ()  # every host a joint trial measured (empty: `host` alone)

    @property
    def budget_hosts(self) -> tuple[str, ...]:
        """The hosts whose `trial_max` the trial counts against: all it measured."""
        return self.hosts or (self.host,)


def verdict_label(kept: bool) -> str:
    """The verdict a finished trial is counted under (/metrics): `kept` or `undone`; one place,
    so the database's count and the in-memory one cannot drift apart."""
    return "kept" if kept else "undone"


def trial_outcome(kind: str, state: str, parameters: Mapping[str, object], host: str = "",
                  at: float = 0.0) -> TrialOutcome | None:
    """The outcome of one stored plan action, if it is a finished trial probe."""
    trial = parameters.get("trial") if kind == "probe" else None
    if not isinstance(trial, Mapping) or state not in ("succeeded", "rolled_back"):
        return None
    from_key, to_key = trial.get("from_key"), trial.get("to_key")
    if not (isinstance(from_key, str) and isinstance(to_key, str) and from_key and to_key):
        return None
    joint = trial.get("hosts")
    hosts = tuple(h for h in joint if isinstance(h, str)) if isinstance(joint, (list, tuple)) else ()
    return TrialOutcome(str(trial.get("kind")), from_key, to_key, state == "succeeded", host, at, hosts)


@dataclass(frozen=True)
class Backoff:
    """A host whose last `streak` planned layouts in a row measured worse, so until `until` (epoch
    seconds) the policy plans no data-driven move there: it only tries a layout, kept if measured
    better."""

    host: str
    streak: int
    until: float

    def why(self, now: float) -> str:
        return (f"host {self.host}: its last {self.streak} planned layouts measured worse and were undone; "
                f"for {self.until - now:.0f} s more its layout is only tried, kept if measured better (back-off)")


def backoffs(outcomes: list[TrialOutcome], now: float, base_s: float, limit_s: float) -> dict[str, Backoff]:
    """Hosts in back-off now: after k confirm trials of a host in a row were undone, its next
    planned (data-driven) moves wait base_s · (2^(k-1) − 1) after the last (0, 1, 3, 7, … times
    base_s; at most `limit_s`); meanwhile a layout is only tried there, kept if measured better,
    within `trial_max`. Where the model is wrong about a host, each plan it makes there measures
    worse, so the timer would otherwise move and restore the same guests every run; this way the
    host keeps trying — the model learns from every trial's samples — but ever less often. A kept
    trial of either kind ends the streak; an undone explore trial neither ends nor extends it
    (trying the unknown is meant to fail often, and `trial_max` bounds it)."""
    if base_s <= 0:
        return {}
    streaks: dict[str, tuple[int, float]] = {}
    for outcome in sorted(outcomes, key=lambda o: o.at):
        count, _ = streaks.get(outcome.host, (0, 0.0))
        if outcome.kept:
            streaks[outcome.host] = (0, outcome.at)
        elif outcome.kind == "confirm":
            streaks[outcome.host] = (count + 1, outcome.at)
    held = {}
    for host, (count, last) in streaks.items():
        if count < 2:
            continue  # one layout measured worse: the next run may plan at once
        until = last + min(limit_s, base_s * (2 ** min(count - 1, 40) - 1))
        if until > now:
            held[host] = Backoff(host, count, until)
    return held


def refuted_hosts(outcomes: list[TrialOutcome]) -> set[str]:
    """Hosts whose last confirm trial was undone: the model's last planned layout there measured
    worse, so the model is wrong about that host. A kept explore trial does not change that
    (what it tried was not the model's plan)."""
    refuted: dict[str, bool] = {}
    for outcome in sorted(outcomes, key=lambda o: o.at):
        if outcome.kind != "confirm":
            continue
        for host in outcome.budget_hosts:
            refuted[host] = not outcome.kept
    return {host for host, is_refuted in refuted.items() if is_refuted}
