"""Why vmplacer ended below a simple rule: threshold, declined, search or model."""

from __future__ import annotations

import pytest

from vmplacer.lab.verdicts import Reach, perfect_model_moves, reach, step_threshold, verdict
from vmplacer.core.rebalance.plan import Plan

MEANS = {"none": 0.7, "seed_policy": 0.80, "blind_spread": 0.90, "vmplacer": 0.85, "optimum": 0.95}


def plan(declined=()):
    return Plan(actions=(), hosts=("h",), state="empty", summary="",
                settings={"notes": {"declined": list(declined)}})


DECLINED = {"move": "vCPU 0 of a: pCPU 0 → 2", "predicted_gain": 0.2, "sure_gain": 0.02, "confidence": 0.1,
            "cost": 0.0, "threshold": 0.05, "declined_by": "confidence"}


def test_within_half_a_percent_is_ok():
    result = verdict({**MEANS, "vmplacer": 0.8960}, None, [plan()], 0.05)
    assert result["verdict"] == "ok" and result["versus"] == "blind_spread"


def test_a_declined_gain_the_model_saw_is_told_apart():
    result = verdict(MEANS, {"blind_spread": 3.6, "vmplacer": 3.4}, [plan([DECLINED])], 0.05)
    assert result["verdict"] == "declined" and "confidence" in result["why"]


def test_a_model_that_prefers_its_own_layout_is_a_model_error():
    result = verdict(MEANS, {"blind_spread": 3.3, "vmplacer": 3.4}, [plan([DECLINED])], 0.05)
    assert result["verdict"] == "model" and result["model_prefers_simple_by"] < 0


def test_a_better_layout_no_plan_offered_is_a_search_failure():
    result = verdict(MEANS, {"blind_spread": 3.6, "vmplacer": 3.4}, [plan()], 0.05)
    assert result["verdict"] == "search"


def _reaches(gain: float, migrations: int = 0):
    return {"blind_spread": Reach(gain, migrations), "seed_policy": Reach(-0.2, 0)}


def test_a_step_a_perfect_model_declines_too_is_a_threshold_not_a_loss():
    result = verdict(MEANS, {"blind_spread": 3.3, "vmplacer": 3.4}, [plan()], 0.05, reaches=_reaches(0.04))
    assert result["verdict"] == "threshold" and result["threshold"] == 0.05 and "min_gain" in result["why"]
    moved = verdict(MEANS, {"blind_spread": 3.3, "vmplacer": 3.4}, [plan()], 0.05,
                    reaches=_reaches(0.08, migrations=1), min_migration_gain=0.1)
    assert moved["verdict"] == "threshold" and moved["migrations"] == 1 and "min_migration_gain" in moved["why"]


def test_a_true_gain_at_the_threshold_is_still_judged_by_the_model():
    assert verdict(MEANS, {"blind_spread": 3.3, "vmplacer": 3.4}, [plan()], 0.05,
                   reaches=_reaches(0.05))["verdict"] == "model"
    assert verdict(MEANS, {"blind_spread": 3.3, "vmplacer": 3.4}, [plan()], 0.05,
                   reaches=_reaches(0.08, migrations=1), min_migration_gain=0.05)["verdict"] == "model"


def test_reach_sums_true_performance_and_counts_guests_on_another_host():
    performance = {"vmplacer": {"a": 0.5, "b": 0.9, "c": 1.0}, "blind_spread": {"a": 0.8, "b": 0.8, "c": 1.0}}
    hosts = {"vmplacer": {"a": "h1", "b": "h1", "c": "h2"}, "blind_spread": {"a": "h2", "b": "h1", "c": "h2"}}
    step = reach(performance, hosts, "blind_spread")
    assert step.migrations == 1 and abs(step.true_gain - 0.2) < 1e-9


def test_on_interchangeable_hosts_the_renaming_that_moves_fewest_guests_counts():
    performance = {"vmplacer": {"a": 0.5, "b": 0.9, "c": 1.0}, "blind_spread": {"a": 0.8, "b": 0.8, "c": 1.0}}
    hosts = {"vmplacer": {"a": "h1", "b": "h1", "c": "h2"}, "blind_spread": {"a": "h2", "b": "h2", "c": "h1"}}
    assert reach(performance, hosts, "blind_spread").migrations == 3
    assert reach(performance, hosts, "blind_spread", interchangeable=True).migrations == 0


