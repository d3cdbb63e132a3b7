"""Seconds spent per named stage of a computation, on a clock the caller supplies.

The core keeps no clock of its own: a planner that is asked where its time goes
gets a `StageTimes(time.perf_counter)` from the application layer, and
`NO_STAGE_TIMES` (which measures nothing) otherwise, so timing never changes a
decision or a stored result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class StageTimes:
    """Accumulated seconds per stage (a stage entered twice adds up)."""

    clock: Callable[[], float] | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self.clock is None:
            yield
            return
        began = self.clock()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + (self.clock() - began)

    def rounded(self, digits: int = 3) -> dict[str, float]:
        return {name: round(value, digits) for name, value in self.seconds.items()}


NO_STAGE_TIMES = StageTimes()
