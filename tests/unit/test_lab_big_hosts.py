"""The big-host lab (vmplacer/lab/big_hosts.py) on a small host of the same code path: 48 pCPUs
(2 nodes × 12 cores × 2 threads), 12 guests of each mix."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from vmplacer.core.model.interference import InterferenceModel, ModelConfig
from vmplacer.core.model.pairs import parse_pairs
from vmplacer.lab import simulator
from vmplacer.lab.big_hosts import (
    HOST,
    MIXES,
    BigCase,
    build_big_host,
    evaluate_big_host,
    host_layout,
    worse_off,
)
from vmplacer.lab.rebalance_eval import DISTANCE_PRIOR, blind_spread, performance

ROOT = Path(__file__).resolve().parents[2]
PAIRS = ROOT / "tests" / "data" / "interference" / "amdfx8120_sibling_pairs.csv"
GUESTS = 12


@pytest.fixture(scope="module")
def table():
    return parse_pairs(PAIRS.read_text(), PAIRS.name)


@pytest.fixture(scope="module")
def host_shapes():
    spec = importlib.util.spec_from_file_location("host_shapes_benchmark", ROOT / "benchmarks" / "host_shapes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _domains(cluster):
    return {d.name: d for d in cluster.hosts[HOST].domains()}


@pytest.mark.parametrize("mix", MIXES)
def test_the_layout_is_the_one_host_shapes_plans(table, host_shapes, mix):
    workloads = sorted(table.workloads)
    _, mine = host_layout(HOST, 48, mix, GUESTS, workloads, seed=3)
    _, theirs = host_shapes.build_host(HOST, 48, mix, GUESTS, workloads, seed=3)
    assert mine == theirs


def test_host_floating_guests_float_over_every_pcpu_of_the_host(table):
    domains = _domains(build_big_host(table, BigCase(48, "unpinned", GUESTS, seed=1)))
    every = frozenset(range(48))
    floating = [d for i, d in enumerate(sorted(domains.values(), key=lambda d: d.name)) if i % 4 == 3]
    assert len(floating) == 3
    for domain in floating:
        assert domain.vcpus == 2 and all(cpus == every for cpus in domain.placement.vcpupin.values())
    assert sum(1 for d in domains.values() if all(len(c) == 1 for c in d.placement.vcpupin.values())) == 9


def test_node_floating_guests_float_over_one_node(table):
    cluster = build_big_host(table, BigCase(48, "node", GUESTS, seed=1))
    topology = cluster.hosts[HOST].topology()
    nodes = {n: frozenset(c for c in topology.cpus if topology.cpus[c].node == n) for n in topology.nodes}
    floating = [d for d in _domains(cluster).values() if d.vcpus == 8]
    assert len(floating) == 3
    for domain in floating:
        sets = set(domain.placement.vcpupin.values())
        assert len(sets) == 1 and sets.pop() in nodes.values()


def test_dedicated_guests_own_whole_cores_nobody_else_uses(table):
    cluster = build_big_host(table, BigCase(48, "dedicated", GUESTS, seed=1))
    topology = cluster.hosts[HOST].topology()
    domains = _domains(cluster).values()
    dedicated = [d for d in domains if d.placement.dedicated]
    assert dedicated, "seed 1 places dedicated guests"
    owned: set[int] = set()
    for domain in dedicated:
        assert domain.labels["workload_class"] == "latency-critical" and 4 <= domain.vcpus <= 16
        cores = {topology.cpus[c].core for pins in domain.placement.vcpupin.values() for c in pins}
        assert len(cores) == domain.vcpus
        assert domain.placement.exclusive_cpus == frozenset(c for c in topology.cpus if topology.cpus[c].core in cores)
        owned |= domain.placement.exclusive_cpus
    shared = [d for d in domains if not d.placement.dedicated]
    assert all(not (frozenset().union(*d.placement.vcpupin.values()) & owned) for d in shared)


def test_truth_is_deterministic_for_a_seed_and_differs_between_seeds(table):
    first = performance(build_big_host(table, BigCase(48, "node", GUESTS, seed=2)))
    again = performance(build_big_host(table, BigCase(48, "node", GUESTS, seed=2)))
    other = performance(build_big_host(table, BigCase(48, "node", GUESTS, seed=5)))
    assert first == again
    assert first != other
    assert all(0.0 < value <= 1.0 for value in first.values())


def test_grouped_pieces_give_the_plain_truth(table, monkeypatch):
    case = BigCase(48, "unpinned", 24, seed=4)
    monkeypatch.setattr(simulator, "GROUP_PIECES_ABOVE", 1_000_000)
    plain = performance(build_big_host(table, case))
    monkeypatch.setattr(simulator, "GROUP_PIECES_ABOVE", 0)
    grouped = performance(build_big_host(table, case))
    assert plain.keys() == grouped.keys()
    assert all(grouped[name] == pytest.approx(plain[name], rel=1e-9) for name in plain)


def test_the_blind_spread_moves_only_single_pinned_guests_and_never_onto_owned_pcpus(table):
    cluster = build_big_host(table, BigCase(48, "dedicated", GUESTS, seed=1))
    before = _domains(cluster)
    blind_spread(cluster)
    after = _domains(cluster)
    owned = frozenset().union(*(d.placement.exclusive_cpus for d in before.values()))
    for name, domain in after.items():
        if before[name].placement.dedicated:
            assert domain.placement.vcpupin == before[name].placement.vcpupin
        else:
            assert not (domain.placement.vcpupin[0] & owned)
    pinned = [d.placement.vcpupin[0] for d in after.values() if not d.placement.dedicated]
    assert len(set(pinned)) == len(pinned)  # spread: one guest per pCPU while free ones remain


def test_an_exclusive_record_moves_with_a_dedicated_guest_only(table):
    cluster = build_big_host(table, BigCase(48, "dedicated", GUESTS, seed=1))
    host = cluster.hosts[HOST]
    dedicated = next(d for d in host.domains() if d.placement.dedicated)
    plain = next(d for d in host.domains() if not d.placement.dedicated)
    host.set_exclusive_cpus(dedicated.name, frozenset({46, 47}))
    host.set_exclusive_cpus(plain.name, frozenset({46, 47}))
    assert host.domain(dedicated.name).placement.exclusive_cpus == frozenset({46, 47})
    assert host.domain(plain.name).placement.exclusive_cpus == frozenset()


def test_worse_off_names_guests_that_lost_more_than_five_percent():
    assert worse_off({"a": 0.5, "b": 0.5, "c": 0.5}, {"a": 0.47, "b": 0.48, "c": 0.6}) == {"a": [0.5, 0.47]}


@pytest.fixture(scope="module")
def loop_row(table):
    return evaluate_big_host(table, BigCase(48, "node", GUESTS, seed=0), mode="loop", rounds=2)


def test_the_loop_evaluation_returns_every_field(loop_row):
    for key in ("pcpus", "shape", "mix", "guests", "seed", "vcpus", "mode", "truth", "min_guest",
                "vmplacer_minus_start", "vmplacer_minus_blind_spread", "truth_objective", "truth_gain",
                "predicted_gain", "blind_spread_moves", "vmplacer_runs", "worse_off", "model_observations"):
        assert key in loop_row
    assert loop_row["shape"] == "2x12x2" and loop_row["vcpus"] == 9 + 3 * 8
    assert set(loop_row["truth"]) == {"start", "blind_spread", "vmplacer"}
    runs = loop_row["vmplacer_runs"]
    assert len(runs["statuses"]) == 2 and len(runs["plan_cpu_s"]["per_run"]) == 2
    assert loop_row["model_observations"] > 0
    assert set(loop_row["worse_off"]) == {"blind_spread", "vmplacer"}


@pytest.mark.parametrize("mix", MIXES)
def test_vmplacer_never_leaves_truth_below_the_start(table, mix):
    row = evaluate_big_host(table, BigCase(48, mix, GUESTS, seed=0), mode="loop", rounds=2)
    assert row["truth"]["vmplacer"] >= row["truth"]["start"] * 0.99


def test_one_plan_with_a_given_model_is_applied_through_the_executor(table):
    model = InterferenceModel(ModelConfig(distance_prior=DISTANCE_PRIOR))
    row = evaluate_big_host(table, BigCase(48, "pinned", GUESTS, seed=0), mode="plan", model=model)
    runs = row["vmplacer_runs"]
    assert row["mode"] == "plan" and row["runs"] == 1 and len(runs["plans"]) == 1
    assert "probe" not in runs["plans"][0]["actions"]  # no profile step: no measured trials
    moved = sum(runs["actions_done"].values())
    assert (row["truth"]["vmplacer"] != row["truth"]["start"]) == (moved > 0)


def test_a_plan_without_a_model_is_refused(table):
    with pytest.raises(ValueError, match="needs a model"):
        evaluate_big_host(table, BigCase(48, "pinned", GUESTS), mode="plan")
