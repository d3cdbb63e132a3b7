"""Freeze'nSense samples → model observations: pairing, time sharing, skipped samples."""

from __future__ import annotations

from collections import Counter

import pytest

from vmplacer.app.learn import observations_from_samples
from vmplacer.core.topology import DistanceClass


def sample(guest, kind, value, at, neighbours=(), metric="cpu"):
    return {"guest": guest, "kind": kind, "metric": metric, "value": value, "at": at,
            "neighbours": [{"name": n, "distance": d, "frozen": f} for n, d, f in neighbours]}


def test_zeta_b_pairs_with_nearest_zeta_and_frozen_neighbours_only():
    samples = [
        sample("a", "zeta", 0.50, 10.0),
        sample("a", "zeta", 0.80, 20.0),
        sample("a", "zeta_b", 1.00, 19.0, [("b", "same-core", True), ("x", "same-node", False)]),
    ]
    [obs] = observations_from_samples(samples, {"a": "batch"})
    assert obs.key == "a" and obs.workload_class == "batch"
    assert obs.zeta == 0.80 and obs.zeta_b == 1.00  # t=20 is nearer to t=19 than t=10
    assert [(e.key, e.distance) for e in obs.neighbours] == [("b", DistanceClass.SAME_CORE)]
    assert obs.own_share == 1.0
    assert obs.degradation == pytest.approx(0.2)


def test_same_cpu_neighbours_are_time_sharing_not_interference():
    samples = [
        sample("a", "zeta", 0.5, 1.0),
        sample("a", "zeta_b", 1.0, 1.1, [("b", "same-cpu", True)]),
    ]
    [obs] = observations_from_samples(samples)
    assert obs.neighbours == ()
    assert obs.own_share == 0.5
    assert obs.interference_loss == pytest.approx(0.0)  # all of the loss is time sharing


def test_unknown_distance_and_missing_zeta_are_skipped_and_counted():
    skipped: Counter[str] = Counter()
    samples = [
        sample("a", "zeta", 0.9, 1.0),
        sample("a", "zeta_b", 1.0, 1.1, [("b", "unknown", True)]),
        sample("c", "zeta_b", 1.0, 1.1, [("b", "same-llc", True)]),
        sample("d", "zeta", 0.9, 1.0),
        sample("d", "zeta_b", 0.0, 1.1, [("b", "same-llc", True)]),
    ]
    assert observations_from_samples(samples, skipped=skipped) == []
    assert skipped == Counter({"unknown-distance": 1, "no-zeta": 1, "zero-zeta-b": 1})


def test_metrics_are_never_mixed():
    samples = [
        sample("a", "zeta", 0.5, 1.0, metric="ipc"),
        sample("a", "zeta_b", 1.0, 1.1, [("b", "same-llc", True)], metric="cpu"),
    ]
    skipped: Counter[str] = Counter()
    assert observations_from_samples(samples, skipped=skipped) == []
    assert skipped["no-zeta"] == 1
