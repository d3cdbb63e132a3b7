"""A gain the search saw and did not take, and why: typed.

The search notes each declined gain in the draft (`Draft.declined`) and the plan's notes keep
the last few; `DeclinedGain.of` reads one back with its reason as a `DeclineReason`, and
`DeclinedGain.text` says it in words for the plan's summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class DeclineReason(StrEnum):
    """What declined a gain (its value is the word the plan's notes carry, `declined_by`)."""

    MIN_GAIN = "min_gain"  # below the hysteresis of the hosts it touches
    MIN_MIGRATION_GAIN = "min_migration_gain"  # a migration below its own threshold
    CONFIDENCE = "confidence"  # worth it by the model, but too little of it is sure
    MIGRATION_COST = "migration_cost"  # worth it before the migration's cost, not after
    MAX_ACTIONS = "max_actions"  # the plan's action budget is spent
    BACKOFF = "backoff"  # its host is in back-off: its layout is only tried


@dataclass(frozen=True)
class DeclinedGain:
    """One declined gain: the move in words, what it promised, and what declined it."""

    move: str
    predicted_gain: float
    sure_gain: float
    confidence: float
    cost: float
    threshold: float
    declined_by: DeclineReason

    @classmethod
    def of(cls, report: Mapping[str, object]) -> DeclinedGain:
        """A declined gain as the draft notes it (raises ValueError for a reason no rule gives)."""
        return cls(str(report["move"]), _number(report, "predicted_gain"), _number(report, "sure_gain"),
                   _number(report, "confidence"), _number(report, "cost"), _number(report, "threshold"),
                   DeclineReason(str(report["declined_by"])))

    def text(self) -> str:
        """The gain in words: what, how much, and what declined it."""
        why = {
            DeclineReason.MIN_GAIN: f"below the minimum gain {self.threshold:g}",
            DeclineReason.MIN_MIGRATION_GAIN: f"below the minimum migration gain {self.threshold:g}",
            DeclineReason.CONFIDENCE: (f"only +{self.sure_gain:.3f} of it is sure at confidence "
                                       f"{self.confidence:.2f}, below {self.threshold:g}"),
            DeclineReason.MIGRATION_COST: (f"the migration costs {self.cost:.3f}, leaving less than "
                                           f"{self.threshold:g}"),
            DeclineReason.MAX_ACTIONS: "the action budget is spent",
            DeclineReason.BACKOFF: ("its host's recent planned layouts measured worse (back-off): only tried, "
                                    "kept if measured better"),
        }[self.declined_by]
        return f"{self.move} (predicted +{self.predicted_gain:.3f}): {why}"


def _number(report: Mapping[str, object], key: str) -> float:
    value = report.get(key, 0.0)
    if not isinstance(value, (int, float)):
        raise ValueError(f"declined gain: field {key!r} must be a number, got {value!r}")
    return float(value)
