"""The simulated benchmark's cases: overcommitted starts and hungry + compute-bound mixes."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmplacer.lab.rebalance_eval import Case, HostShape, starting_point
from vmplacer.core.model.pairs import parse_pairs

DATA = Path(__file__).resolve().parents[1] / "data" / "interference"


def table(name: str = "exynos4412_arm_pairs.csv"):
    return parse_pairs((DATA / name).read_text(), name)


def test_an_overcommitted_sibling_start_time_shares_in_the_same_order():
    case = Case("siblings", 1, 11, HostShape(1, 4, 2), seed=0)
    start = starting_point(table(), case)
    cpus = [start.placement[f"vm{i}"][1] for i in range(11)]
    assert cpus[:8] == [0, 4, 1, 5, 2, 6, 3, 7]  # both threads of each core in turn
    assert cpus[8:] == cpus[:3]  # the rest on the same pCPUs again


def test_the_any_mix_draws_the_same_workloads_as_before():
    """Adding mixes changed no earlier case: `any` draws exactly what the plain case drew."""
    plain = starting_point(table(), Case("random", 1, 8, HostShape(1, 4, 2), seed=3))
    explicit = starting_point(table(), Case("random", 1, 8, HostShape(1, 4, 2), seed=3, mix="any"))
    assert plain.workloads == explicit.workloads and plain.placement == explicit.placement


@pytest.mark.parametrize("name", ["amdfx8120_sibling_pairs.csv", "e7600_2core_pairs.csv", "exynos4412_arm_pairs.csv"])
def test_hungry_and_compute_bound_guests_alternate(name):
    pairs = table(name)
    start = starting_point(pairs, Case("random", 1, 9, HostShape(1, 4, 2), seed=1, mix="hungry-compute"))
    weight = {w: pairs.interference()[w] + pairs.sensitivity()[w] for w in pairs.workloads}
    hungry = [weight[start.workloads[f"vm{i}"]] for i in range(0, 9, 2)]
    compute = [weight[start.workloads[f"vm{i}"]] for i in range(1, 9, 2)]
    assert min(hungry) > max(compute)


def test_an_unknown_mix_is_refused():
    with pytest.raises(ValueError, match="mix must be one of"):
        starting_point(table(), Case("random", 1, 4, mix="busy"))
