"""The benchmark's optimum: every distinct layout of one-vCPU VMs, scored by the simulator's truth."""

from __future__ import annotations

import itertools

import pytest

from vmplacer.lab.simulator import GroundTruth, SimCluster
from vmplacer.lab.optimum import every_layout, best_layout, count_layouts
from vmplacer.core.model.pairs import parse_pairs
from vmplacer.core.topology.host import uniform_topology

PAIRS = """background,A,B,C
A,30,5,12
B,2,40,8
C,15,1,25
"""


@pytest.mark.parametrize("vms, hosts, nodes, cores, threads", [
    (3, 1, 1, 2, 2), (4, 1, 2, 2, 2), (4, 2, 1, 2, 2), (5, 1, 1, 4, 2), (8, 1, 2, 4, 2),
])
def test_the_count_of_distinct_layouts_matches_the_enumeration(vms, hosts, nodes, cores, threads):
    assert len(every_layout(vms, hosts, nodes, cores, threads)) == count_layouts(vms, hosts, nodes, cores, threads)


def _brute_force(table, workloads, hosts, nodes, score):
    """Best `score` of the per-VM true performance over every assignment (the simulator's own arithmetic)."""
    names = [f"vm{i}" for i in range(len(workloads))]
    cluster = SimCluster(table, seed=0, noise=0.0)
    topology = uniform_topology(nodes=nodes, cores_per_node=2, threads_per_core=2)
    for h in range(hosts):
        cluster.add_host(f"h{h}", uniform_topology(nodes=nodes, cores_per_node=2, threads_per_core=2, name=f"h{h}"))
    for name, workload in zip(names, workloads):
        cluster.hosts["h0"].define_domain(name, workload=workload, vcpupin=[0])
    slots = [(f"h{h}", c) for h in range(hosts) for c in sorted(topology.cpus)]
    where = {n: "h0" for n in names}
    best = -float("inf")
    for choice in itertools.product(slots, repeat=len(names)):
        for name, (host, cpu) in zip(names, choice):
            if where[name] != host:
                cluster.hosts[where[name]].migrate(name, cluster.hosts[host])
                where[name] = host
            cluster.hosts[host].pin_vcpu(name, 0, frozenset({cpu}))
        best = max(best, score([cluster.hosts[where[n]].true_performance(n) for n in names]))
    return best


@pytest.mark.parametrize("workloads, hosts, nodes", [("ABC", 1, 2), ("AABC", 1, 1), ("ABCA", 2, 1)])
def test_the_optimum_is_the_best_of_every_assignment_the_simulator_scores(workloads, hosts, nodes):
    table = parse_pairs(PAIRS, "t.csv")
    names = [f"vm{i}" for i in range(len(workloads))]
    found = best_layout(GroundTruth(table), list(workloads), names=names, hosts=hosts, nodes=nodes, cores=2,
                        threads=2)
    best = _brute_force(table, workloads, hosts, nodes, lambda values: sum(values) / len(values))
    assert found.mean == pytest.approx(best, abs=1e-12)
    assert found.layouts == count_layouts(len(names), hosts, nodes, 2, 2)


@pytest.mark.parametrize("workloads, hosts, nodes", [("AABC", 1, 1), ("ABCAB", 1, 1), ("ABCA", 2, 1)])
def test_with_fairness_the_optimum_is_the_best_of_the_planners_objective(workloads, hosts, nodes):
    """vmplacer maximizes Σ p − φ·max(0, 1 − p)², not the mean: its optimum is enumerated too, and
    it is never above the mean's optimum in mean, nor below it in that objective."""
    table = parse_pairs(PAIRS, "t.csv")
    names = [f"vm{i}" for i in range(len(workloads))]

    def objective(values):
        return sum(p - 0.25 * max(0.0, 1.0 - p) ** 2 for p in values) / len(values)

    fair = best_layout(GroundTruth(table), list(workloads), names=names, hosts=hosts, nodes=nodes, cores=2,
                       threads=2, fairness=0.25)
    plain = best_layout(GroundTruth(table), list(workloads), names=names, hosts=hosts, nodes=nodes, cores=2,
                        threads=2)
    assert fair.objective == pytest.approx(_brute_force(table, workloads, hosts, nodes, objective), abs=1e-12)
    assert fair.objective == pytest.approx(objective(fair.per_vm.values()), abs=1e-12)
    assert fair.mean == pytest.approx(sum(fair.per_vm.values()) / len(names), abs=1e-12)
    assert fair.mean <= plain.mean + 1e-12
    assert objective(plain.per_vm.values()) <= fair.objective + 1e-12
    assert plain.objective == pytest.approx(plain.mean, abs=1e-12)  # without fairness "best" is the mean


def test_a_negative_fairness_is_refused_by_name():
    with pytest.raises(ValueError, match="fairness"):
        best_layout(GroundTruth(parse_pairs(PAIRS, "t.csv")), ["A", "B"], hosts=1, nodes=1, cores=2, threads=2,
                    fairness=-0.1)
