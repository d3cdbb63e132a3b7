"""Measured trials (core/rebalance/trial.py): the verdict from two measurements, and what is remembered."""

from __future__ import annotations

import pytest

from vmplacer.core.rebalance.trial import (
    Measured,
    TrialError,
    TrialOutcome,
    backoffs,
    close_call,
    combined,
    judge,
    layout_key,
    measured_objective,
    refuted_hosts,
    trial_outcome,
)

WEIGHTS = {"a": 1.0, "b": 1.0}


def measured(**performance: float) -> Measured:
    return Measured("h", performance, {g: 3 for g in performance})


def test_the_objective_is_the_plans_own_per_unit_of_weight():
    # J = Σ w (p − φ (1 − p)²) / Σ w: 0.5 with φ = 0.25 counts 0.5 − 0.0625
    assert measured_objective({"a": 1.0, "b": 0.5}, WEIGHTS, 0.25, ["a", "b"]) == pytest.approx((1.0 + 0.4375) / 2)
    # a heavier guest counts more
    assert measured_objective({"a": 1.0, "b": 0.5}, {"a": 3.0, "b": 1.0}, 0.0, ["a", "b"]) == pytest.approx(3.5 / 4)


def test_an_explore_trial_stays_only_when_measured_better_by_the_minimum_gain():
    before = measured(a=0.80, b=0.80)
    kept = judge(before, measured(a=0.84, b=0.80), kind="explore", weights=WEIGHTS, fairness=0.0,
                 min_gain=0.01, tolerance=0.02)
    assert kept.keep and kept.delta == pytest.approx(0.02)
    assert "kept" in kept.text and "0.800 → 0.820" in kept.text
    small = judge(before, measured(a=0.81, b=0.80), kind="explore", weights=WEIGHTS, fairness=0.0,
                  min_gain=0.01, tolerance=0.02)
    assert not small.keep and "undone" in small.text


def test_a_confirm_trial_is_undone_only_when_measured_clearly_worse():
    before = measured(a=0.80, b=0.80)
    slightly = judge(before, measured(a=0.78, b=0.80), kind="confirm", weights=WEIGHTS, fairness=0.0,
                     min_gain=0.01, tolerance=0.02)
    assert slightly.keep
    worse = judge(before, measured(a=0.70, b=0.80), kind="confirm", weights=WEIGHTS, fairness=0.0,
                  min_gain=0.01, tolerance=0.02)
    assert not worse.keep and worse.delta == pytest.approx(-0.05)


def test_a_verdict_within_the_margin_of_its_bar_is_a_close_call():
    before = measured(a=0.80, b=0.80)

    def verdict(a: float, kind: str):
        return judge(before, measured(a=a, b=0.80), kind=kind, weights=WEIGHTS, fairness=0.0, min_gain=0.01,
                     tolerance=0.0)

    # explore: the bar is min_gain (0.01 per guest); +0.006 and +0.014 are within 0.006 of it
    for a, close in ((0.812, True), (0.828, True), (0.780, False), (0.840, False)):
        v = verdict(a, "explore")
        assert close_call(v, kind="explore", min_gain=0.01, tolerance=0.0, margin=0.006) is close, (a, v.delta)
    # confirm: the bar is −tolerance (0): a measured +0.003 keeps by noise alone, so it is measured again
    assert close_call(verdict(0.806, "confirm"), kind="confirm", min_gain=0.01, tolerance=0.0, margin=0.006)
    assert not close_call(verdict(0.900, "confirm"), kind="confirm", min_gain=0.01, tolerance=0.0, margin=0.006)
    # off, or nothing measured: never
    assert not close_call(verdict(0.812, "explore"), kind="explore", min_gain=0.01, tolerance=0.0, margin=0.0)
    unmeasured = judge(None, measured(a=0.8), kind="explore", weights=WEIGHTS, fairness=0.0, min_gain=0.01,
                       tolerance=0.0)
    assert not close_call(unmeasured, kind="explore", min_gain=0.01, tolerance=0.0, margin=0.006)


def test_only_guests_measured_both_times_count():
    before = measured(a=0.5, b=0.9)
    after = measured(a=0.9, c=0.1)  # b not measured after, c not before: only a compares
    verdict = judge(before, after, kind="explore", weights={"a": 1, "b": 1, "c": 1}, fairness=0.0,
                    min_gain=0.01, tolerance=0.02)
    assert verdict.guests == 1 and verdict.delta == pytest.approx(0.4) and verdict.keep