def test_the_step_to_the_optimum_is_judged_against_its_own_threshold():
    repin = step_threshold(Reach(0.04, 0), 0.05, 0.1)
    assert repin["within_threshold"] and (repin["threshold_name"], repin["threshold"]) == ("min_gain", 0.05)
    migration = step_threshold(Reach(0.08, 1), 0.05, 0.1)
    assert migration["within_threshold"] and migration["threshold_name"] == "min_migration_gain"
    assert not step_threshold(Reach(0.12, 2), 0.05, 0.1)["within_threshold"]
    assert not step_threshold(Reach(0.05, 0), 0.05, 0.1)["within_threshold"]  # at the threshold: a step to take


def test_the_threshold_of_a_step_on_one_host_scales_with_its_guests_as_the_planner_does():
    """Four guests on the host the step changes: with min_gain_share 0.005 a step of +0.03 clears
    0.02, so falling short of it is the model's, not the hysteresis's."""
    step = {"blind_spread": Reach(0.03, 0, guests=4), "seed_policy": Reach(-0.2, 0)}
    objectives = {"blind_spread": 3.3, "vmplacer": 3.4}
    assert verdict(MEANS, objectives, [plan()], 0.05, reaches=step)["verdict"] == "threshold"
    scaled = verdict(MEANS, objectives, [plan()], 0.05, reaches=step, min_gain_share=0.005)
    assert scaled["verdict"] == "model"
    assert step_threshold(Reach(0.03, 0, guests=4), 0.05, 0.01, 0.005)["threshold"] == 0.02
    assert step_threshold(Reach(0.03, 0, guests=20), 0.05, 0.01, 0.005)["within_threshold"]


def test_reach_counts_the_guests_of_the_hosts_whose_guests_the_step_changes():
    performance = {"vmplacer": {"a": 0.5, "b": 0.9, "c": 1.0, "d": 1.0},
                   "blind_spread": {"a": 0.8, "b": 0.8, "c": 1.0, "d": 1.0}}
    hosts = {"vmplacer": {"a": "h1", "b": "h1", "c": "h2", "d": "h2"},
             "blind_spread": {"a": "h1", "b": "h1", "c": "h2", "d": "h2"}}
    step = reach(performance, hosts, "blind_spread")
    assert (step.migrations, step.guests) == (0, 2), "h2's guests are not part of the step"


def test_with_the_planners_fairness_a_step_that_starves_a_guest_gains_less():
    """The planner's objective is Σ p − φ·max(0, 1 − p)²: a step that lifts the sum by starving a
    guest is worth less to it than the sum says, and a perfect model with that objective judges it so."""
    performance = {"vmplacer": {"a": 0.5, "b": 0.5}, "optimum": {"a": 0.2, "b": 0.85}}
    hosts = {"vmplacer": {"a": "h1", "b": "h1"}, "optimum": {"a": "h1", "b": "h1"}}
    plain = reach(performance, hosts, "optimum")
    fair = reach(performance, hosts, "optimum", fairness=0.25)
    assert plain.true_gain == pytest.approx(0.05)
    # 0.2 − 0.25·0.64 + 0.85 − 0.25·0.0225 − 2·(0.5 − 0.25·0.25) = −0.04063
    assert fair.true_gain == pytest.approx(0.2 - 0.16 + 0.85 - 0.005625 - 2 * (0.5 - 0.0625))
    assert not step_threshold(plain, 0.04, 0.1)["within_threshold"]
    assert step_threshold(fair, 0.04, 0.1)["within_threshold"]


def test_a_perfect_model_takes_only_a_step_that_gains_and_clears_its_threshold():
    assert perfect_model_moves(step_threshold(Reach(0.05, 0, guests=8), 0.05, 0.1, 0.005))
    assert not perfect_model_moves(step_threshold(Reach(0.03, 0, guests=8), 0.05, 0.1, 0.005))
    # already at the step's end: no guest changes, so its threshold is 0, yet there is nothing to take
    assert not perfect_model_moves(step_threshold(Reach(0.0, 0, guests=0), 0.05, 0.1, 0.005))
