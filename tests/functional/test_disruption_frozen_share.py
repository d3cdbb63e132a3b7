"""The frozen-share history in the real profile store (SQLite and PostgreSQL, through the
migrations): what `freezes_since` reads back equals what the profiler really froze, a later
run is held to what earlier runs spent, and only the host's recent runs count."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.unit.test_profiler import FakeDomain, FakeHost, ShareSampler, VirtualClock, make_profiler
from vmplacer.adapters.db.profiles import SqlProfileStore
from vmplacer.app.observe.frozen_share import FrozenShareGate
from vmplacer.app.observe.profiler import Profiler, ProfilerConfig
from vmplacer.core.rebalance.frozen_share import HOUR_S, frozen_seconds
from vmplacer.core.topology.host import uniform_topology
from vmplacer.ports import Sample

EPOCH = 1_700_000_000.0  # the profiler's wall clock: the virtual clock moved to 2023 (runs finish now, later)
T_M = 0.01


def four_guests(name: str = "h1") -> FakeHost:
    # pinned to distinct pCPUs of one node, so pair probes qualify
    return FakeHost(*(FakeDomain(n, frozenset({i})) for i, n in enumerate("abcd")), name=name)


class EveryThirdDropped(ShareSampler):
    """Every third frozen sample invalid: the freeze happened, no ζb or ζp of it is stored."""

    def __init__(self, host: FakeHost):
        super().__init__(host)
        self.frozen_windows = 0

    def end(self, token):  # type: ignore[no-untyped-def]
        samples = super().end(token)
        if len(self.host.running()) == len(self.host.domains):
            return samples  # a ζ window: nothing frozen
        self.frozen_windows += 1
        if self.frozen_windows % 3:
            return samples
        return {n: Sample(n, "cpu", 0.0, s.window_s, valid=False, reason="counter reset: test")
                for n, s in samples.items()}


def run_profiler(host: FakeHost, store: SqlProfileStore, clock: VirtualClock, *, gate=None,
                 duration_s: float = 5.0, pair_probes: int = 2):
    config = ProfilerConfig(t_m_s=T_M, t_sleep_s=0.5, duration_s=duration_s, pair_probes=pair_probes)
    _, freezer, _ = make_profiler(host, config, clock=clock, freezer_clock=clock.now)
    sampler = EveryThirdDropped(host)
    profiler = Profiler(host, sampler, freezer, config, clock=clock, wall=lambda: EPOCH + clock.now(),
                        store=store, topology=uniform_topology(nodes=1, cores_per_node=4, threads_per_core=1),
                        frozen_share=gate)
    try:
        return profiler.run()
    finally:
        freezer.close()


def test_stored_freezes_equal_what_the_profiler_froze(sessions):
    store = SqlProfileStore(sessions)
    host, clock = four_guests(), VirtualClock()
    result = run_profiler(host, store, clock, gate=FrozenShareGate(0.0, store.freezes_since))  # 0: counted only
    assert result.pair_freezes > 0 and host.running() == set("abcd")
    assert sum(sum(vm.dropped.values()) for vm in result.vms.values()) > 0
    suspends = Counter(name for op, name, _ in host.log if op == "suspend")
    records = store.freezes_since("h1", EPOCH, None)
    assert len(records) == result.freezes  # a pair probe's two rows are one freeze
    assert frozen_seconds(records, EPOCH) == pytest.approx({name: count * T_M for name, count in suspends.items()})
    # the run itself left out; another host's runs never count
    assert store.freezes_since("h1", EPOCH, result.run_id) == []
    assert store.freezes_since("h2", EPOCH, None) == []
    # the freezes stored without a sample are not measurements to any other reader
    assert {row["kind"] for row in store.samples(result.run_id)} == {"zeta", "zeta_b", "zeta_p"}


def test_a_later_run_is_held_to_what_earlier_runs_froze(sessions):
    store = SqlProfileStore(sessions)
    host, clock = four_guests(), VirtualClock()
    first = run_profiler(host, store, clock, gate=FrozenShareGate(0.0, store.freezes_since))
    spent = frozen_seconds(store.freezes_since("h1", EPOCH, None), EPOCH)
    # a share every guest has already used up but for one more freeze of the most-frozen guest
    share = (max(spent.values()) + T_M / 2) / HOUR_S
    host.log.clear()
    second = run_profiler(host, store, clock, gate=FrozenShareGate(share, store.freezes_since))
    assert second.run_id != first.run_id
    assert [entry for entry in host.log if entry[0] == "suspend"] == []  # nobody frozen again
    assert host.running() == set("abcd")
    stored = store.run(second.run_id)
    assert stored is not None and set(stored.results["frozen_share"]["spared"]) == set("abcd")


def test_freezes_older_than_the_window_do_not_count(sessions):
    store = SqlProfileStore(sessions)
    host, clock = four_guests(), VirtualClock()
    run_profiler(host, store, clock, gate=FrozenShareGate(0.0, store.freezes_since))
    later = EPOCH + clock.now() + HOUR_S + 1.0
    assert store.freezes_since("h1", later - HOUR_S, None) == []
    spent = frozen_seconds(store.freezes_since("h1", EPOCH, None), EPOCH)
    gate = FrozenShareGate(max(spent.values()) / HOUR_S, store.freezes_since)
    gate.start("h1", None)
    assert gate.spare(list("abcd"), T_M, now=EPOCH + clock.now()) != {}
    assert gate.spare(list("abcd"), T_M, now=later + gate.refresh_s) == {}
