"""The profiler's gate on each guest's frozen share of the last hour (core/rebalance/frozen_share.py).

Before each freeze the profiler asks which of the guests it would pause have been frozen
`share` of the last hour already, counting the stored freezes of the host's other runs (every
process's, re-read every `refresh_s`) and this run's own, each as it really happened (the
freeze's measured span and the domains it paused). Those guests stay running; the run names
them with the seconds they had been frozen (`spared`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable

from vmplacer.core.rebalance.frozen_share import (
    HOUR_S,
    FreezeRecord,
    check_share,
    frozen_seconds,
    spared_guests,
)

# (host, since epoch s, the run to leave out) -> the stored freezes (SqlProfileStore.freezes_since)
FreezeHistory = Callable[[str, float, int | None], list[FreezeRecord]]
REFRESH_S = 30.0  # how stale another process's freezes may be when a guest is judged


class FrozenShareGate:
    def __init__(self, share: float, history: FreezeHistory | None, *, window_s: float = HOUR_S,
                 refresh_s: float = REFRESH_S):
        self.share = check_share(share)
        self.history = history
        self.window_s = window_s
        self.refresh_s = refresh_s
        self.host = ""
        self.run_id: int | None = None
        self._stored: list[FreezeRecord] = []
        self._stored_at = -math.inf
        self._own: deque[FreezeRecord] = deque()
        self.spared: dict[str, float] = {}  # guest -> the most seconds it had been frozen when spared

    def start(self, host: str, run_id: int | None) -> None:
        """A run begins on `host`: its own freezes are counted here, not read back."""
        self.host, self.run_id = host, run_id
        self._stored_at = -math.inf

    def spare(self, candidates: Iterable[str], next_freeze_s: float, now: float) -> dict[str, float]:
        """The candidates that must not be frozen now, with their seconds frozen in the window."""
        if self.share <= 0:
            return {}
        since = now - self.window_s
        if self.history is not None and now - self._stored_at >= self.refresh_s:
            self._stored = self.history(self.host, since, self.run_id)
            self._stored_at = now
        while self._own and self._own[0].at < since:
            self._own.popleft()
        spent = frozen_seconds([*self._stored, *self._own], since)
        spared = spared_guests(spent, candidates, self.share, next_freeze_s, self.window_s)
        for guest, seconds in spared.items():
            self.spared[guest] = max(self.spared.get(guest, 0.0), seconds)
        return spared

    def record(self, at: float, seconds: float, frozen: Iterable[str]) -> None:
        """A freeze this run made (also when its sample was dropped: the guests were paused)."""
        names = frozenset(frozen)
        if names:
            self._own.append(FreezeRecord(at, seconds, names))

    def to_dict(self) -> dict[str, object]:
        return {"max_share_per_hour": self.share, "window_s": self.window_s,
                "spared": {guest: round(seconds, 3) for guest, seconds in sorted(self.spared.items())}}
