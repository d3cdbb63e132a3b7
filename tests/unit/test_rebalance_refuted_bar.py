"""Where the model's last planned layout of a host measured worse, its next planned layout there
must measure better to stay (`trial_refuted_bar`), not merely no worse: the confirm trial's
tolerance turns into a bar above zero, on that host only."""

from __future__ import annotations

from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
from vmplacer.core.rebalance.policy import plan_rebalance
from vmplacer.core.rebalance.trial import Measured, close_call, judge

from tests.unit.test_rebalance_pessimism import learned, settings, spread_state

SOLVER = CpSatLayoutSolver()


def confirm_trials(plan) -> list[dict]:
    return [a.parameters["trial"] for a in plan.actions
            if a.kind == "probe" and a.parameters.get("trial", {}).get("kind") == "confirm"]


def test_a_confirm_trial_on_a_refuted_host_must_measure_better_by_the_bar():
    state = spread_state()
    plain = plan_rebalance(state, learned(sibling_rounds=40), settings(), now=0.0, solver=SOLVER)
    refuted = plan_rebalance(state, learned(sibling_rounds=40), settings(), now=0.0, solver=SOLVER, refuted={"h"})
    assert confirm_trials(plain) and [t["tolerance"] for t in confirm_trials(plain)] == [0.0]
    assert [t["tolerance"] for t in confirm_trials(refuted)] == [-0.001]
    probe = next(a for a in refuted.actions if a.kind == "probe" and a.parameters.get("trial"))
    assert "measured worse" in probe.reason and "better by at least 0.001" in probe.reason
    # the same moves either way: the bar decides what stays, not what is planned
    assert [(a.guest, a.after) for a in refuted.actions if a.kind == "repin"] == \
        [(a.guest, a.after) for a in plain.actions if a.kind == "repin"]


def test_the_bar_is_for_refuted_hosts_only_and_zero_turns_it_off():
    state = spread_state()
    other = plan_rebalance(state, learned(sibling_rounds=40), settings(), now=0.0, solver=SOLVER,
                           refuted={"elsewhere"})
    assert [t["tolerance"] for t in confirm_trials(other)] == [0.0]
    off = plan_rebalance(state, learned(sibling_rounds=40), settings(trial_refuted_bar=0.0), now=0.0,
                         solver=SOLVER, refuted={"h"})
    assert [t["tolerance"] for t in confirm_trials(off)] == [0.0]


def test_a_negative_tolerance_keeps_only_a_layout_measured_better_by_it():
    weights = {"a": 1.0, "b": 1.0}
    before = Measured("h", {"a": 0.80, "b": 0.80}, {"a": 3, "b": 3})

    def verdict(a: float):
        return judge(before, Measured("h", {"a": a, "b": 0.80}, {"a": 3, "b": 3}), kind="confirm",
                     weights=weights, fairness=0.0, min_gain=0.005, tolerance=-0.002)

    level = verdict(0.80)  # measured no worse: not enough where the model was wrong lately
    assert not level.keep and "better by at least 0.002" in level.text
    assert verdict(0.806).keep  # +0.003 per guest
    # the close call is judged around the bar, +0.002: a level measurement is measured again
    assert close_call(level, kind="confirm", min_gain=0.005, tolerance=-0.002, margin=0.006)
    assert not close_call(verdict(0.78), kind="confirm", min_gain=0.005, tolerance=-0.002, margin=0.006)
