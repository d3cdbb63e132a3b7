"""What the stages offer to measure: the trials of a plan, typed.

A trial is a layout the model is unsure of, tried after the plan's moves and kept only when
Freeze'nSense measures it better (core/rebalance/trial.py). The pessimistic stage offers the
layout it did not choose (the blind spread or the model's own) and exact layouts the model's
confidence declined; exploration offers what an optimist would choose, on one host or on a
group of small hosts together. The disruption budget keeps the offers that promise most; the
planner turns the kept ones into repins, migrations and probes. Offers are frozen: a stage
that changes its mind replaces or withdraws one, never edits it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

Pins = Mapping[int, frozenset[int]]  # vCPU -> pCPUs


class TrialKind(StrEnum):
    """What a trial tries (its value is the word plans and trial records carry: "tried", "what")."""

    SPREAD = "spread"  # the interference-blind spread, where the plan keeps the model's layout
    MODEL = "model"  # the model's layout, where the plan takes the host to the spread or keeps its start
    EXACT = "exact"  # the exact solver's layout the model rated worth it but was not sure enough of
    OPTIMISTIC = "optimistic"  # the layout the model would choose were its doubtful pairs harmless


@dataclass(frozen=True)
class HostTrial:
    """A layout to try on one host after the plan's moves (the guests it names; the others stay)."""

    host: str
    layout: Mapping[str, Pins]  # guest -> its pins in the trial
    kind: TrialKind
    label: str  # what is tried, in words ("blind spread", "model's layout", …)
    from_key: str  # the layout the trial is compared with (core/rebalance/trial.layout_key)
    to_key: str  # the layout tried
    value: float  # what it promises, in objective units, never negative (core/rebalance/disruption.py)

    @property
    def hosts(self) -> tuple[str, ...]:
        return (self.host,)


@dataclass(frozen=True)
class GroupTrial:
    """A joint layout of small hosts to try, guests migrating between them, measured and judged
    as one; undone, the guests migrate back."""

    hosts: tuple[str, ...]
    changes: Mapping[str, tuple[str, Pins]]  # guest -> (its host in the trial, its pins there)
    kind: TrialKind
    label: str  # what is tried, in words
    from_key: str  # the hosts as they are (core/rebalance/trial.hosts_key)
    to_key: str  # the hosts as the trial lays them out
    value: float  # what it promises, in objective units, never negative

    @property
    def name(self) -> str:
        """The group's name in plans and notes: its hosts joined by "+"."""
        return "+".join(self.hosts)


TrialOffer = HostTrial | GroupTrial
