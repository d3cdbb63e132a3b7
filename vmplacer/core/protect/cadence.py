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
  the window is back within budget. While the loop has run less than a
  window, the window's earlier part froze nobody, yet a share "of the last
  300 s" read over a 20-s-old loop would be 15 times the budget: so until a
  window has passed, the spend is held to `max_share × time running` plus a
  named `startup_allowance_s` (by default one window's budget: settling after
  a start takes measurements at the fast pace), and reports say so.
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
    # frozen seconds allowed beyond budget × time running until a window has passed (None: one window's
    # budget — the first rounds may measure at the fast pace, which settling after a start needs)
    startup_allowance_s: float | None = None
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
            ("startup_allowance_s", self.startup_allowance_s is None
             or 0.0 <= self.startup_allowance_s <= self.budget * self.window_s + 1e-9, "0..budget × window_s s"),
            ("smooth_k", 1 <= self.smooth_k <= 20, "1..20"),
        )
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"protect: field {name!r} must be {rule}, got {getattr(self, name)!r}")

    @property
    def allowance_s(self) -> float:
        """`startup_allowance_s`, resolved."""
        return self.budget * self.window_s if self.startup_allowance_s is None else self.startup_allowance_s


class FreezeBudget:
    """Frozen seconds over a sliding window: what may still be spent, and when. Once `start`ed,
    the spend until a window has passed is also held to `max_share` of the time since plus
    `startup_allowance_s`."""

    def __init__(self, max_share: float, window_s: float, startup_allowance_s: float = 0.0):
        if not 0.0 < max_share <= 1.0 or window_s <= 0 or startup_allowance_s < 0:
            raise ValueError(f"freeze budget: need 0 < max_share <= 1, window_s > 0 and startup_allowance_s >= 0, "
                             f"got {max_share}, {window_s}, {startup_allowance_s}")
        self.max_share = max_share
        self.window_s = window_s
        self.startup_allowance_s = startup_allowance_s
        self.since: float | None = None  # when the loop started (None: no start-up rule)
        self._spent: deque[tuple[float, float]] = deque()  # (round end, frozen seconds)

    @property
    def limit_s(self) -> float:
        return self.max_share * self.window_s

    def start(self, at: float) -> None:
        """The loop starts at `at` (the first call counts)."""
        if self.since is None:
            self.since = at

    def starting(self, now: float) -> bool:
        """Less than a window since the start: the start-up rule applies."""
        return self.since is not None and now - self.since < self.window_s

    def limit_at(self, t: float) -> float:
        """The most frozen seconds the window ending at `t` may hold."""
        if self.since is None or t - self.since >= self.window_s:
            return self.limit_s
        return min(self.limit_s, self.max_share * max(t - self.since, 0.0) + self.startup_allowance_s)

    def record(self, at: float, frozen_s: float) -> None:
        """A round that ended at `at` froze neighbours for `frozen_s` (counted until at + window)."""
        if frozen_s > 0:
            self._spent.append((at, frozen_s))

    def spent(self, now: float) -> float:
        while self._spent and self._spent[0][0] <= now - self.window_s:
            self._spent.popleft()
        return sum(frozen for _, frozen in self._spent)

    def _spent_at(self, t: float) -> float:
        """`spent` at a later time `t`, forgetting nothing (earlier times may still be asked)."""
        return sum(frozen for at, frozen in self._spent if at > t - self.window_s)

    def _fits(self, t: float, expected_s: float) -> bool:
        # the round ends no earlier than `expected_s` after it starts: its window is judged there
        return self._spent_at(t) + expected_s <= self.limit_at(t + expected_s) + 1e-12

    def allows(self, now: float, expected_s: float) -> bool:
        self.spent(now)
        return self._fits(now, expected_s)

    def ready_at(self, now: float, expected_s: float) -> float:
        """The earliest time a round expected to freeze `expected_s` fits (now when it fits now;
        infinity when it never fits: more than the whole window's budget). What is spent only
        falls and what is allowed only grows with time, so the first time that fits is found by
        stepping from one change to the next."""
        if expected_s > self.limit_s:
            return float("inf")
        self.spent(now)
        t = now
        for _ in range(len(self._spent) + 3):
            if self._fits(t, expected_s):
                return t
            later = [at + self.window_s for at, _ in self._spent if at + self.window_s > t]
            if self.starting(t) and self.limit_at(t + expected_s) < self.limit_s:
                # the start-up rule binds: fits once budget × time running covers what is asked
                assert self.since is not None
                grows = (self._spent_at(t) + expected_s - self.startup_allowance_s) / self.max_share - expected_s
                if self.since + grows > t:
                    later.append(self.since + grows)
                later.append(self.since + self.window_s)
            t = min(later, default=float("inf"))
        return t

    def span(self, now: float, since: float) -> float:
        """The time the reported share is over: the window, or the time since `since` while shorter."""
        return min(self.window_s, now - since)

    def share(self, now: float, since: float) -> float:
        """Frozen share of wall time over the window (over the time since `since` while shorter)."""
        span = self.span(now, since)
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
