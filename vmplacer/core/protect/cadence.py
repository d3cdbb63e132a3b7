"""How often the protection loop measures, and how much freezing it may cost.

Freeze'nSense freezes a protected guest's neighbours to read its isolated
rate, so every measurement costs co-runners CPU time. Three pieces keep that
cost bounded while the floor is still watched closely when it matters:

* `FreezeBudget` — frozen seconds within any sliding window of `window_s`
  never exceed `max_share × window_s`: a measurement starts only when the
  window's spend plus what the round is expected to freeze fits. The bound
  holds by construction as long as a round freezes no longer than expected
  (the estimate is the longest frozen time per sample seen lately, at least
  the window `t_m`); a round that overran delays the following ones until
  the window is back within budget.
* `Cadence` — sample often (short interval, full samples) while acting or
  near the floor, back off geometrically (longer interval, fewer samples)
  while every protected guest holds its floor with margin and nothing changed.
* `RatioSmoother` — decisions use the median ζ/ζb over the last `k` rounds
  since the guest's throttles last changed, not one noisy round.

Pure: times are passed in, nothing is read.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class CadenceSettings:
    fast_interval_s: float = 2.0  # between round starts while acting or near the floor
    slow_interval_s: float = 10.0  # the longest back-off (keeps idle/stop detection within 30 s)
    fast_samples: int = 5  # ζ and ζb samples per protected guest while acting or near the floor
    slow_samples: int = 2  # while holding with margin
    calm_rounds: int = 2  # rounds holding with margin and nothing changed before backing off
    near: float = 0.05  # a smoothed ratio below floor + release_margin + near counts as near the floor
    budget: float = 0.02  # the most frozen time per wall time over any window of window_s
    window_s: float = 300.0
    smooth_k: int = 3  # rounds the smoothed ratio is the median of
    steady_share: float = 0.5  # of the budget, what a loop that is not acting spends (the rest: bursts)

    def __post_init__(self) -> None:
        checks = (
            ("fast_interval_s", 0.2 <= self.fast_interval_s <= 3600, "0.2..3600 s"),
            ("slow_interval_s", self.fast_interval_s <= self.slow_interval_s <= 3600, "fast_interval_s..3600 s"),
            ("fast_samples", 1 <= self.fast_samples <= 100, "1..100"),
            ("slow_samples", 1 <= self.slow_samples <= self.fast_samples, "1..fast_samples"),
            ("calm_rounds", self.calm_rounds >= 1, "at least 1"),
            ("near", 0.0 <= self.near <= 0.5, "0..0.5"),
            ("steady_share", 0.0 < self.steady_share <= 1.0, "in (0, 1]"),
            ("budget", 0.0 < self.budget <= 1.0, "in (0, 1]"),
            ("window_s", 10.0 <= self.window_s <= 86_400.0, "10..86400 s"),
            ("smooth_k", 1 <= self.smooth_k <= 20, "1..20"),
        )
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"protect: field {name!r} must be {rule}, got {getattr(self, name)!r}")


class FreezeBudget:
    """Frozen seconds over a sliding window: what may still be spent, and when."""

    def __init__(self, max_share: float, window_s: float):
        if not 0.0 < max_share <= 1.0 or window_s <= 0:
            raise ValueError(f"freeze budget: need 0 < max_share <= 1 and window_s > 0, got {max_share}, {window_s}")
        self.max_share = max_share
        self.window_s = window_s
        self._spent: deque[tuple[float, float]] = deque()  # (round end, frozen seconds)

    @property
    def limit_s(self) -> float:
        return self.max_share * self.window_s

    def record(self, at: float, frozen_s: float) -> None:
        """A round that ended at `at` froze neighbours for `frozen_s` (counted until at + window)."""
        if frozen_s > 0:
            self._spent.append((at, frozen_s))

    def spent(self, now: float) -> float:
        while self._spent and self._spent[0][0] <= now - self.window_s:
            self._spent.popleft()
        return sum(frozen for _, frozen in self._spent)

    def allows(self, now: float, expected_s: float) -> bool:
        return self.spent(now) + expected_s <= self.limit_s + 1e-12

    def ready_at(self, now: float, expected_s: float) -> float:
        """The earliest time a round expected to freeze `expected_s` fits (now when it fits now;
        infinity when it never fits: more than the whole window's budget)."""
        if expected_s > self.limit_s:
            return float("inf")
        total = self.spent(now)
        if total + expected_s <= self.limit_s + 1e-12:
            return now
        for at, frozen in self._spent:
            total -= frozen
            if total + expected_s <= self.limit_s + 1e-12:
                return at + self.window_s
        return now  # unreachable: the deque emptied, and expected fits alone

    def share(self, now: float, since: float) -> float:
        """Frozen share of wall time over the window (over the time since `since` while shorter)."""
        span = min(self.window_s, now - since)
        return self.spent(now) / span if span > 0 else 0.0


class RatioSmoother:
    """Per protected guest: the median ζ/ζb of the last `k` rounds since its throttles last changed."""

    def __init__(self, k: int = 3):
        self.k = k
        self._seen: dict[str, deque[float]] = {}

    def add(self, guest: str, ratio: float | None) -> float | None:
        """Add this round's ratio (None: not measured) and return the smoothed one (None: nothing yet)."""
        seen = self._seen.setdefault(guest, deque(maxlen=self.k))
        if ratio is not None:
            seen.append(ratio)
        return statistics.median(seen) if seen else None

    def reset(self, guests: Iterable[str]) -> None:
        """The throttles around these guests changed: older ratios describe another world."""
        for guest in guests:
            self._seen.pop(guest, None)

    def forget_except(self, guests: Iterable[str]) -> None:
        keep = set(guests)
        for guest in [g for g in self._seen if g not in keep]:
            del self._seen[guest]


@dataclass(frozen=True)
class Pace:
    """When the next round starts and how many samples it takes."""

    interval_s: float
    samples: int
    calm: int  # rounds in a row holding with margin, nothing changed
    reason: str
    urgent: bool = False  # just acted or no estimate yet: measure now, only the window's budget limits it


def next_pace(settings: CadenceSettings, *, acted: bool, margins: Iterable[float | None], calm: int,
              below: bool = False) -> Pace:
    """The next round's pace. `margins`: per protected guest that is measured and busy, its smoothed
    ζ/ζb minus (floor + release_margin); None when it has no estimate yet. `below`: a protected
    guest's smoothed ζ/ζb is under its floor (the freeze budget still bounds what that costs).

    Fast while acting, while a guest has no estimate or sits within `near` of floor + margin;
    otherwise the interval doubles per calm round (after `calm_rounds`) up to `slow_interval_s`.
    Only urgent rounds (acting, no estimate) take `fast_samples`; the others measure with
    `slow_samples`, at most as often as the steady pace allows (`steady_spacing_s`).
    """
    values = list(margins)
    if acted:
        return Pace(settings.fast_interval_s, settings.fast_samples, 0, "acted this round", urgent=True)
    if any(m is None for m in values):
        return Pace(settings.fast_interval_s, settings.fast_samples, 0, "a protected guest has no estimate yet",
                    urgent=True)
    if below:  # look again soon: one noisy round below must not stand for a whole steady spacing
        return Pace(settings.fast_interval_s, settings.fast_samples, 0, "a protected guest is below its floor",
                    urgent=True)
    if any(m < settings.near for m in values):  # type: ignore[operator]
        return Pace(settings.fast_interval_s, settings.slow_samples, 0, "near the floor")
    calm += 1
    if calm < settings.calm_rounds:
        return Pace(settings.fast_interval_s, settings.slow_samples, calm, "holding with margin")
    interval = min(settings.slow_interval_s, settings.fast_interval_s * 2 ** (calm - settings.calm_rounds + 1))
    return Pace(interval, settings.slow_samples, calm, "holding with margin: backing off")


def steady_spacing_s(settings: CadenceSettings, expected_s: float) -> float:
    """The least time between measurements of a loop that is not acting: spread evenly, they spend
    `steady_share` of the budget, so a window never starts empty after a burst and then starves
    (the rest of the budget stays for the rounds right after a throttle step)."""
    return expected_s / (settings.budget * settings.steady_share)


def expected_freeze_s(samples: int, guests: int, per_sample_s: float) -> float:
    """What a round is expected to freeze: one freeze of `per_sample_s` per ζb sample per guest."""
    return samples * guests * per_sample_s
