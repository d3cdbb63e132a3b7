"""The per-guest disruption budget, checked again when a plan is applied.

The planner leaves a guest alone once it moved `rebalance.disruption.max_moves_per_guest_hour`
times in the last hour, but a plan is applied later (an operator's `plans apply` hours after
the dry run, a plan approved through the API): other plans may have moved its guests by then.
So before a move (repin, memory-node change, migration) the executor counts the guest's moves
in the last hour in the plan store (this plan's finished moves included: the store records each
as it finishes) and skips the move at the limit. Probes, throttles and releases move nothing;
undoing a move (a trial's verdict, a roll-back) is always allowed: it puts a guest back.

Two kinds of moves are not checked one by one:

* a continuation — a move that depends on a move of the same guest this plan made (the repin on
  arrival after a migration, the memory that follows a repin): the guest's move was admitted
  with its first step, and refusing the rest would leave it half moved (migrated, not pinned);
* a move of an explore trial (the repins, and migrations, to a trial layout that its probe
  measures and keeps or undoes): the trial is admitted or refused as a whole, at its first move,
  for every guest it moves. Refusing one guest in the middle would leave the host half in the
  trial layout: its probe, depending on every move, would be skipped, and the moves made so far
  would stay, neither measured nor undone. A confirm trial measures the plan's own moves, which
  are checked one by one like any other: what is skipped stays where the planner found it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.ports import PlanStore

log = logging.getLogger(__name__)

MOVE_KINDS = ("repin", "set_memory_nodes", "migrate")
SETTING = "rebalance.disruption.max_moves_per_guest_hour"
FIELD = "max_moves_per_guest_hour"  # its name in a plan's settings and in ExecutorSettings
WINDOW_S = 3600.0


class BudgetSettingError(ValueError):
    """A plan's recorded limit that is not a usable number; names the field."""


def budget_limit(plan: Plan, configured: int | None) -> int:
    """The limit to apply `plan` with: the executor's setting when given, else the plan's own
    (recorded when it was planned), else the default. 0: no limit."""
    if configured is not None:
        return configured
    value = plan.settings.get(FIELD) if isinstance(plan.settings, Mapping) else None
    if value is None:
        return RebalanceSettings().max_moves_per_guest_hour
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BudgetSettingError(f"plan {plan.id}: field 'settings.{FIELD}' must be an integer >= 0, got {value!r}")
    return value


def explore_trial(plan: Plan, action: Action) -> Action | None:
    """The explore trial probe that measures `action`, a move; None when it belongs to none."""
    for probe in plan.actions:
        trial = probe.parameters.get("trial") if probe.kind == "probe" else None
        if isinstance(trial, Mapping) and trial.get("kind") == "explore" and action.index in probe.depends_on:
            return probe
    return None


def is_continuation(plan: Plan, action: Action) -> bool:
    """Whether `action` carries on a move of the same guest this plan made (module docstring)."""
    return any(plan.actions[dep].guest == action.guest and plan.actions[dep].kind in MOVE_KINDS
               and plan.actions[dep].state == "succeeded" for dep in action.depends_on)


class MoveBudget:
    """One plan's run: which moves the budget refuses, and why (action index -> reason)."""

    def __init__(self, plans: PlanStore | None, limit: int, wall: Callable[[], float], stored: bool):
        """`stored`: the plan's own moves are in `plans` (they are counted there as they finish).
        Without a store, or one that cannot count moves (an older double of the port), nothing
        is counted and nothing refused: the planner's check is then the only one."""
        if plans is not None and not callable(getattr(plans, "moves_since", None)):
            log.warning("the plan store %s cannot count moves: %s is not checked when applying",
                        type(plans).__name__, SETTING)
            plans = None
        self.plans = plans
        self.limit = limit
        self.wall = wall
        self.stored = stored
        self._admitted: set[int] = set()  # explore trial probes whose moves were allowed as a whole
        self._lock = threading.Lock()  # lanes share one budget

    def refusals(self, plan: Plan, action: Action) -> dict[int, str]:
        """The actions to skip instead of running `action` (it included), each with its reason;
        empty when it may run."""
        if self.limit <= 0 or self.plans is None or action.kind not in MOVE_KINDS or action.guest is None:
            return {}
        probe = explore_trial(plan, action)
        if probe is None:
            if is_continuation(plan, action):
                return {}
            why = self._over([action.guest], plan).get(action.guest)
            return {} if why is None else {action.index: why}
        with self._lock:
            if probe.index in self._admitted:
                return {}
        members = [plan.actions[i] for i in sorted(probe.depends_on)
                   if plan.actions[i].kind in MOVE_KINDS and plan.actions[i].state == "pending"]
        over = self._over(sorted({m.guest for m in members if m.guest}), plan)
        if not over:
            with self._lock:
                self._admitted.add(probe.index)
            return {}
        first = min(over)
        refused = {}
        for member in members:
            why = over.get(member.guest or "")
            refused[member.index] = (f"{why}; the trial measured by action {probe.index} does not start" if why else
                                     f"the trial measured by action {probe.index} does not start: {over[first]}")
        return refused

    def _over(self, guests: list[str], plan: Plan) -> dict[str, str]:
        """Guest -> why it may not move now, for those of `guests` at the limit."""
        assert self.plans is not None
        try:
            counts = dict(self.plans.moves_since(guests, self.wall() - WINDOW_S))
        except Exception as exc:  # noqa: BLE001 - a budget that cannot be read is not spent blindly
            log.error("plan %s: could not count the moves of %s: %s", plan.id, ", ".join(guests), exc)
            return {g: f"{g}'s moves in the last hour could not be counted ({exc}); {SETTING} is {self.limit}: "
                       "not moved" for g in guests}
        if not self.stored:  # this plan's own moves are not in the store: count them here
            for done in plan.actions:
                if (done.kind in MOVE_KINDS and done.guest is not None and done.guest in guests
                        and done.state in ("succeeded", "rolled_back")):
                    counts[done.guest] = counts.get(done.guest, 0) + (2 if done.state == "rolled_back" else 1)
        return {g: f"{g} moved {counts[g]} times in the last hour, the limit of {SETTING} ({self.limit}): not moved "
                   "again now" for g in guests if counts.get(g, 0) >= self.limit}
