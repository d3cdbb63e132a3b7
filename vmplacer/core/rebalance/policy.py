"""The rebalance policy: moves that raise predicted weighted performance, as a Plan.

Pure: it gets the cluster state, the interference model and the settings,
searches on a what-if copy and returns a `Plan` (nothing is touched).

Objective. Each running guest v gets a predicted performance p_v — the share
of its full-speed throughput (every vCPU at its load) it gets in the layout,
from the interference model: time sharing of pCPUs, and pairwise losses by
distance class (with no learned data the model is the linear predictor and
only time sharing counts). The objective is

    J = Σ_v w_v · (p_v − φ · max(0, 1 − p_v)²)

w_v weighs latency-critical guests and the `priority` label; φ (`fairness`)
is small: among layouts of equal total it prefers the one where the worst-off
guest does better (three busy vCPUs on two pCPUs: all three floating over both
beat two sharing one pCPU while the third has the other). Protected guests
(latency-critical, priority > 0, or a `perf_floor` label) are never pushed
below their floor: the label's value, else their predicted performance before
the run.

Moves, evaluated with the model on a what-if layout (local search, steepest
ascent, one move per round):

* move one pinned vCPU to another pCPU of its host;
* swap the pCPUs of two pinned vCPUs of different guests;
* pool: the shareable pinned vCPUs of an oversubscribed node float over the
  node's shared pool (the placement engine's rule for shared vCPUs);
* relocate a guest, vCPUs and memory, to another NUMA node of its host;
* migrate a guest to another host (pinned there greedily, or by the placement
  engine for guests vmplacer placed).

Every move keeps the placement engine's rules (exclusive pCPUs stay
exclusive, isolate guests keep whole cores, memory fits its nodes,
anti-affinity holds, reserved pCPUs stay unused). A move is taken only if it
raises J by `min_gain` (hysteresis), or by `min_gain_share` of the full speed
of the guests on the hosts it touches when that is less (a host of four guests
would otherwise leave 1.25 % of their mean on the table); a migration or a memory move must also
pay for itself: its cost (`migration_cost`: downtime and slowdown while
copying, in VM-seconds at full speed) divided by `horizon_s` is subtracted,
and the rest must clear `min_migration_gain`. Guests moved within
`cooldown_s` stay put; at most `max_actions` actions are planned.

The parts: `rebalance/state` (what the policy is given), `rebalance/draft` (the plan
so far and what every stage reads), `rebalance/layout` (a host's what-if layout and
its predicted performance), `rebalance/whatif` (a layout's objective, rules and how
sure a move's gain is), `rebalance/local_moves` and `rebalance/migration` (the candidate
moves), `rebalance/search` (the local search), `rebalance/exact`, `pessimistic`,
`explore` (the later stages, their trials typed in `rebalance/offers`), `rebalance/pipeline`
(the stages' declared reads and writes), `rebalance/planner` (the plan's actions from the
moves and offers) and `rebalance/actions` (its view of the draft). This module holds the entry
points and the stages' order.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping

from vmplacer.core.collector import collection_held
from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.text import plural
from vmplacer.core.rebalance.layout_problem import LayoutSolver
from vmplacer.core.rebalance.plan import Plan
from vmplacer.core.rebalance.draft import RunHistory
from vmplacer.core.rebalance.offers import TrialOffer
from vmplacer.core.rebalance.declined import DeclinedGain
from vmplacer.core.rebalance.explore import offer_optimistic_groups, offer_optimistic_layouts
from vmplacer.core.rebalance.pessimistic import choose_pessimistically, offer_declined_layouts
from vmplacer.core.rebalance.actions import build_actions, plan_from_search
from vmplacer.core.rebalance.budget import hosts_over_budget
from vmplacer.core.rebalance.disruption import spend_disruption_budget
from vmplacer.core.rebalance.layout import BetaTable, locality_nodes
from vmplacer.core.rebalance.layout import utility  # noqa: F401  (still importable from here)
from vmplacer.core.rebalance.exact import climb_after_polish, polish
from vmplacer.core.rebalance.search import climb, start_search
from vmplacer.core.rebalance.pipeline import SEARCH, StageSpec, run_pipeline
from vmplacer.core.rebalance.whatif import host_objective, perf_by_guest, total_objective, violations
from vmplacer.core.rebalance.state import (
    EXCLUSIVE,
    FIXED,
    PINNED,
    ClusterState,
    GuestState,
    HostState,
    RebalanceInputError,
    RebalanceSettings,
    describe_guest,
)
from vmplacer.core.stage_times import NO_STAGE_TIMES, StageTimes
from vmplacer.core.rebalance.trial import Backoff

__all__ = [
    "ClusterState", "GuestState", "HostState", "RebalanceSettings", "RebalanceInputError", "describe_guest",
    "plan_rebalance", "evaluate_cluster", "exhaustive_best", "BetaTable", "declined_text", "PIPELINE",
]


# --------------------------------------------------------------------------- the stages, in order
# Each refines the draft the one before left (core/rebalance/draft.py), reading and writing the
# parts it declares (core/rebalance/pipeline.py; the tests check the declarations); the stage
# timer reports them by these names (a name listed twice adds up).
_FOUND = ("declined", "rejected", "cut_short")  # what a search of moves reports besides the moves
PIPELINE: tuple[StageSpec, ...] = (
    # local search: moves, swaps, pools, relocations, migrations
    StageSpec("climb", climb, reads=(), writes=SEARCH + _FOUND),
    # small hosts: the exact solver's layout (rebalance/exact)
    StageSpec("exact", polish, reads=(),
              writes=SEARCH + _FOUND + ("exact", "exact_layouts", "declined_layouts")),
    # climb on from the solver's layouts
    StageSpec("climb", climb_after_polish, reads=("exact",), writes=SEARCH + _FOUND),
    # each host against the blind spread, at the lower bound
    StageSpec("pessimistic", choose_pessimistically, reads=("exact_layouts",),
              writes=SEARCH + _FOUND + ("pessimistic", "layout_guests", "trials", "ruled")),
    # exact layouts not sure enough: tried instead
    StageSpec("declined_layouts", offer_declined_layouts, reads=SEARCH + ("declined_layouts", "ruled"),
              writes=("trials",)),
    # small hosts together, optimistic β (explore)
    StageSpec("optimistic_groups", offer_optimistic_groups, reads=SEARCH + ("trials", "ruled"),
              writes=("group_trials",)),
    # each host alone, optimistic β (explore)
    StageSpec("optimistic_layouts", offer_optimistic_layouts, reads=SEARCH + ("group_trials", "ruled"),
              writes=("trials",)),
    # trials within the plan's disruption budget
    StageSpec("disruption", spend_disruption_budget, reads=SEARCH,
              writes=("trials", "group_trials", "over_budget", "disruption")),
)


# --------------------------------------------------------------------------- public entry points
def plan_rebalance(
    state: ClusterState,
    model: InterferenceModel,
    settings: RebalanceSettings | None = None,
    *,
    now: float | None = None,
    last_moved: Mapping[str, float] | None = None,
    scope: Iterable[str] | None = None,
    hosts: Iterable[str] | None = None,
    solver: LayoutSolver | None = None,
    measured: Iterable[tuple[str, str]] | None = None,
    tried: Mapping[str, int] | None = None,
    pooled: Iterable[str] | None = None,
    held: Mapping[str, Backoff] | None = None,
    refuted: Iterable[str] | None = None,
    times: StageTimes | None = None,
    moves_last_hour: Mapping[str, int] | None = None,
) -> Plan:
    """Search moves on a what-if copy of `state`; the resulting Plan (state "proposed", or
    "empty" — final — when no move is worth making).

    `now` and `last_moved` (guest -> epoch seconds of its last move) drive the
    cool-down; `scope` limits which guests may move (the others still count
    as load); `hosts` limits the hosts the plan may touch; `solver` (optional) lays out
    small hosts exactly after the local search (`exact_max_cpus`); `measured` holds (winner,
    loser) layout keys that earlier trials compared by measurement (core/rebalance/trial.py), `tried` how
    many layouts each host tried lately (at most `trial_max` per `trial_memory_s`); `pooled` names
    floating guests an earlier plan floated, which the search may pin again; `held` names hosts
    in back-off (core/trial.backoffs): their data-driven moves are not planned, only tried;
    `refuted` names hosts whose planned layouts measured worse lately (a layout planned there must
    measure better by `trial_refuted_bar` to stay). `times` (optional)
    collects the seconds each stage took, on the caller's clock. `moves_last_hour` (guest -> moves
    in the last hour, an undone one counting twice) fixes guests at `max_moves_per_guest_hour`.
    """
    with collection_held():  # a fleet's what-if state is millions of objects kept to the end
        return _plan(state, model, settings or RebalanceSettings(), now=now, last_moved=last_moved, scope=scope,
                     hosts=hosts, solver=solver, measured=measured, tried=tried,
                     pooled=pooled, held=held, refuted=refuted, times=times, moves=moves_last_hour)


def _plan(state: ClusterState, model: InterferenceModel, settings: RebalanceSettings, *, now: float | None,
          last_moved: Mapping[str, float] | None, scope: Iterable[str] | None, hosts: Iterable[str] | None,
          solver: LayoutSolver | None, measured: Iterable[tuple[str, str]] | None, tried: Mapping[str, int] | None,
          pooled: Iterable[str] | None, held: Mapping[str, Backoff] | None,
          refuted: Iterable[str] | None, times: StageTimes | None,
          moves: Mapping[str, int] | None = None) -> Plan:
    """`plan_rebalance`'s work, its arguments as given."""
    if hosts is not None:
        allowed = set(hosts)
        unknown = sorted(allowed - set(state.hosts))
        if unknown:
            raise RebalanceInputError(f"hosts {unknown} are not in the cluster state")
        state = ClusterState({n: h for n, h in state.hosts.items() if n in allowed},
                             {n: g for n, g in state.guests.items() if g.host in allowed})
    left_out = hosts_over_budget(state, settings)
    if left_out:
        state = ClusterState({n: h for n, h in state.hosts.items() if n not in left_out},
                             {n: g for n, g in state.guests.items() if g.host not in left_out})
    at = 0.0 if now is None else now
    times = times or NO_STAGE_TIMES
    history = RunHistory.of(measured=measured, tried=tried, pooled=pooled, moves=moves,
                            refuted=refuted, held={host: b.why(at) for host, b in (held or {}).items()})
    with times.stage("setup"):
        draft, inputs = start_search(state, model, settings, now, last_moved, scope, solver, history=history,
                                     times=times)
    with times.stage("setup"):
        before = total_objective(draft, inputs)
    draft = run_pipeline(draft, inputs, PIPELINE)
    with times.stage("actions"):
        after = total_objective(draft, inputs)
        actions, predicted = build_actions(draft, inputs, model)
    fixed = sorted(f"{g.name} ({g.why_fixed})" for g in draft.guests.values() if g.mode == FIXED and g.why_fixed)
    moved = sum(1 for a in actions if a.kind != "probe")
    summary = (f"{plural(moved, 'action')}; predicted objective {before:.3f} → {after:.3f}" if moved
               else f"no move clears the minimum gain of {settings.min_gain:g}{_per_guest(settings)}: nothing to do")
    if draft.declined:
        summary += "; declined: " + declined_text(draft.declined[-1])
    if draft.cut_short:
        summary += (f"; search cut short on {plural(len(draft.cut_short), 'host')} by the time budget of "
                    f"{settings.host_budget_s:g} s: {_first_hosts(draft.cut_short)}")
    if left_out:
        summary += (f"; {plural(len(left_out), 'host')} left out, over the memory budget of "
                    f"{settings.memory_budget_mib} MiB: {_first_hosts(left_out)}")
    if draft.over_budget:
        summary += (f"; {plural(len(draft.over_budget), 'trial')} left for later rounds by the disruption budget "
                    f"({settings.max_trials} trials, {settings.max_trial_repins} repins per plan): "
                    f"{_first_hosts(t['trial'] for t in draft.over_budget)}")
    offers: dict[str, TrialOffer] = {**draft.trials, **draft.group_trials}
    notes = {"fixed": fixed, "held": sorted(inputs.history.held.values()), "rejected": draft.rejected[:20],
             "declined": draft.declined[-5:],
             "exact": draft.exact, "pessimistic": draft.pessimistic,
             "refuted": sorted(inputs.history.refuted),
             "left_out": [{"host": host, "why": why} for host, why in sorted(left_out.items())],
             "cut_short": [{"host": host, "why": why} for host, why in sorted(draft.cut_short.items())],
             "trials": [{"host": h, "what": t.kind.value, "from_key": t.from_key, "to_key": t.to_key}
                        for h, t in sorted(offers.items(), key=lambda item: item[0])],
             "disruption": draft.disruption, "over_budget": draft.over_budget[:50]}
    return plan_from_search(draft, inputs, actions, predicted, before=before, after=after, summary=summary, notes=notes,
                            now=now)


