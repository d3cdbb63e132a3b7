"""What a rebalancing plan is made of while its stages refine it, and what they are given.

The stages (core/rebalance/policy.py `PIPELINE`) run in order over one what-if search
(core/rebalance/search.py): the layouts live there; what the stages decide about them —
the reports each stage writes, the trials it offers, the gains it declines — is the
`Draft`, one typed value the plan's actions and notes are built from
(core/rebalance/actions.py). What earlier runs measured and did, which the stages weigh
and never change, is the `RunHistory`, given once when the search is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from vmplacer.core.rebalance.search import RebalanceSearch

Layout = dict[str, dict[int, frozenset[int]]]  # guest -> vCPU -> pCPUs


@dataclass
class Draft:
    """The plan so far, beside the what-if layouts: every stage's reports and offers."""

    exact: list[dict] = field(default_factory=list)  # what the exact solver found, per host group
    declined: list[dict] = field(default_factory=list)  # gains the search saw and did not take, and why
    rejected: list[str] = field(default_factory=list)  # moves a rule refused, in words
    pessimistic: list[dict] = field(default_factory=list)  # each host's layout against the blind spread
    trials: dict[str, dict] = field(default_factory=dict)  # host -> the layout to try after the plan's moves
    group_trials: dict[str, dict] = field(default_factory=dict)  # "h1+h2" -> small hosts' layout to try
    layout_guests: dict[str, list[str]] = field(default_factory=dict)  # host -> the guests its layout keys name
    declined_layouts: dict[str, Layout] = field(default_factory=dict)  # host -> exact layout declined
    exact_layouts: dict[str, Layout] = field(default_factory=dict)  # host -> the solver's layout
    ruled: set[str] = field(default_factory=set)  # hosts taken to the blind spread or kept as they are, by rule


@dataclass(frozen=True)
class RunHistory:
    """What earlier runs measured and did, as the stages weigh it (read, never changed).

    `measured_better`: (winner, loser) layout keys trials compared by measurement
    (core/rebalance/trial.py); `tried`: layouts each host tried within the trial memory;
    `pooled`: floating guests an earlier plan floated (the search may pin them again); `refuted`: hosts whose planned layouts measured worse lately; `held`: host -> why
    its data-driven moves are only tried (back-off)."""

    measured_better: frozenset[tuple[str, str]] = frozenset()
    tried: Mapping[str, int] = field(default_factory=dict)
    pooled: frozenset[str] = frozenset()
    refuted: frozenset[str] = frozenset()
    held: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, *, measured: Iterable[tuple[str, str]] | None = None, tried: Mapping[str, int] | None = None,
           pooled: Iterable[str] | None = None, refuted: Iterable[str] | None = None, held: Mapping[str, str] | None = None) -> RunHistory:
        """A history from optional parts (None: nothing of that kind happened)."""
        return cls(frozenset(measured or ()), dict(tried or {}), frozenset(pooled or ()),
                   frozenset(refuted or ()), dict(held or {}))


NO_HISTORY = RunHistory()


class Stage(Protocol):
    """One named step of planning: it refines the draft of `search` (its layouts and `draft`)."""

    name: str

    def refine(self, search: RebalanceSearch) -> None: ...


@dataclass(frozen=True)
class NamedStage:
    """A stage from a function of the search (the stage modules' entry points)."""

    name: str
    step: Callable[[RebalanceSearch], object]

    def refine(self, search: RebalanceSearch) -> None:
        self.step(search)
