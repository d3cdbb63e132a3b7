"""An exact layout the model rates worth it but whose sure gain falls short is measured, not dropped:
it becomes the host's trial, kept only if Freeze'nSense measures it better."""

from __future__ import annotations

from vmplacer.core.rebalance.layout_problem import LayoutProblem, LayoutSolution
from vmplacer.core.rebalance.policy import RebalanceSettings, plan_rebalance

from tests.unit.test_rebalance_pessimism import learned, spread_state

PAIRS_ON_SIBLINGS = {"a": 0, "b": 4, "c": 1, "d": 5}  # a, b on core 0's threads; c, d on core 1's
# min_gain between the layout's predicted gain (+0.47 from one noisy sibling sample per pair) and
# its sure gain (+0.44): the gain clears the threshold, the part of it the data back does not
SETTINGS = RebalanceSettings(min_gain=0.45, min_gain_share=0.0)


class FixedSolver:
    """A LayoutSolver that answers one layout (the search's judgement of it is what is tested)."""

    def __init__(self, where: dict[str, int]):
        self.where = where

    def solve(self, problem: LayoutProblem, *, time_limit_s: float) -> LayoutSolution:
        chosen = tuple(problem.slots.index(("h", self.where[guest])) for guest, _ in problem.items)
        value = problem.objective(chosen)
        return LayoutSolution(chosen, value, "optimal", value, solver="fixed", work=0.0)


def explore_probe(plan):
    return next((a for a in plan.actions if a.kind == "probe" and a.parameters.get("trial", {}).get("kind") == "explore"),
                None)


def test_a_layout_declined_for_confidence_becomes_the_hosts_trial():
    plan = plan_rebalance(spread_state(), learned(sibling_rounds=1), SETTINGS, now=0.0,
                          solver=FixedSolver(PAIRS_ON_SIBLINGS))
    declined = plan.settings["notes"]["declined"][-1]
    assert declined["kind"] == "relayout" and declined["declined_by"] == "confidence"
    assert declined["predicted_gain"] >= 0.45 > declined["sure_gain"]
    tried = [a for a in plan.actions if a.parameters.get("tried")]
    assert {a.guest: next(iter(a.after.vcpupin[0])) for a in tried} == {"b": 4, "c": 1, "d": 5}
    assert all(a.parameters["tried"] == "exact" and a.confidence == 0.0 for a in tried)
    probe = explore_probe(plan)
    assert probe is not None and set(probe.depends_on) == {a.index for a in tried}
    assert plan.actions[0].kind == "probe" and plan.actions[0].parameters.get("baseline"), \
        "the host is measured as it is first, to compare the trial with"
    (offered,) = plan.settings["notes"]["trials"]
    assert offered["what"] == "exact"


def test_a_gain_below_the_threshold_itself_is_not_tried():
    """Forty samples per sibling pair: the same layout's gain is +0.32, below min_gain whatever
    the data say: hysteresis, not doubt, declines it, and there is nothing to measure."""
    plan = plan_rebalance(spread_state(), learned(sibling_rounds=40), SETTINGS, now=0.0,
                          solver=FixedSolver(PAIRS_ON_SIBLINGS))
    assert plan.settings["notes"]["declined"][-1]["declined_by"] == "min_gain"
    assert plan.actions == ()


def test_a_declined_layout_measured_either_way_is_not_tried_again():
    first = plan_rebalance(spread_state(), learned(sibling_rounds=1), SETTINGS, now=0.0,
                           solver=FixedSolver(PAIRS_ON_SIBLINGS))
    trial = explore_probe(first).parameters["trial"]
    here, there = trial["from_key"], trial["to_key"]
    for measured in ({(here, there)}, {(there, here)}):
        again = plan_rebalance(spread_state(), learned(sibling_rounds=1), SETTINGS, now=0.0,
                               solver=FixedSolver(PAIRS_ON_SIBLINGS), measured=measured)
        assert explore_probe(again) is None
    capped = plan_rebalance(spread_state(), learned(sibling_rounds=1), SETTINGS, now=0.0,
                            solver=FixedSolver(PAIRS_ON_SIBLINGS), tried={"h": SETTINGS.trial_max})
    assert explore_probe(capped) is None, "the host's budget is spent"
    off = plan_rebalance(spread_state(), learned(sibling_rounds=1), RebalanceSettings(min_gain=0.45, min_gain_share=0.0, trials=False),
                         now=0.0, solver=FixedSolver(PAIRS_ON_SIBLINGS))
    assert off.actions == ()
