"""The lab's fleet round: parallel work costs its slowest task per wave on the virtual clock,
and a whole round over a few simulated hosts plans each host once, its profile step costing
the slowest host's profiler run, not their sum. Every expected time is derived from durations
the test sets (sleeps, t_m, t_sleep, the profile duration, the demand window)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from vmplacer.adapters.db import migrate
from vmplacer.app.host_fanout import for_each_host
from vmplacer.app.observe.profiler import ProfilerConfig
from vmplacer.core.model.pairs import parse_pairs
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.topology.host import uniform_topology
from vmplacer.lab.fleet_round import (
    DEMAND_WINDOW_S,
    FleetRound,
    ForkJoinClock,
    add_fleet_host,
    fork_join,
    pool_span,
)
from vmplacer.lab.simulator import SimCluster

MATRIX = Path(__file__).resolve().parents[1] / "data" / "interference" / "amdfx8120_sibling_pairs.csv"


def test_pool_span_is_the_in_order_first_free_rule():
    assert pool_span([5.0, 2.0, 4.0], 3) == 5.0  # all at once: the slowest
    assert pool_span([5.0, 2.0, 4.0], 2) == 6.0  # the third waits for the second's slot (2 + 4)
    assert pool_span([5.0, 2.0, 4.0], 1) == 11.0  # one worker: the sum
    with pytest.raises(ValueError, match="slots"):
        pool_span([1.0], 0)


@pytest.mark.parametrize(("limit", "expected"), [(3, 5.0), (2, 6.0), (1, 11.0)])
def test_the_products_fan_out_costs_its_slowest_tasks_per_wave(limit, expected):
    clock = ForkJoinClock(100.0)
    durations = {"a": 5.0, "b": 2.0, "c": 4.0}
    seen: dict[str, float] = {}

    def work(host: str) -> str:
        seen[host] = clock.now()
        clock.sleep(durations[host])
        return host

    with fork_join(clock):
        outcomes = for_each_host(list(durations), work, limit=limit)
    assert [o.result for o in outcomes] == ["a", "b", "c"]
    assert clock.now() == pytest.approx(100.0 + expected)
    if limit > 1:  # every task starts at the fork, on a timeline of its own
        assert seen == {"a": 100.0, "b": 100.0, "c": 100.0}
        assert [f.durations for f in clock.fan_outs] == [(5.0, 2.0, 4.0)]


def _profile_round(guests: int, config: ProfilerConfig) -> float:
    """One profiler run's length: rounds of (a t_m freeze per guest + t_sleep) until the duration."""
    assert config.duration_s is not None
    per_round = guests * config.t_m_s + config.t_sleep_s
    return math.ceil(config.duration_s / per_round - 1e-9) * per_round


def test_a_round_plans_each_host_once_and_profiles_them_at_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'round.db'}"
    migrate.upgrade(url)
    table = parse_pairs(MATRIX.read_text(), MATRIX.name)
    cluster = SimCluster(table, seed=3, clock=ForkJoinClock())
    guests = {"h0": 2, "h1": 4, "h2": 6}  # more guests, more freezes per round: a longer profile
    for index, (name, count) in enumerate(guests.items()):
        host = add_fleet_host(cluster, name, uniform_topology(nodes=1, cores_per_node=4, threads_per_core=2, name=name))
        for guest in range(count):
            host.define_domain(f"{name}-vm{guest}", workload=table.workloads[(index + guest) % len(table.workloads)],
                               vcpupin=[guest % 2], workload_class="batch")
    config = ProfilerConfig(t_m_s=0.01, t_sleep_s=0.5, pair_probes=0, duration_s=1.0)
    settings = replace(RebalanceSettings(), trials=False, allow_migration=False)
    runner = FleetRound(cluster, url, settings=settings, config_for=lambda seconds: replace(config, duration_s=seconds))
    try:
        result = runner.run(profile_seconds=1.0)
    finally:
        runner.close()

    report = result.report
    assert report.round is not None and report.round.left == []
    assert result.counts["hosts_done"] == 3 and result.counts["batches"] == 1
    assert result.counts["hosts_planned"] == 3 and result.counts["hosts_planned_once"]
    assert result.counts["profiler_runs"] == 3 + result.counts["probes"]  # a profile per host, a run per probe

    lengths = {name: _profile_round(count, config) for name, count in guests.items()}
    steps = {s.name.split(" ", 1)[1]: s.seconds for s in report.steps if s.name.startswith("profile ")}
    assert steps == pytest.approx(lengths)
    # the profile step costs its slowest host, not the sum of the three
    assert result.phases["profile"] == pytest.approx(max(lengths.values()))
    assert result.phases["profile"] < sum(lengths.values()) - 1.0
    # the hosts are read (each with its demand window) at once too
    reads = [f for f in result.fan_outs if f.kind == "read"]
    assert [f.span_s for f in reads] == pytest.approx([DEMAND_WINDOW_S])
    # the round's time on the clock is its steps' times, one after another
    virtual = sum(result.phases.values()) - sum(result.compute_s.values())
    assert result.virtual_s == pytest.approx(virtual)