def _first_hosts(hosts: Iterable[str], shown: int = 5) -> str:
    """The first hosts by name, for a summary of one line ("…" when there are more)."""
    names = sorted(hosts)
    return ", ".join(names[:shown]) + (" …" if len(names) > shown else "")


def _per_guest(settings: RebalanceSettings) -> str:
    return f" (or {settings.min_gain_share:g} per guest on hosts of few guests)" if settings.min_gain_share > 0 else ""


def declined_text(declined: Mapping[str, object]) -> str:
    """One declined gain in words: what, how much, and what declined it."""
    return DeclinedGain.of(declined).text()


def evaluate_cluster(state: ClusterState, model: InterferenceModel,
                     settings: RebalanceSettings | None = None) -> tuple[float, dict[str, float]]:
    """(objective, each guest's predicted performance) of the state as it is."""
    draft, inputs = start_search(state, model, settings or RebalanceSettings())
    return total_objective(draft, inputs), perf_by_guest(draft)


def exhaustive_best(state: ClusterState, model: InterferenceModel, settings: RebalanceSettings | None = None,
                    host: str | None = None) -> tuple[float, dict[str, dict[int, frozenset[int]]]]:
    """The best layout of one host's movable pinned vCPUs by enumeration (tiny hosts, for checking).

    Every movable guest keeps its host; each of its single-pinned vCPUs may go
    to any pCPU its rules allow. Returns (objective of that host, guest -> pins).
    Raises RebalanceInputError when the host has more layouts than `exhaustive_limit`.
    """
    settings = settings or RebalanceSettings()
    draft, inputs = start_search(state, model, settings)
    name = host or next(iter(sorted(draft.hosts)))
    target = draft.hosts[name]
    slots = [(n, v) for n, g in target.guests.items() if g.mode in (PINNED, EXCLUSIVE)
             for v, pins in sorted(target.pins[n].items()) if len(pins) == 1]
    options = []
    for guest, vcpu in slots:
        nodes = locality_nodes(target, target.guests[guest], target.pins[guest])
        cpus = set(target.usable)
        if nodes:
            cpus &= set().union(*(target.node_cpus[n] for n in nodes))
        options.append(sorted(cpus))
    count = math.prod(len(o) for o in options) if options else 1
    if count > settings.exhaustive_limit:
        raise RebalanceInputError(f"host {name}: {count} layouts exceed the exhaustive limit "
                                  f"{settings.exhaustive_limit}")
    base_pins = {n: dict(p) for n, p in target.pins.items()}
    best_value, best_layout = -math.inf, base_pins
    for choice in itertools.product(*options):
        layout = {n: dict(p) for n, p in base_pins.items()}
        for (guest, vcpu), cpu in zip(slots, choice):
            layout[guest][vcpu] = frozenset({cpu})
        for guest, pins in layout.items():
            target.set_pins(guest, pins)
        if violations(draft, target, [g for g, _ in slots]):
            continue
        value = host_objective(inputs, target)
        if value > best_value + 1e-12:
            best_value, best_layout = value, layout
    for guest, pins in base_pins.items():
        target.set_pins(guest, pins)
    return best_value, best_layout
