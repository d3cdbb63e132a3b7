"""The protection loop's pace and freeze budget, and idleness from a guest's own CPU time (pure)."""

from __future__ import annotations

import random

import pytest

from vmplacer.core.protect.decisions import IdleSettings, cpu_busy, idle_now
from vmplacer.core.protect.cadence import CadenceSettings, FreezeBudget, RatioSmoother, next_pace


def test_the_budget_never_lets_a_sliding_window_exceed_its_share():
    budget = FreezeBudget(0.02, 60.0)
    rng = random.Random(7)
    spent: list[tuple[float, float]] = []
    now = 0.0
    for _ in range(2000):
        now += rng.uniform(0.2, 3.0)
        frozen = rng.uniform(0.05, 0.4)
        if budget.allows(now, frozen):
            budget.record(now, frozen)
            spent.append((now, frozen))
    assert spent, "some rounds must have fit"
    for end, _ in spent:  # every window ending at a round end (where the sum can peak)
        in_window = sum(f for at, f in spent if end - 60.0 < at <= end)
        assert in_window <= 0.02 * 60.0 + 1e-9


def test_ready_at_is_when_old_spend_leaves_the_window():
    budget = FreezeBudget(0.1, 10.0)  # 1 s per 10 s
    budget.record(1.0, 0.6)
    budget.record(2.0, 0.3)
    assert budget.allows(3.0, 0.1) and not budget.allows(3.0, 0.2)
    assert budget.ready_at(3.0, 0.2) == pytest.approx(11.0)  # after the 0.6 s of t=1 ages out
    assert budget.allows(11.0, 0.2)
    assert budget.ready_at(3.0, 5.0) == float("inf")  # more than the whole window's budget


def test_the_smoothed_ratio_is_the_median_since_the_last_change():
    smoother = RatioSmoother(3)
    assert [smoother.add("web", r) for r in (0.9, 0.3, 0.85)] == [0.9, pytest.approx(0.6), 0.85]
    assert smoother.add("web", 0.8) == 0.8  # median of 0.3, 0.85, 0.8: the outlier no longer decides
    assert smoother.add("web", None) == 0.8  # a round without a reading keeps the estimate
    smoother.reset(["web"])
    assert smoother.add("web", 0.5) == 0.5


def test_pace_is_fast_while_acting_or_near_the_floor_and_backs_off_while_calm():
    settings = CadenceSettings(fast_interval_s=2.0, slow_interval_s=10.0, fast_samples=5, slow_samples=2,
                               calm_rounds=2, near=0.05)
    assert next_pace(settings, acted=True, margins=[0.3], calm=5).interval_s == 2.0
    assert next_pace(settings, acted=False, margins=[None], calm=5).samples == 5
    assert next_pace(settings, acted=False, margins=[0.01], calm=5).interval_s == 2.0
    calm, paces = 0, []
    for _ in range(6):
        pace = next_pace(settings, acted=False, margins=[0.2], calm=calm)
        calm = pace.calm
        paces.append((pace.interval_s, pace.samples))
    assert paces == [(2.0, 2), (4.0, 2), (8.0, 2), (10.0, 2), (10.0, 2), (10.0, 2)]
    assert next_pace(settings, acted=False, margins=[0.01], calm=5).samples == 2  # near, but not acting


def test_cadence_settings_name_a_bad_field():
    with pytest.raises(ValueError, match="'slow_interval_s'"):
        CadenceSettings(fast_interval_s=5.0, slow_interval_s=2.0)
    with pytest.raises(ValueError, match="'budget'"):
        CadenceSettings(budget=0.0)


def test_cpu_busy_is_cpu_time_per_vcpu_per_second():
    assert cpu_busy((0.0, 10.0), (4.0, 12.0), 1) == pytest.approx(0.5)
    assert cpu_busy((0.0, 10.0), (4.0, 12.0), 2) == pytest.approx(0.25)
    assert cpu_busy(None, (4.0, 12.0), 1) is None
    assert cpu_busy((0.0, 10.0), (4.0, 3.0), 1) is None  # counter went back: restarted


def test_idleness_has_hysteresis_and_needs_a_long_enough_span():
    settings = IdleSettings(idle_below=0.1, busy_above=0.2, min_span_s=1.0)
    assert idle_now(False, 0.05, 2.0, settings) is True
    assert idle_now(True, 0.15, 2.0, settings) is True  # between the thresholds: as it was
    assert idle_now(False, 0.15, 2.0, settings) is False
    assert idle_now(True, 0.5, 2.0, settings) is False
    assert idle_now(False, 0.0, 0.5, settings) is False  # too short to judge
    with pytest.raises(ValueError, match="idle_below"):
        IdleSettings(idle_below=0.3, busy_above=0.2)


