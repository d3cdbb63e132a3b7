"""The protection loop's pure decisions: attribution by the model, throttle in steps down to the
minimum share, release with hysteresis, reasons gone, unlabelled guests never touched."""

from __future__ import annotations

import pytest

from vmplacer.core.placement.bandwidth import CpuBandwidth, throttled_to
from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.rebalance.plan import Plan
from vmplacer.core.protect.decisions import GuestView, LoopSettings, Throttle, attribute, decide, plan_of
from vmplacer.core.protect.policy import Protection
from vmplacer.core.topology.host import uniform_topology

TOPOLOGY = uniform_topology(nodes=1, cores_per_node=4, name="h1")
PROTECTED = Protection(floor=0.8, source="labels")
BATCH = Protection(min_share=0.2, source="labels")
SETTINGS = LoopSettings(step=0.2, release_margin=0.05, release_after=2)


def view(name, protection=Protection(), *, share=1.0, ratio=None, cpu=0, running=True) -> GuestView:
    bandwidth = throttled_to(share) if share < 1 else CpuBandwidth()
    return GuestView(name, protection, running, bandwidth, {0: frozenset({cpu})}, ratio)


def gains_for(guests, victim="web"):
    return {victim: attribute(TOPOLOGY, InterferenceModel(), guests, victim, SETTINGS.step)}


def test_model_blames_the_neighbour_on_the_same_pcpu_not_the_one_elsewhere():
    guests = [view("web", PROTECTED, ratio=0.5), view("batch", BATCH), view("far", BATCH, cpu=2)]
    gains = gains_for(guests)["web"]
    assert gains["batch"] > 0.05 and gains.get("far", 0.0) == pytest.approx(0.0, abs=1e-9)


def test_below_floor_throttles_the_antagonist_one_step():
    guests = [view("web", PROTECTED, ratio=0.5), view("batch", BATCH)]
    decision = decide(guests, [], gains_for(guests), SETTINGS)
    (step,) = decision.steps
    assert (step.kind, step.guest, step.protects) == ("throttle", "batch", "web")
    assert step.before.share == 1.0 and step.after.share == pytest.approx(0.8)
    assert decision.verdicts[0].state == "below"


def test_never_below_min_share_and_then_cannot_hold_is_reported():
    guests = [view("web", PROTECTED, ratio=0.6), view("batch", BATCH, share=0.3)]
    ledger = [Throttle("batch", throttled_to(0.3), CpuBandwidth(), "web")]
    (step,) = decide(guests, ledger, gains_for(guests), SETTINGS).steps
    assert step.after.share == pytest.approx(0.2)  # 0.3 - 0.2 clipped to its minimum
    at_min = [view("web", PROTECTED, ratio=0.7), view("batch", BATCH, share=0.2)]
    decision = decide(at_min, ledger, gains_for(at_min), SETTINGS)
    assert decision.steps == ()
    (verdict,) = decision.cannot_hold
    assert "cannot hold the floor" in verdict.message and "rebalance" in verdict.message


def test_unlabelled_and_protected_neighbours_are_never_throttled():
    guests = [view("web", PROTECTED, ratio=0.4), view("plain"), view("db", Protection(floor=0.9), ratio=0.95)]
    decision = decide(guests, [], gains_for(guests), SETTINGS)
    assert decision.steps == () and decision.verdicts[-1].state == "cannot-hold"


def test_hysteresis_holds_in_the_band_and_releases_after_calm_rounds():
    ledger = [Throttle("batch", throttled_to(0.4), CpuBandwidth(), "web")]
    band = [view("web", PROTECTED, ratio=0.83), view("batch", BATCH, share=0.4)]
    held = decide(band, ledger, gains_for(band), SETTINGS)
    assert held.steps == () and held.verdicts[0].state == "held"
    calm = [view("web", PROTECTED, ratio=0.95), view("batch", BATCH, share=0.4)]
    first = decide(calm, ledger, gains_for(calm), SETTINGS)
    assert first.steps == () and first.calm == {"web": 1}
    second = decide(calm, ledger, gains_for(calm), SETTINGS, first.calm)
    (step,) = second.steps
    assert step.kind == "release" and step.after.share == pytest.approx(0.6) and second.calm == {"web": 0}


