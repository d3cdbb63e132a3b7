"""Leave-one-workload-out ranking from counter profiles, and the statistics under it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vmplacer.core.model.counter_profiles import Profiles
from vmplacer.core.model.pairs import PairTable
from vmplacer.core.model.ranking import rank_workloads
from vmplacer.core.model.stats import pearson, ranks, ridge_toward, rrmse, spearman


def test_rrmse_is_seed_eq_3_6():
    predicted, measured = [1.0, 0.9, 0.5], [0.8, 0.9, 0.4]
    expected = math.sqrt(((0.2 / 0.8) ** 2 + 0 + (0.1 / 0.4) ** 2) / 3)
    assert rrmse(predicted, measured) == pytest.approx(expected)
    with pytest.raises(ValueError):
        rrmse([1.0], [0.0])
    with pytest.raises(ValueError):
        rrmse([1.0, 2.0], [1.0])


def test_correlations():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [5, 5, 5]) == 0.0
    assert list(ranks([10, 20, 20, 5])) == [2.0, 3.5, 3.5, 1.0]
    assert spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)


def test_ridge_toward_a_prior():
    gram = np.array([[4.0]])
    rhs = np.array([4.0])  # least squares alone: β = 1
    assert ridge_toward(gram, rhs, np.array([0.0]), 0.0)[0] == pytest.approx(1.0)
    assert ridge_toward(gram, rhs, np.array([0.0]), 4.0)[0] == pytest.approx(0.5)
    assert ridge_toward(gram, rhs, np.array([3.0]), 4.0)[0] == pytest.approx(2.0)
    # no data in a direction: the prior stays
    assert ridge_toward(np.zeros((1, 1)), np.zeros(1), np.array([0.7]), 0.0)[0] == pytest.approx(0.7)


def table_from(beta: dict[str, dict[str, float]]) -> PairTable:
    losses = {(None, bg, fg): v for bg, row in beta.items() for fg, v in row.items()}
    return PairTable("pairs.csv", tuple(beta), losses)


def test_a_counter_that_explains_the_scores_ranks_them_perfectly():
    rng = np.random.default_rng(3)
    names = [f"W{i}" for i in range(8)]
    pressure = dict(zip(names, np.linspace(0.0, 0.3, 8)))
    fragility = dict(zip(names, rng.permutation(np.linspace(0.1, 1.0, 8))))
    beta = {u: {v: pressure[u] * fragility[v] for v in names} for u in names}
    counts = {
        w: {
            "cycles": 1e9 * (1 + i),  # different run lengths: rates must be per cycle
            "instructions": 1e9 * (1 + i) * 1.2,
            "LLC-stores": 1e9 * (1 + i) * (0.001 + 0.01 * pressure[w]),
            "stalled-cycles-frontend": 1e9 * (1 + i) * (0.1 + 0.3 * fragility[w]),
            "noise-event": 1e9 * (1 + i) * rng.uniform(0, 1),
        }
        for i, w in enumerate(names)
    }
    result = rank_workloads(table_from(beta), Profiles("profiles.csv", counts), top_k=1)
    assert result.interference.spearman == pytest.approx(1.0)
    assert result.sensitivity.spearman == pytest.approx(1.0)
    assert result.interference.counters[0].event == "LLC-stores"
    assert result.sensitivity.counters[0].event == "stalled-cycles-frontend"
    assert result.interference.counters[0].chosen_in == 8
    data = result.to_dict()
    assert set(data) == {"workloads", "sensitivity", "interference", "without_profile"}


def test_ranking_needs_enough_profiled_workloads():
    beta = {w: {v: 0.1 for v in "ABCDE"} for w in "ABCDE"}
    counts = {w: {"cycles": 1.0, "instructions": 1.0} for w in "ABC"}
    with pytest.raises(ValueError, match="at least 4"):
        rank_workloads(table_from(beta), Profiles("p.csv", counts))
    counts = {w: {"cycles": 1.0, "instructions": float(i)} for i, w in enumerate("ABCD")}
    result = rank_workloads(table_from(beta), Profiles("p.csv", counts))
    assert result.without_profile == ("E",)
