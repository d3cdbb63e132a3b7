"""Guest protection policy: who is held above a performance floor, who may be throttled for it.

A *protected* guest has a floor on its Freeze'nSense ratio ζ/ζb (its shared
performance over its isolated performance); a *throttleable* guest has a
minimum CPU share (a fraction of its vCPUs' time, 0..1) that throttling may
never take it below. A guest that is neither is never throttled — the loop
only touches guests whose owners agreed to it.

The policy comes from the guest's labels (`vmplacer.protect`,
`vmplacer.min_cpu_share`), which flavor extra specs (`vmplacer:protect`,
`vmplacer:min_cpu_share`) fold into; a guest without either gets its
workload class's default (configurable: latency-critical → protected,
batch → throttleable).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PROTECT_LABEL = "vmplacer.protect"
MIN_SHARE_LABEL = "vmplacer.min_cpu_share"
WORKLOAD_CLASS_KEY = "workload_class"
# Flavor extra spec -> label (extra specs use Nova's `namespace:name` form).
PROTECTION_EXTRA_SPECS = {"vmplacer:protect": PROTECT_LABEL, "vmplacer:min_cpu_share": MIN_SHARE_LABEL}

# A floor of 1.0 or more can never hold (sharing always costs something); below 0.05 it means nothing.
FLOOR_RANGE = (0.05, 0.99)
# A share of 0 would stop the guest; 1.0 means "never throttled" and is allowed (an explicit opt-out).
MIN_SHARE_RANGE = (0.01, 1.0)


class ProtectionError(ValueError):
    """A protection label or default that is not a valid value; the message names field and rule."""


@dataclass(frozen=True)
class ProtectionDefaults:
    """Per-workload-class defaults for guests whose labels say nothing (None: no default)."""

    latency_critical_floor: float | None = 0.85
    batch_min_share: float | None = 0.2

    def __post_init__(self) -> None:
        if self.latency_critical_floor is not None:
            check_floor(self.latency_critical_floor, "protect.latency_critical_floor")
        if self.batch_min_share is not None:
            check_min_share(self.batch_min_share, "protect.batch_min_share")


@dataclass(frozen=True)
class Protection:
    """One guest's effective policy. `floor` set: protected; `min_share` set: throttleable."""

    floor: float | None = None
    min_share: float | None = None
    source: str = "none"  # "labels" | "class default" | "none": why the guest has this policy

    @property
    def protected(self) -> bool:
        return self.floor is not None

    @property
    def throttleable(self) -> bool:
        return self.min_share is not None and self.min_share < 1.0


def check_floor(value: object, where: str) -> float:
    """The floor as a float; ProtectionError naming `where` and the rule otherwise."""
    number = _number(value, where)
    low, high = FLOOR_RANGE
    if not low <= number <= high:
        raise ProtectionError(f"{where}: must be a ratio {low}..{high} (the lowest ζ/ζb to hold), got {value!r}")
    return number


def check_min_share(value: object, where: str) -> float:
    """The minimum share as a float; ProtectionError naming `where` and the rule otherwise."""
    number = _number(value, where)
    low, high = MIN_SHARE_RANGE
    if not low <= number <= high:
        raise ProtectionError(f"{where}: must be a fraction {low}..{high} of the guest's CPU time, got {value!r}")
    return number


def _number(value: object, where: str) -> float:
    if isinstance(value, bool):
        raise ProtectionError(f"{where}: must be a number, got {value!r}")
    try:
        number = float(str(value).strip())
    except ValueError:
        raise ProtectionError(f"{where}: must be a number, got {value!r}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ProtectionError(f"{where}: must be a finite number, got {value!r}")
    return number


def label_problems(labels: Mapping[str, str]) -> list[tuple[str, str]]:
    """(label, reason) for every protection label that is invalid (spec validation uses this)."""
    problems: list[tuple[str, str]] = []
    for key, check in ((PROTECT_LABEL, check_floor), (MIN_SHARE_LABEL, check_min_share)):
        if key in labels:
            try:
                check(labels[key], key)
            except ProtectionError as exc:
                problems.append((key, str(exc).split(": ", 1)[1]))
    if PROTECT_LABEL in labels and MIN_SHARE_LABEL in labels and not problems:
        problems.append((MIN_SHARE_LABEL, f"a guest protected by {PROTECT_LABEL} is never throttled; "
                                          "give it one of the two labels, not both"))
    return problems


def protection_of(labels: Mapping[str, str], defaults: ProtectionDefaults,
                  workload_class: str | None = None) -> Protection:
    """The effective policy of a guest from its labels, else its workload class's default.

    Labels come from domain metadata written by vmplacer and were validated
    when the guest was placed; a value that is invalid anyway (edited by hand)
    makes the guest neither protected nor throttleable rather than guessing.
    """
    workload = workload_class if workload_class is not None else labels.get(WORKLOAD_CLASS_KEY, "unknown")
    if PROTECT_LABEL in labels or MIN_SHARE_LABEL in labels:
        if label_problems(labels):
            return Protection(source="invalid labels")
        floor = float(labels[PROTECT_LABEL]) if PROTECT_LABEL in labels else None
        share = float(labels[MIN_SHARE_LABEL]) if MIN_SHARE_LABEL in labels else None
        return Protection(floor=floor, min_share=share, source="labels")
    if workload == "latency-critical" and defaults.latency_critical_floor is not None:
        return Protection(floor=defaults.latency_critical_floor, source="class default")
    if workload == "batch" and defaults.batch_min_share is not None:
        return Protection(min_share=defaults.batch_min_share, source="class default")
    return Protection()
