"""Pair probes: everything frozen but a sensitive VM and one neighbour, both sampled.

The fake host and sampler are the profiler tests' (a domain's ζ is its share of its pCPU
among the running domains), so what a probe measures follows from who it left running.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.unit.test_profiler import FakeDomain, FakeHost, VirtualClock, make_profiler
from vmplacer.app.learn.online import observations_from_samples
from vmplacer.app.observe.profiler import ProfilerConfig, SensitiveSelector
from vmplacer.core.model.profile_stats import overhead_formula
from vmplacer.core.topology.host import DistanceClass, uniform_topology

TOPOLOGY = uniform_topology(nodes=1, cores_per_node=4, threads_per_core=2)  # siblings n, n+4


class ListStore:
    def __init__(self):
        self.samples = []

    def start_run(self, host, metric, parameters):
        return 1

    def add_samples(self, run_id, samples):
        self.samples += samples

    def finish_run(self, run_id, results, status="finished"):
        pass


def _host(*pins: tuple[str, int]) -> FakeHost:
    return FakeHost(*(FakeDomain(name, frozenset({cpu})) for name, cpu in pins))


def _pair_begins(sampler) -> list[tuple[frozenset[str], set[str]]]:
    return [(frozenset(names), running) for names, running in sampler.begins if len(names) == 2]


def test_a_pair_probe_runs_the_two_alone_and_the_least_probed_pairs_go_first():
    host = _host(("a", 0), ("b", 4), ("c", 1), ("d", 2))
    config = ProfilerConfig(t_m_s=0.01, t_sleep_s=0.1, samples=6, pair_probes=2)
    store = ListStore()
    profiler, freezer, sampler = make_profiler(host, config, topology=TOPOLOGY, store=store)
    result = profiler.run()
    freezer.close()

    probes = _pair_begins(sampler)
    assert len(probes) == 2 * result.rounds
    for pair, running in probes:
        assert running == set(pair)  # everyone else frozen, both of the pair running
    counts = Counter(pair for pair, _ in probes)
    assert len(counts) == 6  # every pair of the four ...
    assert max(counts.values()) - min(counts.values()) <= 1  # ... probed in turn
    assert result.pair_freezes == len(probes) and result.freezes == len(probes) + sum(
        len(vm.zeta_b) for vm in result.vms.values())
    assert host.running() == {"a", "b", "c", "d"}
    stored = [s for s in store.samples if s.kind == "zeta_p"]
    assert len(stored) == 2 * len(probes)
    for sample in stored:
        running = [n.name for n in sample.neighbours if not n.frozen]
        assert len(running) == 1 and frozenset((sample.guest, running[0])) in counts
    assert sum(vm.pair_samples for vm in result.vms.values()) == len(stored)


def test_pairs_on_one_pcpu_unpinned_or_excluded_neighbours_are_not_probed():
    host = FakeHost(FakeDomain("a", frozenset({0})), FakeDomain("same-pcpu", frozenset({0})),
                    FakeDomain("floating", None), FakeDomain("infra", frozenset({1})),
                    FakeDomain("b", frozenset({2})))
    config = ProfilerConfig(t_m_s=0.01, t_sleep_s=0.1, samples=4, pair_probes=5, excluded=("infra",),
                            sensitive=SensitiveSelector(frozenset({"a", "same-pcpu", "floating", "b"})))
    profiler, freezer, sampler = make_profiler(host, config, topology=TOPOLOGY)
    profiler.run()
    freezer.close()
    pairs = {pair for pair, _ in _pair_begins(sampler)}
    assert pairs == {frozenset({"a", "b"}), frozenset({"same-pcpu", "b"})}
    for _, running in _pair_begins(sampler):
        assert "infra" in running  # never frozen, as for ζb


def test_no_pair_probe_when_nothing_else_would_be_frozen():
    host = _host(("a", 0), ("b", 1))
    store = ListStore()
    profiler, freezer, _ = make_profiler(
        host, ProfilerConfig(t_m_s=0.01, t_sleep_s=0.1, samples=3, pair_probes=3), topology=TOPOLOGY, store=store)
    result = profiler.run()
    freezer.close()
    assert result.pair_freezes == 0 and result.freezes == 6
    assert {s.kind for s in store.samples} == {"zeta", "zeta_b"}


def test_only_sensitive_vms_start_a_pair_and_the_overhead_counts_the_probes():
    host = _host(("a", 0), ("b", 1), ("c", 2))
    clock = VirtualClock()
    config = ProfilerConfig(t_m_s=0.02, t_sleep_s=0.5, samples=5, pair_probes=1,
                            sensitive=SensitiveSelector(frozenset({"a"})))
    profiler, freezer, sampler = make_profiler(host, config, topology=TOPOLOGY, clock=clock,
                                               freezer_clock=clock.now)
    result = profiler.run()
    freezer.close()
    assert all("a" in pair for pair, _ in _pair_begins(sampler))
    overhead = result.overhead()
    assert overhead["pair_probes_per_round"] == pytest.approx(1.0)
    assert overhead["formula"] == pytest.approx(overhead_formula(2, 0.02, 0.5))
    assert overhead["measured"] == pytest.approx(overhead["formula"], rel=1e-6)


def test_pair_samples_teach_the_partners_beta_alone():
    """b shares a's pCPU; c is a's sibling. ζ mixes both; the probe of (a, c) freezes b."""
    host = _host(("a", 0), ("b", 0), ("c", 4))
    store = ListStore()
    config = ProfilerConfig(t_m_s=0.01, t_sleep_s=0.1, samples=3, pair_probes=2)
    profiler, freezer, _ = make_profiler(host, config, topology=TOPOLOGY, store=store)
    profiler.run()
    freezer.close()
    rows = [{"guest": s.guest, "kind": s.kind, "metric": s.metric, "value": s.value, "at": s.at,
             "neighbours": [{"name": n.name, "distance": n.distance, "frozen": n.frozen} for n in s.neighbours]}
            for s in store.samples]
    skipped: Counter[str] = Counter()
    observations = observations_from_samples(rows, skipped=skipped)
    pair_obs = [o for o in observations if o.key == "a" and len(o.neighbours) == 1
                and o.own_share == 1.0]
    assert pair_obs, "a's probes with c became observations"
    for obs in pair_obs:
        [exposure] = obs.neighbours
        assert (exposure.key, exposure.distance) == ("c", DistanceClass.SAME_CORE)
        assert obs.zeta / obs.zeta_b == pytest.approx(1.0)  # b frozen: no time sharing in the probe
    shared = [o for o in observations if o.key == "a" and o.own_share == 0.5]
    assert shared and all(o.zeta / o.zeta_b == pytest.approx(0.5) for o in shared)


def test_pair_probes_must_not_be_negative():
    with pytest.raises(ValueError, match="pair_probes"):
        ProfilerConfig(pair_probes=-1)
