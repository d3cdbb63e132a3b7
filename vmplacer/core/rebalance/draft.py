"""What a rebalancing plan is made of while its stages refine it, and what they are given.

The stages (core/rebalance/policy.py `PIPELINE`) run in order, each a function
`refine(draft, inputs) -> Draft`. The `Draft` is the plan so far, in three kinds of parts
(core/rebalance/pipeline.py names them; each stage declares which it reads and writes): the
what-if state (the host layouts, `HostLayout` one per host, where each guest is and how it
does, with memos beside them), the log of the moves taken on it, and what the stages decided —
the reports each stage writes, the trials it offers (core/rebalance/offers.py), the gains it
declines. The planner turns the moves and offers into the plan's actions
(core/rebalance/planner.py, through the view core/rebalance/actions.py builds).
`PlanInputs` is what every stage is given and none changes: the cluster state, the
model and its coefficients, the settings, the solver, and the `RunHistory` (what
earlier runs measured and did).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from vmplacer.core.stage_times import NO_STAGE_TIMES, StageTimes

if TYPE_CHECKING:
    from vmplacer.core.model.interference import InterferenceModel
    from vmplacer.core.rebalance.layout import BetaTable, HostLayout
    from vmplacer.core.rebalance.layout_problem import LayoutSolver
    from vmplacer.core.rebalance.offers import GroupTrial, HostTrial
    from vmplacer.core.rebalance.whatif import CandidateMove
    from vmplacer.core.rebalance.state import ClusterState, GuestState, RebalanceSettings

Layout = dict[str, dict[int, frozenset[int]]]  # guest -> vCPU -> pCPUs


@dataclass
class Draft:
    """The plan so far: the what-if layouts, the moves taken on them, every stage's reports and offers."""

    hosts: dict[str, HostLayout] = field(default_factory=dict)  # host -> its what-if layout
    guests: dict[str, GuestState] = field(default_factory=dict)  # each guest as the moves so far leave it
    host_of: dict[str, str] = field(default_factory=dict)  # guest -> the host it is on now
    memory_nodes: dict[str, frozenset[int]] = field(default_factory=dict)  # guest -> its memory's nodes now
    perf_now: dict[str, float] = field(default_factory=dict)  # guest -> predicted performance now
    moves: list[CandidateMove] = field(default_factory=list)  # the moves taken, in order
    touched: set[str] = field(default_factory=set)  # guests a move changed
    migrated: dict[str, str] = field(default_factory=dict)  # guest -> the host it started on
    memory_moved: set[str] = field(default_factory=set)  # guests whose memory moves within their host
    # guest -> (guest state, host, pins, memory nodes, placement), kept while they are the same
    placement_cache: dict[str, tuple] = field(default_factory=dict)
    # host -> (its guests and pins, their confidences), kept while they are the same
    confidence_cache: dict[str, tuple] = field(default_factory=dict)
    exact: list[dict] = field(default_factory=list)  # what the exact solver found, per host group
    declined: list[dict] = field(default_factory=list)  # gains the search saw and did not take, and why
    rejected: list[str] = field(default_factory=list)  # moves a rule refused, in words
    pessimistic: list[dict] = field(default_factory=list)  # each host's layout against the blind spread
    trials: dict[str, HostTrial] = field(default_factory=dict)  # host -> the layout to try after the plan's moves
    group_trials: dict[str, GroupTrial] = field(default_factory=dict)  # "h1+h2" -> small hosts' layout to try
    layout_guests: dict[str, list[str]] = field(default_factory=dict)  # host -> the guests its layout keys name
    declined_layouts: dict[str, Layout] = field(default_factory=dict)  # host -> exact layout declined
    exact_layouts: dict[str, Layout] = field(default_factory=dict)  # host -> the solver's layout
    ruled: set[str] = field(default_factory=set)  # hosts taken to the blind spread or kept as they are, by rule
    cut_short: dict[str, str] = field(default_factory=dict)  # host -> why its search stopped early (budget)
    over_budget: list[dict] = field(default_factory=list)  # trials the disruption budget left for later rounds
    disruption: dict = field(default_factory=dict)  # what the plan's trials spend of the disruption budget


@dataclass(frozen=True)
class RunHistory:
    """What earlier runs measured and did, as the stages weigh it (read, never changed).

    `measured_better`: (winner, loser) layout keys trials compared by measurement
    (core/rebalance/trial.py); `tried`: layouts each host tried within the trial memory;
    `pooled`: floating guests an earlier plan floated (the search may pin them again); `refuted`: hosts whose planned layouts measured worse lately; `held`: host -> why
    its data-driven moves are only tried (back-off); `moves`: guest -> how often it was moved in the
    last hour (the per-guest disruption budget)."""

    measured_better: frozenset[tuple[str, str]] = frozenset()
    tried: Mapping[str, int] = field(default_factory=dict)
    pooled: frozenset[str] = frozenset()
    refuted: frozenset[str] = frozenset()
    held: Mapping[str, str] = field(default_factory=dict)
    moves: Mapping[str, int] = field(default_factory=dict)  # guest -> its moves in the last hour

    @classmethod
    def of(cls, *, measured: Iterable[tuple[str, str]] | None = None, tried: Mapping[str, int] | None = None,
           pooled: Iterable[str] | None = None, refuted: Iterable[str] | None = None, held: Mapping[str, str] | None = None,
           moves: Mapping[str, int] | None = None) -> RunHistory:
        """A history from optional parts (None: nothing of that kind happened)."""
        return cls(frozenset(measured or ()), dict(tried or {}), frozenset(pooled or ()),
                   frozenset(refuted or ()), dict(held or {}), dict(moves or {}))


NO_HISTORY = RunHistory()


@dataclass(frozen=True)
class PlanInputs:
    """What every stage is given and none changes (core/rebalance/search.py `start_search` builds it)."""

    state: ClusterState
    model: InterferenceModel
    settings: RebalanceSettings
    betas: BetaTable  # the model's coefficients per pair of guest identities (optimistic when exploring)
    original: Mapping[str, GuestState]  # each guest as the run found it
    start_perf: Mapping[str, float]  # each guest's predicted performance as the run found it
    floors: Mapping[str, float]  # protected guest -> the performance no move may push it below
    refused_by: Mapping[str, frozenset[str]]  # guest -> guests whose anti-affinity names it
    solver: LayoutSolver | None = None
    history: RunHistory = NO_HISTORY
    times: StageTimes = field(default_factory=lambda: NO_STAGE_TIMES)  # where planning time goes (caller's clock)


class Stage(Protocol):
    """One named step of planning: it refines the draft the stage before left."""

    name: str

    def refine(self, draft: Draft, inputs: PlanInputs) -> Draft: ...


@dataclass(frozen=True)
class NamedStage:
    """A stage from a function of (draft, inputs) that refines the draft in place (the stage
    modules' entry points)."""

    name: str
    step: Callable[[Draft, PlanInputs], object]

    def refine(self, draft: Draft, inputs: PlanInputs) -> Draft:
        self.step(draft, inputs)
        return draft
