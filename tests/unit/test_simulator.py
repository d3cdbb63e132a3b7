"""The simulated host: ports, virtual time, hidden ground truth, noise, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vmplacer.lab.simulator import (
    DEFAULT_DISTANCE_FACTORS,
    INSTRUCTIONS_PER_CPU_SECOND,
    GroundTruth,
    SimCluster,
    SimSampler,
    VirtualClock,
)
from vmplacer.core.model.pairs import parse_pairs
from vmplacer.core.topology.host import DistanceClass, uniform_topology
from vmplacer.ports import Clock, DomainGone, FreezableHost, Hypervisor, HypervisorError, Sampler

PAIRS = """# test matrix: % loss of the column workload caused by the row workload
background,A,B,C
A,10,20,0
B,30,5,0
C,0,0,0
"""
LONG = """distance,foreground,background,perf_alone,perf_shared
same-llc,A,B,1.0,0.7
remote-node,A,B,1.0,0.9
same-llc,B,A,2.0,1.6
"""


def cluster(noise=0.0, seed=0, factors=None, text=PAIRS, **kwargs):
    return SimCluster(GroundTruth(parse_pairs(text, "t.csv"), factors), seed=seed, noise=noise, **kwargs)


def test_it_implements_the_ports():
    sim = cluster()
    host = sim.add_host("h1", uniform_topology(cores_per_node=2))
    assert isinstance(host, Hypervisor)
    assert isinstance(host, FreezableHost)
    assert isinstance(sim.sampler(host), Sampler)
    assert isinstance(sim.clock, Clock)


def test_freezable_host_view_states_and_facts():
    sim = cluster()
    host = sim.add_host("h", uniform_topology(cores_per_node=2))
    host.define_domain("pinned", workload="A", vcpupin=[1], workload_class="batch")
    host.define_domain("floating", workload="B", vcpupin={0: {0, 1}}, running=False)
    states = host.domain_states()
    assert states["pinned"].running and states["pinned"].uuid == host.domain("pinned").uuid
    assert states["floating"].state == "paused" and states["floating"].pause_reason == "user"
    facts = host.domain_facts(["pinned", "floating", "ghost"])
    assert set(facts) == {"pinned", "floating"}
    assert facts["pinned"].pcpus == frozenset({1}) and facts["pinned"].labels["workload_class"] == "batch"
    assert facts["floating"].pcpus is None  # may run on every pCPU: not pinned


def test_virtual_clock_moves_only_when_slept_on():
    clock = VirtualClock()
    assert clock.now() == 0.0
    clock.sleep(3600)
    assert clock.now() == 3600.0
    with pytest.raises(ValueError):
        clock.sleep(-1)


def test_alone_runs_at_full_speed_and_progress_is_integrated():
    sim = cluster()
    host = sim.add_host("h", uniform_topology(cores_per_node=2))
    host.define_domain("a", workload="A", vcpupin=[0])
    sim.clock.sleep(2.0)
    assert host.instructions("a") == pytest.approx(2.0 * INSTRUCTIONS_PER_CPU_SECOND)
    assert host.true_performance("a") == pytest.approx(1.0)


def test_ground_truth_combines_neighbours_multiplicatively():
    sim = cluster()
    topo = uniform_topology(cores_per_node=3)
    host = sim.add_host("h", topo)
    host.define_domain("a", workload="A", vcpupin=[0])
    host.define_domain("b1", workload="B", vcpupin=[1])
    host.define_domain("b2", workload="B", vcpupin=[2])
    # B costs A 30 % at the matrix's (reference) distance; two of them: 1 − 0.7·0.7, not 0.6
    assert host.true_performance("a") == pytest.approx(0.7 * 0.7)
    assert host.true_performance("b1") == pytest.approx(0.8 * 0.95)  # A: 20 %, the other B: 5 %


def test_time_sharing_divides_and_paused_domains_neither_progress_nor_interfere():
    sim = cluster()
    host = sim.add_host("h", uniform_topology(cores_per_node=2))
    host.define_domain("a1", workload="A", vcpupin=[0])
    host.define_domain("a2", workload="C", vcpupin=[0])
    host.define_domain("b", workload="B", vcpupin=[1])
    # a1 gets half of pCPU 0; B runs all the time next door: 0.5 · (1 − 0.3)
    assert host.true_performance("a1") == pytest.approx(0.5 * 0.7)
    # b suffers A only half the time (A's share of pCPU 0), C costs nothing
    assert host.true_performance("b") == pytest.approx(1 - 0.2 * 0.5)
    host.suspend("b")
    host.suspend("a2")
    assert host.domain("b").state == "paused" and host.domain("b").pause_reason == "user"
    assert host.true_performance("a1") == pytest.approx(1.0)
    before = host.instructions("b")
    sim.clock.sleep(1.0)
    assert host.instructions("b") == before
    host.resume("b")
    host.resume("a2")
    assert host.true_performance("a1") == pytest.approx(0.35)


def test_distance_factors_scale_the_reference_losses():
    sim = cluster(factors={DistanceClass.REMOTE_NODE: 0.5})
    host = sim.add_host("h", uniform_topology(nodes=2, cores_per_node=1))
    host.define_domain("a", workload="A", vcpupin=[0])
    host.define_domain("b", workload="B", vcpupin=[1])  # other node
    assert host.true_performance("a") == pytest.approx(1 - 0.3 * 0.5)
    assert sim.truth.factors[DistanceClass.SAME_CORE] == DEFAULT_DISTANCE_FACTORS[DistanceClass.SAME_CORE]


def test_long_format_uses_measured_distances_and_scales_the_rest():
    truth = GroundTruth(parse_pairs(LONG, "long.csv"))
    assert truth.loss("B", "A", DistanceClass.SAME_LLC) == pytest.approx(0.3)
    assert truth.loss("B", "A", DistanceClass.REMOTE_NODE) == pytest.approx(0.1)  # measured, not scaled
    # same-node lies between two measured classes: the closer-sharing one (same-llc) is scaled, 0.3·0.6/1.0
    assert truth.loss("B", "A", DistanceClass.SAME_NODE) == pytest.approx(0.18)
    assert truth.loss("A", "B", DistanceClass.SAME_CORE) == pytest.approx(0.2 * 2.0)
    assert truth.loss("A", "UNKNOWN", DistanceClass.SAME_LLC) == 0.0
    assert truth.loss("B", "A", DistanceClass.SAME_CPU) == 0.0


def test_sampler_measures_throughput_with_seeded_noise():
    def samples(seed):
        sim = cluster(noise=0.03, seed=seed)
        host = sim.add_host("h", uniform_topology(cores_per_node=2))
        host.define_domain("a", workload="A", vcpupin=[0])
        host.define_domain("b", workload="B", vcpupin=[1])
        sampler = sim.sampler(host)
        values = []
        for _ in range(400):
            token = sampler.begin(["a"])
            sim.clock.sleep(0.01)
            values.append(sampler.end(token)["a"].value)
        return np.array(values)

    first, again, other = samples(1), samples(1), samples(2)
    assert np.array_equal(first, again)  # reproducible
    assert not np.array_equal(first, other)
    relative = first / (0.7 * INSTRUCTIONS_PER_CPU_SECOND)
    assert relative.mean() == pytest.approx(1.0, abs=0.01)
    assert relative.std() == pytest.approx(0.03, rel=0.2)


def test_sampler_reports_unusable_windows_instead_of_raising():
    sim = cluster()
    topo = uniform_topology(cores_per_node=2)
    host, other = sim.add_host("h", topo), sim.add_host("h2", topo)
    host.define_domain("a", workload="A", vcpupin=[0])
    host.define_domain("p", workload="B", vcpupin=[1], running=False)
    sampler = SimSampler(host)
    token = sampler.begin(["a", "p", "ghost"])
    sim.clock.sleep(0.5)
    host.migrate("a", other)
    result = sampler.end(token)
    assert not result["a"].valid and "not on host" in result["a"].reason
    assert not result["p"].valid and "paused" in result["p"].reason
    assert not result["ghost"].valid
    empty = sampler.begin(["p"])
    assert sampler.end(empty)["p"].reason == "empty window"


def test_pinning_changes_performance_and_is_validated():
    sim = cluster()
    host = sim.add_host("h", uniform_topology(cores_per_node=2))
    host.define_domain("a", workload="A", vcpupin=[0])
    host.define_domain("b", workload="B", vcpupin=[1])
    assert host.true_performance("a") == pytest.approx(0.7)
    host.pin_vcpu("a", 0, frozenset({1}))  # now time-shares pCPU 1 with b, no cross-core loss
    assert host.true_performance("a") == pytest.approx(0.5)
    assert host.domain("a").placement.vcpupin == {0: frozenset({1})}
    with pytest.raises(HypervisorError, match=r"'a'.*vCPU 3"):
        host.pin_vcpu("a", 3, frozenset({0}))
    with pytest.raises(HypervisorError, match=r"'a'.*\[9\]"):
        host.pin_vcpu("a", 0, frozenset({9}))
    host.pin_emulator("a", frozenset({0}))
    assert host.domain("a").placement.emulatorpin == frozenset({0})
    with pytest.raises(DomainGone):
        host.suspend("nobody")


def test_migration_moves_the_domain_and_takes_virtual_time():
    sim = cluster(migration_mib_s=512.0)
    src = sim.add_host("src", uniform_topology(cores_per_node=2))
    dst = sim.add_host("dst", uniform_topology(cores_per_node=4))
    src.define_domain("a", workload="A", vcpupin=[1], memory_kib=1024 * 1024)
    src.define_domain("b", workload="B", vcpupin=[0])
    start = sim.clock.now()
    src.migrate("a", dst)
    assert sim.clock.now() - start == pytest.approx(2.0)  # 1 GiB at 512 MiB/s
    assert [d.name for d in dst.domains()] == ["a"] and [d.name for d in src.domains()] == ["b"]
    # it ran (on src) during the copy, next to b
    assert dst.instructions("a") == pytest.approx(2.0 * 0.7 * INSTRUCTIONS_PER_CPU_SECOND)
    assert src.true_performance("b") == pytest.approx(1.0)
    with pytest.raises(HypervisorError) as slow:
        dst.migrate("a", src, timeout_s=0.5)
    assert slow.value.retriable and [d.name for d in dst.domains()] == ["a"]
    dst.pin_vcpu("a", 0, frozenset({3}))
    with pytest.raises(HypervisorError, match=r"\[3\]") as wrong:
        dst.migrate("a", src)
    assert not wrong.value.retriable


def test_operation_latency_and_injected_failures():
    sim = cluster(op_latency_s=0.001)
    host = sim.add_host("h", uniform_topology(cores_per_node=2))
    host.define_domain("a", workload="A", vcpupin=[0])
    host.suspend("a")
    host.resume("a")
    assert sim.clock.now() == pytest.approx(0.002)
    sim.inject_failure("resume", "a", retriable=True)
    host.suspend("a")
    with pytest.raises(HypervisorError) as failed:
        host.resume("a")
    assert failed.value.retriable and host.domain("a").state == "paused"
    host.resume("a")  # the injected failure was one-shot
    assert host.domain("a").state == "running"


def test_definitions_are_validated():
    sim = cluster()
    host = sim.add_host("h", uniform_topology(cores_per_node=2))
    with pytest.raises(ValueError, match=r"'x'.*'load'"):
        host.define_domain("x", workload="A", vcpupin=[0], load=1.5)
    with pytest.raises(ValueError, match=r"'x'.*\[5\]"):
        host.define_domain("x", workload="A", vcpupin=[5])
    host.define_domain("x", workload="A", vcpupin=[0])
    with pytest.raises(ValueError, match="already defined"):
        host.define_domain("x", workload="A", vcpupin=[1])
    with pytest.raises(ValueError, match="already exists"):
        sim.add_host("h", uniform_topology(cores_per_node=2))
    host.undefine("x")
    assert host.domains() == []


def test_hundreds_of_hosts_run_fast():
    sim = cluster(noise=0.03)
    topo = uniform_topology(cores_per_node=8)
    hosts = [sim.add_host(f"h{i}", topo) for i in range(200)]
    for host in hosts:
        for core in range(8):
            host.define_domain(f"vm{core}", workload="ABC"[core % 3], vcpupin=[core])
    samplers = [sim.sampler(h) for h in hosts]
    tokens = [s.begin([f"vm{c}" for c in range(8)]) for s in samplers]
    sim.clock.sleep(60.0)
    results = [s.end(t) for s, t in zip(samplers, tokens)]
    assert all(sample.valid for result in results for sample in result.values())
    assert math.isfinite(sum(sample.value for result in results for sample in result.values()))
