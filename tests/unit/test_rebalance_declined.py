"""Declined gains read back typed: the reason is one of the rules that decline, or refused."""

from __future__ import annotations

import pytest

from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.rebalance.declined import DeclinedGain, DeclineReason
from vmplacer.core.rebalance.policy import RebalanceSettings, plan_rebalance

from tests.unit.test_rebalance_judgement import state_two_on_one_pcpu


def test_the_declined_gains_of_a_plan_read_back_with_their_reason():
    for settings, reason in ((RebalanceSettings(max_actions=0), DeclineReason.MAX_ACTIONS),
                             (RebalanceSettings(min_gain=1.0, min_gain_share=0.0), DeclineReason.MIN_GAIN)):
        plan = plan_rebalance(state_two_on_one_pcpu(), InterferenceModel(), settings, now=0.0)
        gain = DeclinedGain.of(plan.settings["notes"]["declined"][-1])
        assert gain.declined_by is reason
        assert gain.predicted_gain > 0 and gain.text() in plan.summary


def test_a_reason_no_rule_gives_is_refused():
    report = {"move": "m", "predicted_gain": 0.2, "sure_gain": 0.1, "confidence": 0.5, "cost": 0.0,
              "threshold": 0.1, "declined_by": "whim"}
    with pytest.raises(ValueError, match="whim"):
        DeclinedGain.of(report)
    with pytest.raises(ValueError, match="'threshold' must be a number"):
        DeclinedGain.of({**report, "declined_by": "min_gain", "threshold": "high"})