def test_without_a_measurement_only_what_the_policy_was_sure_of_stays():
    after = measured(a=0.9, b=0.9)
    assert judge(None, after, kind="confirm", weights=WEIGHTS, fairness=0.0, min_gain=0.01, tolerance=0.02).keep
    unbacked = judge(None, after, kind="explore", weights=WEIGHTS, fairness=0.0, min_gain=0.01, tolerance=0.02)
    assert not unbacked.keep and "before the moves" in unbacked.text
    assert not judge(measured(a=0.5), Measured("h"), kind="explore", weights=WEIGHTS, fairness=0.0,
                     min_gain=0.0, tolerance=0.0).keep


def test_a_verdict_rules_kept_or_undone_only_on_a_measurement():
    def ruling(before: Measured | None, kind: str) -> str:
        verdict = judge(before, measured(a=0.9, b=0.9), kind=kind, weights=WEIGHTS, fairness=0.0, min_gain=0.01,
                        tolerance=0.02)
        assert verdict.close_call == "no"
        return verdict.ruling

    assert ruling(measured(a=0.8, b=0.8), "explore") == "kept"
    assert ruling(measured(a=1.0, b=1.0), "confirm") == "undone"
    # nothing to compare: the kind decided (confirm kept, explore undone), and the ruling says so
    assert ruling(None, "confirm") == ruling(None, "explore") == "unmeasured"


def test_bad_input_names_the_field():
    with pytest.raises(TrialError, match="field 'kind'"):
        judge(None, None, kind="guess", weights=WEIGHTS, fairness=0.0, min_gain=0.0, tolerance=0.0)
    with pytest.raises(TrialError, match="guest 'a'.*finite"):
        Measured("h", {"a": float("nan")})


def test_a_layout_key_names_the_pins_not_their_spelling():
    as_sets = {"b": {0: frozenset({3})}, "a": {0: frozenset({1}), 1: frozenset({2, 0})}}
    as_lists = {"a": {"1": [0, 2], "0": [1]}, "b": {"0": [3]}}
    assert layout_key("h", as_sets) == layout_key("h", as_lists)
    assert layout_key("h", as_sets) != layout_key("other", as_sets)
    assert layout_key("h", as_sets) != layout_key("h", {**as_sets, "b": {0: frozenset({2})}})


def test_a_finished_trial_probe_is_remembered_with_its_outcome():
    trial = {"kind": "explore", "from_key": "x", "to_key": "y"}
    assert trial_outcome("probe", "succeeded", {"trial": trial}).kept
    assert not trial_outcome("probe", "rolled_back", {"trial": trial}).kept
    assert trial_outcome("probe", "skipped", {"trial": trial}) is None
    assert trial_outcome("probe", "succeeded", {"seconds": 3}) is None
    assert trial_outcome("repin", "succeeded", {"trial": trial}) is None
    assert trial_outcome("probe", "succeeded", {"trial": {"kind": "explore", "from_key": ""}}) is None


def test_two_measurements_of_one_layout_pool_by_their_samples():
    from vmplacer.core.rebalance.trial import pooled

    profile = Measured("h", {"a": 0.9, "b": 0.5}, {"a": 1, "b": 1})
    probe = Measured("h", {"a": 0.7, "c": 0.4}, {"a": 3, "c": 3})
    both = pooled(profile, probe)
    assert both.performance["a"] == pytest.approx((0.9 + 3 * 0.7) / 4)
    assert both.samples == {"a": 4, "b": 1, "c": 3}
    assert both.performance["b"] == pytest.approx(0.5) and both.performance["c"] == pytest.approx(0.4)
    assert pooled(None, probe) is probe


def outcome(kind: str, kept: bool, at: float, host: str = "h") -> TrialOutcome:
    return TrialOutcome(kind, "from", "to", kept, host, at)


def test_a_host_backs_off_twice_as_long_after_each_planned_layout_that_measured_worse():
    undone = [outcome("confirm", False, 100.0 * i) for i in range(1, 6)]  # at 100, 200, …, 500
    for k in range(1, 6):
        held = backoffs(undone[:k], now=100.0 * k, base_s=600.0, limit_s=86400.0)
        if k == 1:
            assert held == {}, "one layout measured worse: the next run may plan at once"
            continue
        assert held["h"].streak == k
        assert held["h"].until == 100.0 * k + 600.0 * (2 ** (k - 1) - 1)  # 600, 1800, 4200, 9000 s after the last
        assert backoffs(undone[:k], now=held["h"].until, base_s=600.0, limit_s=86400.0) == {}  # over: free again
        assert "last %d planned layouts measured worse" % k in held["h"].why(100.0 * k)


