"""Distributions, degradation and the overhead formula of Freeze'nSense results."""

from __future__ import annotations

import numpy as np
import pytest

from vmplacer.core.model.profile_stats import (
    Distribution,
    degradation,
    measured_share,
    overhead_formula,
    t_quantile_975,
)


def test_distribution_percentiles_and_confidence_interval():
    rng = np.random.default_rng(7)
    values = rng.normal(0.8, 0.05, size=200)
    dist = Distribution.of(values)
    assert dist is not None and dist.n == 200
    assert dist.p50 == pytest.approx(float(np.median(values)))
    assert dist.p10 < dist.p25 < dist.p50 < dist.p75 < dist.p90
    half = 1.96 * values.std(ddof=1) / np.sqrt(200)
    assert dist.ci95_high - dist.mean == pytest.approx(half)
    assert dist.ci95_low < dist.mean < dist.ci95_high
    assert dist.cv == pytest.approx(values.std(ddof=1) / values.mean())
    assert Distribution.of([]) is None
    single = Distribution.of([0.5])
    assert single is not None and single.ci95_low == single.ci95_high == 0.5


def test_confidence_interval_covers_the_true_mean_95_percent_of_the_time():
    rng = np.random.default_rng(11)
    draws = [Distribution.of(rng.normal(0.8, 0.1, size=12)) for _ in range(2000)]
    covered = sum(d.ci95_low <= 0.8 <= d.ci95_high for d in draws) / len(draws)
    assert 0.93 <= covered <= 0.97


def test_small_samples_use_student_t():
    assert t_quantile_975(1) == pytest.approx(12.706)
    assert t_quantile_975(9) == pytest.approx(2.262)
    assert t_quantile_975(500) == pytest.approx(1.96)
    dist = Distribution.of([1.0, 2.0, 3.0])
    assert dist.ci95_high - dist.mean == pytest.approx(4.303 * 1.0 / np.sqrt(3))


def test_degradation_of_half_speed_with_interval():
    rng = np.random.default_rng(3)
    alone = rng.normal(1.0, 0.03, size=60)
    shared = rng.normal(0.5, 0.03, size=60)
    loss = degradation(shared, alone)
    assert loss is not None
    expected = 1 - np.median(shared) / np.median(alone)
    assert loss.estimate == pytest.approx(expected)
    assert loss.ci95_low < loss.estimate < loss.ci95_high
    assert loss.ci95_high - loss.ci95_low < 0.05
    assert loss.by_mean == pytest.approx(1 - shared.mean() / alone.mean())
    assert loss.per_round is not None and loss.per_round.n == 60


def test_degradation_ignores_a_few_wild_samples():
    alone = [1.0] * 30 + [0.01, 0.02]
    shared = [0.5] * 30 + [5.0]
    assert degradation(shared, alone).estimate == pytest.approx(0.5)


def test_degradation_needs_both_series():
    assert degradation([], [1.0]) is None
    assert degradation([0.5], []) is None
    assert degradation([0.5], [0.0]) is None


@pytest.mark.parametrize(
    ("k_s", "t_m", "t_sleep", "expected"),
    [(10, 0.010, 10.0, 0.1 / 10.1), (1, 0.010, 10.0, 0.01 / 10.01), (0, 0.01, 1.0, 0.0), (2, 0.1, 0.0, 1.0)],
)
def test_overhead_formula(k_s, t_m, t_sleep, expected):
    assert overhead_formula(k_s, t_m, t_sleep) == pytest.approx(expected)
    # the seed's claim: t_m = 10 ms, t_sleep = 10 s and K_s <= 10 keep the overhead under 1 %
    assert overhead_formula(10, 0.010, 10.0) <= 0.01


def _row(kind, value, at, neighbours=()):
    return {"kind": kind, "value": value, "at": at,
            "neighbours": [{"name": n, "distance": d, "frozen": f} for n, d, f in neighbours]}


def test_neighbour_losses_take_the_partner_that_ran_alone_and_the_costliest_first():
    from vmplacer.core.model.profile_stats import neighbour_losses

    frozen = [("b", "same-core", True), ("c", "same-llc", True), ("dns", "same-node", False)]
    rows = [_row("zeta_b", 1.0, 10.0, frozen), _row("zeta_b", 2.0, 100.0, frozen)]
    rows += [_row("zeta_p", 0.9, 11.0, [("b", "same-core", True), ("c", "same-llc", False), ("dns", "same-node", False)]),
             _row("zeta_p", 0.5, 12.0, [("b", "same-core", False), ("c", "same-llc", True), ("dns", "same-node", False)]),
             # two running at once: not a pair probe of one neighbour
             _row("zeta_p", 0.4, 13.0, [("b", "same-core", False), ("c", "same-llc", False)])]
    losses = neighbour_losses(rows)
    assert [(r["neighbour"], r["distance"], r["n"]) for r in losses] == [("b", "same-core", 1), ("c", "same-llc", 1)]
    assert losses[0]["degradation"]["estimate"] == pytest.approx(1 - 0.5 / 1.5)  # against every ζb's median
    assert neighbour_losses([_row("zeta_p", 0.5, 1.0, [("b", "same-core", False)])]) == []  # no ζb: nothing


# ----- measured share of isolated performance -------------------------------------------------


def test_measured_share_is_the_ratio_of_the_medians():
    # ζ and ζb taken at different moments: their medians are compared, not pairwise ratios
    zeta = [0.6, 0.8, 0.7]
    zeta_b = [1.0, 0.9, 1.1]
    assert measured_share(zeta, zeta_b) == pytest.approx(float(np.median(zeta)) / float(np.median(zeta_b)))
    assert measured_share(zeta, zeta_b) != pytest.approx(float(np.mean(np.divide(zeta, zeta_b))))


def test_measured_share_needs_both_kinds_of_sample():
    assert measured_share([], [1.0]) is None
    assert measured_share([0.5], []) is None
    assert measured_share([], []) is None


def test_measured_share_without_a_positive_isolated_median_is_unknown():
    assert measured_share([0.5, 0.6], [0.0, 0.0, 0.0]) is None
    assert measured_share([0.5], [0.0, 0.0, 2.0]) is None  # median ζb 0: one sample is not a baseline


def test_measured_share_of_a_single_sample_each():
    assert measured_share([0.3], [0.6]) == pytest.approx(0.5)


def test_measured_share_is_not_moved_by_one_outlier():
    rng = np.random.default_rng(3)
    zeta = list(0.7 * (1 + 0.03 * rng.standard_normal(9)))
    zeta_b = list(1 + 0.03 * rng.standard_normal(9))
    clean = measured_share(zeta, zeta_b)
    assert clean == pytest.approx(0.7, abs=0.03)
    for wild in (0.0, 50.0):
        assert measured_share(zeta[:-1] + [wild], zeta_b) == pytest.approx(clean, abs=0.03)
        assert measured_share(zeta, zeta_b[:-1] + [wild]) == pytest.approx(clean, abs=0.03)
    # the mean of the ratios is what one wild sample drags
    ratios = np.divide(zeta[:-1] + [50.0], zeta_b)
    assert abs(float(ratios.mean()) - clean) > 1.0


def test_measured_share_never_exceeds_the_isolated_performance():
    # ζb is what the guest does alone: noise above it is not a share above 1
    assert measured_share([1.04, 1.02, 1.03], [1.0, 0.99, 1.01]) == 1.0
    assert measured_share([1.0], [1.0]) == 1.0
    assert measured_share([0.0, 0.0], [1.0]) == 0.0