def test_last_release_step_restores_the_original_bandwidth_exactly():
    original = CpuBandwidth(100_000, -1, 100_000, -1)
    ledger = [Throttle("batch", throttled_to(0.9), original, "web")]
    guests = [view("web", PROTECTED, ratio=0.99), view("batch", BATCH, share=0.9)]
    (step,) = decide(guests, ledger, gains_for(guests), SETTINGS, {"web": 5}).steps
    assert step.after == original


@pytest.mark.parametrize(("victim", "why"), [
    (None, "no longer on this host"),
    (view("web", PROTECTED, running=False), "is not running"),
    (view("web", Protection(), ratio=0.5), "no longer protected"),
])
def test_throttles_whose_reason_is_gone_are_released_at_once(victim, why):
    ledger = [Throttle("batch", throttled_to(0.2), CpuBandwidth(), "web")]
    guests = [g for g in (victim, view("batch", BATCH, share=0.2)) if g is not None]
    (step,) = decide(guests, ledger, {}, SETTINGS).steps
    assert step.kind == "release" and step.after == CpuBandwidth() and why in step.reason


def test_a_throttled_guest_that_lost_its_label_is_released():
    ledger = [Throttle("batch", throttled_to(0.2), CpuBandwidth(), "web")]
    guests = [view("web", PROTECTED, ratio=0.5), view("batch", Protection(), share=0.2)]
    (step,) = decide(guests, ledger, gains_for(guests), SETTINGS).steps
    assert step.kind == "release" and "no longer throttleable" in step.reason


def test_unmeasured_round_holds():
    guests = [view("web", PROTECTED), view("batch", BATCH)]
    decision = decide(guests, [], {}, SETTINGS)
    assert decision.steps == () and decision.verdicts[0].state == "unmeasured"


def test_decision_becomes_a_plan_of_throttle_actions_that_round_trips():
    guests = [view("web", PROTECTED, ratio=0.5), view("batch", BATCH)]
    plan = plan_of("h1", decide(guests, [], gains_for(guests), SETTINGS), created_at=1.0)
    assert plan.state == "proposed" and [a.kind for a in plan.actions] == ["throttle"]
    assert plan.actions[0].describe() == "throttle batch on h1: unthrottled ⇒ share 0.80 (80000/100000 µs)"
    assert Plan.from_dict(plan.to_dict()).to_dict() == plan.to_dict()
    assert plan.diff() == []
    empty = plan_of("h1", decide([view("web", PROTECTED, ratio=0.83)], [], {}, SETTINGS))
    assert empty.state == "empty" and "holding" in empty.summary


def test_a_release_the_model_says_would_break_the_floor_waits():
    from vmplacer.core.protect.decisions import release_costs

    ledger = [Throttle("batch", throttled_to(0.2), CpuBandwidth(), "web")]
    guests = [view("web", PROTECTED, ratio=0.9), view("batch", BATCH, share=0.2)]
    costs = {"web": release_costs(TOPOLOGY, InterferenceModel(), guests, "web", SETTINGS.step)}
    assert costs["web"]["batch"] > 0.1  # 0.2 → 0.4 takes a sixth of the pCPU back from web
    held = decide(guests, ledger, {}, SETTINGS, {"web": 5}, costs)
    assert held.steps == () and "would cost about" in held.verdicts[0].message
    cheap = {"web": {"batch": 0.02}}
    (step,) = decide(guests, ledger, {}, SETTINGS, {"web": 5}, cheap).steps
    assert step.kind == "release"


def test_an_idle_protected_guest_releases_its_throttles_at_once_and_is_not_measured():
    from dataclasses import replace

    guests = [replace(view("web", PROTECTED), idle=True), view("batch", BATCH, share=0.4)]
    record = Throttle("batch", throttled_to(0.4), CpuBandwidth(), "web")
    decision = decide(guests, [record], {}, SETTINGS)
    (step,) = decision.steps
    assert (step.kind, step.guest, step.after.share) == ("release", "batch", 1.0)
    assert "is idle" in step.reason
    assert [(v.guest, v.state) for v in decision.verdicts] == [("web", "idle")]