def test_a_kept_trial_ends_the_streak_and_undone_explore_trials_do_not_count():
    undone = [outcome("confirm", False, 10.0), outcome("confirm", False, 20.0)]
    assert backoffs(undone, now=30.0, base_s=600.0, limit_s=86400.0)["h"].streak == 2
    assert backoffs([*undone, outcome("explore", False, 25.0)], now=30.0, base_s=600.0,
                    limit_s=86400.0)["h"].streak == 2
    for kind in ("confirm", "explore"):
        assert backoffs([*undone, outcome(kind, True, 25.0)], now=30.0, base_s=600.0, limit_s=86400.0) == {}
    # order is by time, not by the order the store listed them in
    assert backoffs([outcome("confirm", True, 25.0), *undone], now=30.0, base_s=600.0, limit_s=86400.0) == {}
    # hosts are counted apart
    other = [outcome("confirm", False, 15.0, host="g"), outcome("confirm", True, 16.0, host="g")]
    assert set(backoffs([*undone, *other], now=30.0, base_s=600.0, limit_s=86400.0)) == {"h"}


def test_a_host_is_refuted_while_its_last_confirm_trial_stands_undone():
    """Its last planned layout measured worse: refuted, until a later confirm trial is kept; an
    explore trial, kept or not, tried what the model did not plan and changes nothing."""
    undone = outcome("confirm", False, 10.0)
    assert refuted_hosts([undone]) == {"h"}
    assert refuted_hosts([undone, outcome("explore", True, 20.0), outcome("explore", False, 30.0)]) == {"h"}
    assert refuted_hosts([undone, outcome("confirm", True, 20.0)]) == set()
    assert refuted_hosts([outcome("confirm", True, 20.0), undone]) == set()  # by time, not by listing order
    assert refuted_hosts([outcome("explore", False, 5.0)]) == set()
    assert refuted_hosts([undone, outcome("confirm", True, 20.0, host="g")]) == {"h"}


def test_the_back_off_is_capped_by_the_memory_and_zero_turns_it_off():
    many = [outcome("confirm", False, float(i)) for i in range(2000)]
    held = backoffs(many, now=2000.0, base_s=600.0, limit_s=86400.0)
    assert held["h"].until == 1999.0 + 86400.0
    assert backoffs(many, now=2000.0, base_s=0.0, limit_s=86400.0) == {}


def test_hosts_measured_together_count_the_guest_that_moved_on_both_sides():
    before = combined("h1", [Measured("h1", {"a": 0.6, "b": 0.6}, {"a": 10, "b": 10}),
                             Measured("h2", {"c": 0.9}, {"c": 10})])
    after = combined("h1", [Measured("h1", {"a": 0.9}, {"a": 10}),
                            Measured("h2", {"b": 0.4, "c": 0.5}, {"b": 10, "c": 10})])
    assert before is not None and after is not None
    assert after.performance == {"a": 0.9, "b": 0.4, "c": 0.5} and after.samples["b"] == 10
    verdict = judge(before, after, kind="confirm", weights={"a": 1.0, "b": 1.0, "c": 1.0}, fairness=0.0,
                    min_gain=0.005, tolerance=0.0)
    assert not verdict.keep and verdict.guests == 3 and round(verdict.delta, 6) == -0.1
    # judged alone, the source would have kept the move: its remaining guest does better
    alone = judge(Measured("h1", {"a": 0.6, "b": 0.6}), Measured("h1", {"a": 0.9}), kind="confirm",
                  weights={"a": 1.0, "b": 1.0}, fairness=0.0, min_gain=0.005, tolerance=0.0)
    assert alone.keep
    assert combined("h1", [Measured("h1", {"a": 0.9}), None]) is None, "one side unmeasured: no comparison"


def test_a_joint_trial_names_every_host_it_measured():
    from vmplacer.core.rebalance.trial import trial_outcome

    trial = {"kind": "explore", "hosts": ["h1", "h2"], "from_key": "f", "to_key": "t"}
    joint = trial_outcome("probe", "rolled_back", {"trial": trial}, "h1", 5.0)
    assert joint is not None and joint.budget_hosts == ("h1", "h2") and not joint.kept
    alone = trial_outcome("probe", "succeeded", {"trial": {**trial, "hosts": None}}, "h1", 5.0)
    assert alone is not None and alone.budget_hosts == ("h1",)
