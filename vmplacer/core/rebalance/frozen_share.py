"""The share of a guest's hour that profiling may freeze it for (`rebalance.disruption.max_frozen_share_per_guest_hour`).

Freeze'nSense pauses every neighbour of the guest it measures for t_m (plus the suspend and
resume latency), and a pair probe pauses all but two guests: on a host of many sensitive guests
each guest is paused many times a round, by every run that profiles the host (`vmplacer profile`,
the API's runs, the rebalancer's probes and trial measurements). The rule: a guest frozen for
`share × window` seconds in the last window (an hour), counted from the freezes that really
happened, is not frozen again until older freezes leave the window; one more freeze must fit
whole (`next_freeze_s`: the profiler's window and its recent suspend and resume time), so the
share is passed by at most what one freeze takes beyond that expectation.

Pure: freeze records in, the guests to spare out. Records come from the stored ζb and pair
samples of other runs and their `frozen` rows (a freeze whose sample was dropped is stored as
such a row), read by `records_from_samples`, which counts a pair probe's two rows once, and from
the running profiler's own freezes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

HOUR_S = 3600.0
DEFAULT_SHARE = 0.02  # see docs/disruption.md: twice what continuous profiling at the design point spends
UNSAMPLED_KIND = "frozen"  # a stored freeze that gave no sample (dropped, watchdog, aborted halfway)
FROZEN_KINDS = ("zeta_b", "zeta_p", UNSAMPLED_KIND)  # stored rows that stand for a freeze


class FrozenShareError(ValueError):
    """A frozen-share limit outside [0, 1]."""


@dataclass(frozen=True)
class FreezeRecord:
    """One freeze: when it ended (wall time, s), how long its domains were paused, which."""

    at: float
    seconds: float
    frozen: frozenset[str]


def check_share(share: float) -> float:
    """The limit as a share of the window; 0 turns the rule off."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share) \
            or not 0 <= share <= 1:
        raise FrozenShareError(f"max_frozen_share_per_guest_hour must be a number in [0, 1] (0: no limit), "
                               f"got {share!r}")
    return float(share)


def frozen_seconds(records: Iterable[FreezeRecord], since: float) -> dict[str, float]:
    """Seconds each guest spent frozen in the freezes that ended at or after `since`."""
    spent: dict[str, float] = {}
    for record in records:
        if record.at < since:
            continue
        for guest in record.frozen:
            spent[guest] = spent.get(guest, 0.0) + max(record.seconds, 0.0)
    return spent


def spared_guests(spent: Mapping[str, float], candidates: Iterable[str], share: float,
                  next_freeze_s: float, window_s: float = HOUR_S) -> dict[str, float]:
    """The candidates one more freeze of `next_freeze_s` would take past `share` of the
    window, with the seconds each was frozen in it (share 0: none)."""
    if share <= 0:
        return {}
    allowance = share * window_s
    return {guest: spent.get(guest, 0.0) for guest in candidates
            if spent.get(guest, 0.0) + max(next_freeze_s, 0.0) > allowance}


def records_from_samples(rows: Sequence[Mapping[str, Any]]) -> list[FreezeRecord]:
    """Freezes from stored samples taken while neighbours were frozen, in id order: a ζb row or a
    `frozen` row is one freeze; a pair probe stores one row per guest of the pair (consecutive, same run, same
    freeze span, same frozen neighbours), counted once. A row without a measured span counts
    its window t_m. Rows: run_id, kind, at, freeze_ms, t_m_ms, neighbours."""
    records: list[FreezeRecord] = []
    previous: tuple[Any, ...] | None = None
    for row in rows:
        if row["kind"] not in FROZEN_KINDS:
            previous = None
            continue
        frozen = frozenset(str(n["name"]) for n in row.get("neighbours") or () if n.get("frozen", True))
        span_ms = row.get("freeze_ms")
        seconds = float(span_ms if span_ms is not None else row.get("t_m_ms") or 0.0) / 1e3
        key = (row["run_id"], row["kind"], seconds, frozen)
        if row["kind"] == "zeta_p" and key == previous:
            previous = None  # the pair's second row: the same freeze
            continue
        previous = key
        if frozen:
            records.append(FreezeRecord(float(row["at"]), seconds, frozen))
    return records