def test_a_loop_that_is_not_acting_spreads_its_measurements_over_part_of_the_budget():
    from vmplacer.core.protect.cadence import steady_spacing_s

    settings = CadenceSettings(budget=0.02, steady_share=0.5)
    # 0.18 s of freezing per measurement at 1 % of wall time: one every 18 s
    assert steady_spacing_s(settings, 0.18) == pytest.approx(18.0)
    assert steady_spacing_s(CadenceSettings(budget=0.02, steady_share=1.0), 0.18) == pytest.approx(9.0)


def test_only_acting_or_missing_estimates_make_a_measurement_urgent():
    settings = CadenceSettings()
    assert next_pace(settings, acted=True, margins=[0.2], calm=0).urgent
    assert next_pace(settings, acted=False, margins=[None], calm=0).urgent
    assert not next_pace(settings, acted=False, margins=[0.0], calm=0).urgent  # near the floor
    assert not next_pace(settings, acted=False, margins=[0.3], calm=5).urgent
    below = next_pace(settings, acted=False, margins=[-0.06], calm=5, below=True)
    assert below.urgent and below.samples == settings.fast_samples  # under the floor: look again soon


def test_steady_share_is_checked():
    with pytest.raises(ValueError, match="steady_share"):
        CadenceSettings(steady_share=0.0)


@pytest.mark.parametrize("seed", range(5))
def test_no_window_read_since_start_exceeds_the_budget_it_names(seed):
    """From the start, the share of the time since (or of the last window, once one has passed)
    stays within the budget plus the named start-up allowance; once a window has passed, within the
    budget alone."""
    budget = FreezeBudget(0.02, 60.0, startup_allowance_s=0.3)  # a smaller allowance than the default
    budget.start(100.0)
    rng = random.Random(seed)
    now, spent = 100.0, []
    for _ in range(3000):
        now += rng.uniform(0.1, 2.0)
        frozen = rng.uniform(0.02, 0.25)
        if budget.allows(now, frozen):
            end = now + frozen  # a round lasts at least what it freezes
            budget.record(end, frozen)
            spent.append((end, frozen))
            now = end
    assert len(spent) > 50
    for end, _ in spent:
        in_window = sum(f for at, f in spent if end - 60.0 < at <= end)
        running = end - 100.0
        if running < 60.0:
            assert in_window <= 0.02 * running + 0.3 + 1e-9
            assert in_window / running <= budget.limit_at(end) / running + 1e-9
        else:
            assert in_window <= 0.02 * 60.0 + 1e-9


def test_a_first_round_waits_only_for_what_the_allowance_does_not_cover():
    budget = FreezeBudget(0.02, 300.0, startup_allowance_s=0.5)
    budget.start(0.0)
    assert budget.allows(0.0, 0.4)  # one first round within the allowance: measured at once
    budget.record(0.5, 0.4)
    ready = budget.ready_at(1.0, 0.4)  # 0.8 s fit once 2 % of the time running adds 0.3 s: t + 0.4 ≥ 15
    assert ready == pytest.approx(14.6)
    assert not budget.allows(ready - 0.1, 0.4) and budget.allows(ready, 0.4)
    assert budget.limit_at(400.0) == pytest.approx(6.0)  # a window later, the window's budget alone
    plain = FreezeBudget(0.02, 300.0)  # never started: the sliding window alone (as before)
    assert plain.allows(0.0, 6.0) and not plain.allows(0.0, 6.1)


@pytest.mark.parametrize("seed", range(4))
def test_with_a_whole_window_as_allowance_the_start_changes_nothing(seed):
    """The default allowance is one window's budget: then a started budget allows, and says when it
    will allow, exactly what the sliding window alone does."""
    rng = random.Random(seed)
    started, plain = FreezeBudget(0.02, 60.0, startup_allowance_s=1.2), FreezeBudget(0.02, 60.0)
    started.start(0.0)
    now = 0.0
    for _ in range(500):
        now += rng.uniform(0.05, 1.0)
        frozen = rng.uniform(0.02, 0.3)
        assert started.allows(now, frozen) == plain.allows(now, frozen)
        assert started.ready_at(now, frozen) == pytest.approx(plain.ready_at(now, frozen))
        if plain.allows(now, frozen):
            started.record(now + frozen, frozen)
            plain.record(now + frozen, frozen)
