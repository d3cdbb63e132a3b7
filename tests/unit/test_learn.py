"""Freeze'nSense samples → model observations: pairing, time sharing, skipped samples."""

from __future__ import annotations

from collections import Counter

import pytest

from vmplacer.app.learn.online import observations_from_samples
from vmplacer.core.topology.host import DistanceClass


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


def test_a_pair_sample_is_an_equation_in_its_running_neighbour_alone():
    samples = [
        sample("a", "zeta_b", 1.0, 10.0, [("b", "same-core", True), ("c", "same-llc", True),
                                          ("x", "same-node", False)]),
        sample("a", "zeta_b", 0.9, 30.0, [("b", "same-core", True), ("c", "same-llc", True)]),
        sample("a", "zeta_p", 0.7, 11.0, [("b", "same-core", False), ("c", "same-llc", True),
                                          ("x", "same-node", False)]),
    ]
    skipped: Counter[str] = Counter()
    [obs] = observations_from_samples(samples, {"a": "batch", "b": "cache"}, skipped)
    assert (obs.zeta, obs.zeta_b) == (0.7, 1.0)  # the ζb at t=10, nearer than t=30
    assert [(e.key, e.distance, e.workload_class) for e in obs.neighbours] == [
        ("b", DistanceClass.SAME_CORE, "cache")]  # x ran in both: it cancels out
    assert obs.own_share == 1.0
    assert skipped["no-zeta"] == 2  # the ζb samples had no ζ to pair with


def test_pair_samples_without_a_zeta_b_or_a_partner_are_skipped_and_counted():
    skipped: Counter[str] = Counter()
    samples = [
        sample("a", "zeta_p", 0.7, 1.0, [("b", "same-core", False)]),
        sample("c", "zeta", 0.6, 1.0),
        sample("c", "zeta_b", 1.0, 1.0, [("x", "same-llc", False)]),
        sample("c", "zeta_p", 0.7, 1.0, [("x", "same-llc", False)]),
        sample("d", "zeta", 0.6, 1.0),
        sample("d", "zeta_b", 1.0, 1.0, [("b", "unknown", True)]),
        sample("d", "zeta_p", 0.7, 1.0, [("b", "unknown", False)]),
    ]
    observations = observations_from_samples(samples, skipped=skipped)
    assert [o.key for o in observations] == ["c"]  # c's ζ/ζb (no frozen neighbour: no exposure)
    assert skipped == Counter({"pair-without-zeta-b": 1, "pair-without-neighbour": 1, "unknown-distance": 2})
