"""What a live migration costs: pre-copy rounds, total time, downtime, performance lost.

QEMU's pre-copy migration sends all guest memory once, then, round after
round, what the guest dirtied meanwhile, until the rest can be sent within
the allowed downtime (libvirt's default maximum downtime is 300 ms); then the
guest pauses and the rest goes. With memory M, dirty rate D and bandwidth B
(MiB, MiB/s) round i lasts t_i = M·(D/B)^i / B: the rounds shrink only when
D < B. A guest that dirties memory as fast as the link carries it never
converges (QEMU would have to throttle it): such a migration is refused.

The cost the rebalancer weighs against a move's gain is in "VM-seconds at
full speed" lost: the downtime, plus a slowdown while memory is tracked and
copied (`copy_slowdown`, the share of performance lost during pre-copy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_MAX_DOWNTIME_S = 0.3  # libvirt/QEMU default
DEFAULT_COPY_SLOWDOWN = 0.1  # dirty-page tracking and copying: ~10 % of the guest's speed
MAX_ROUNDS = 30  # QEMU gives up iterating long before this in practice


@dataclass(frozen=True)
class MigrationCost:
    converges: bool
    duration_s: float  # first byte to guest running on the destination
    downtime_s: float  # guest paused for the final copy
    rounds: int
    transferred_mib: float
    lost_perf_s: float  # VM-seconds at full speed lost (downtime + slowdown while copying)
    reason: str = ""

    def to_dict(self) -> dict[str, float]:
        return {
            "duration_s": round(self.duration_s, 3),
            "downtime_s": round(self.downtime_s, 4),
            "rounds": float(self.rounds),
            "transferred_mib": round(self.transferred_mib, 1),
            "lost_perf_s": round(self.lost_perf_s, 4),
        }


def migration_cost(
    memory_mib: float,
    dirty_mib_s: float,
    bandwidth_mib_s: float,
    *,
    max_downtime_s: float = DEFAULT_MAX_DOWNTIME_S,
    copy_slowdown: float = DEFAULT_COPY_SLOWDOWN,
) -> MigrationCost:
    """Predicted pre-copy migration of a guest; `converges` False when it would never finish."""
    for name, value in (("memory_mib", memory_mib), ("dirty_mib_s", dirty_mib_s),
                        ("bandwidth_mib_s", bandwidth_mib_s), ("max_downtime_s", max_downtime_s)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"migration cost: field {name!r} must be a finite number >= 0, got {value!r}")
    if bandwidth_mib_s <= 0:
        raise ValueError("migration cost: field 'bandwidth_mib_s' must be > 0")
    if not 0.0 <= copy_slowdown <= 1.0:
        raise ValueError(f"migration cost: field 'copy_slowdown' must be in [0, 1], got {copy_slowdown!r}")
    stop_at = bandwidth_mib_s * max_downtime_s  # what can go in the allowed downtime
    remaining = float(memory_mib)
    elapsed = 0.0
    sent = 0.0
    rounds = 0
    while (rounds == 0 or remaining > stop_at) and rounds < MAX_ROUNDS:  # the first pass always runs live
        seconds = remaining / bandwidth_mib_s
        elapsed += seconds
        sent += remaining
        rounds += 1
        dirtied = min(dirty_mib_s * seconds, float(memory_mib))
        if dirtied >= remaining:  # no progress: the guest dirties faster than we send
            return MigrationCost(False, math.inf, math.inf, rounds, sent, math.inf,
                                 f"dirty rate {dirty_mib_s:g} MiB/s does not fall below the link's "
                                 f"{bandwidth_mib_s:g} MiB/s: pre-copy never converges")
        remaining = dirtied
    if remaining > stop_at:
        return MigrationCost(False, math.inf, math.inf, rounds, sent, math.inf,
                             f"still {remaining:.0f} MiB to send after {rounds} rounds")
    downtime = remaining / bandwidth_mib_s
    duration = elapsed + downtime
    return MigrationCost(
        converges=True,
        duration_s=duration,
        downtime_s=downtime,
        rounds=rounds,
        transferred_mib=sent + remaining,
        lost_perf_s=downtime + copy_slowdown * elapsed,
    )
