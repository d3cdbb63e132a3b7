"""Why vmplacer ended below a simple rule: declined, search or model."""

from __future__ import annotations

from vmplacer.app.rebalance_verdict import verdict
from vmplacer.core.plan import Plan

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
