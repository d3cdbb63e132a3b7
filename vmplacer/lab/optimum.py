"""The best layout of one-vCPU VMs on identical simulated hosts, by the simulator's own truth.

Exhaustive, but over layouts that differ: hosts are interchangeable, so are the
nodes of a host, the cores of a node and the threads of a core. A layout is then
a nested partition of the VMs — into hosts, nodes, cores, pCPUs — and each is
generated once (new groups open in order of first use), which for 8 VMs on a
2-node × 4-core × 2-thread host is 512,355 layouts instead of 16⁸ = 4.3·10⁹.
Time sharing is included (several VMs on one pCPU). Every layout is scored
with the simulator's arithmetic (`SimHost._compute_rates`), vectorised, noise-free;
the best is the optimum the benchmark reports, proven by enumeration.

By default "best" is the highest mean true performance. With `fairness` φ > 0 it
is the highest value of the rebalancer's own objective instead, every guest
weighing 1: mean of p − φ·max(0, 1 − p)² (`layout_problem.utility`). The two
differ where the mean's optimum starves a guest to lift another, and a
rebalancer that maximizes its objective should be measured against both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vmplacer.lab.simulator import GroundTruth
from vmplacer.core.model.interference import distance_matrix
from vmplacer.core.rebalance.layout_problem import utility
from vmplacer.core.topology.host import uniform_topology

DEFAULT_LIMIT = 1_000_000  # layouts; above it the optimum is not computed (memory, time)


@dataclass(frozen=True)
class Optimum:
    mean: float  # mean true performance of the best layout
    per_vm: dict[str, float]
    layout: dict[str, tuple[int, int]]  # vm -> (host index, pCPU)
    layouts: int  # how many distinct layouts were scored
    objective: float = 0.0  # what "best" maximized, per VM (the mean when fairness is 0)


def every_layout(vms: int, hosts: int, nodes: int, cores: int, threads: int) -> np.ndarray:
    """Every nested partition, as [layout, vm] → (host, node, core, thread) group indexes."""
    result: list[tuple[int, ...]] = []
    # shape: host -> node -> core -> number of its pCPUs opened so far
    path: list[tuple[int, int, int, int]] = []

    def walk(shape: list[list[list[int]]]) -> None:
        if len(path) == vms:
            result.append(tuple(x for p in path for x in p))
            return
        for h, host in enumerate(shape):
            for n, node in enumerate(host):
                for c, used in enumerate(node):
                    for t in range(used):  # join an opened pCPU
                        path.append((h, n, c, t))
                        walk(shape)
                        path.pop()
                    if used < threads:  # open the next pCPU of this core
                        node[c] += 1
                        path.append((h, n, c, used))
                        walk(shape)
                        path.pop()
                        node[c] -= 1
                if len(node) < cores:  # open the next core of this node
                    node.append(1)
                    path.append((h, n, len(node) - 1, 0))
                    walk(shape)
                    path.pop()
                    node.pop()
            if len(host) < nodes:  # open the next node of this host
                host.append([1])
                path.append((h, len(host) - 1, 0, 0))
                walk(shape)
                path.pop()
                host.pop()
        if len(shape) < hosts:  # open the next host
            shape.append([[1]])
            path.append((len(shape) - 1, 0, 0, 0))
            walk(shape)
            path.pop()
            shape.pop()

    walk([])
    return np.array(result, dtype=np.int64).reshape(len(result), vms, 4)


def count_layouts(vms: int, hosts: int, nodes: int, cores: int, threads: int) -> int:
    """How many distinct layouts `best_layout` would score (exponential generating functions)."""
    from fractions import Fraction
    from math import factorial

    n = vms + 1

    def mul(a, b):
        out = [Fraction(0)] * n
        for i, x in enumerate(a):
            if x:
                for j in range(n - i):
                    out[i + j] += x * b[j]
        return out

    def up_to(a, k):  # sets of at most k non-empty blocks, each structured as `a`
        total, power = [Fraction(0)] * n, [Fraction(1)] + [Fraction(0)] * (n - 1)
        for j in range(1, k + 1):
            power = mul(power, a)
            total = [t + p / factorial(j) for t, p in zip(total, power)]
        return total

    series = [Fraction(0)] + [Fraction(1, factorial(k)) for k in range(1, n)]
    for size in (threads, cores, nodes, hosts):
        series = up_to(series, size)
    return int(series[vms] * factorial(vms))


def best_layout(truth: GroundTruth, workloads: Sequence[str], *, hosts: int, nodes: int, cores: int,
                threads: int, loads: Sequence[float] | None = None, names: Sequence[str] | None = None,
                limit: int = DEFAULT_LIMIT, chunk: int = 20_000, fairness: float = 0.0) -> Optimum | None:
    """The layout with the best mean true performance, or with `fairness` > 0 the best mean of the
    rebalancer's per-guest utility (None when there are more than `limit`)."""
    if not fairness >= 0:
        raise ValueError(f"best layout: field 'fairness' must be a number >= 0, got {fairness!r}")
    vms = len(workloads)
    names = list(names or [f"vm{i}" for i in range(vms)])
    total = count_layouts(vms, hosts, nodes, cores, threads)
    if total > limit:
        return None
    groups = every_layout(vms, hosts, nodes, cores, threads)
    topology = uniform_topology(nodes=nodes, cores_per_node=cores, threads_per_core=threads)
    n_cores = nodes * cores
    # pCPU id of (node, core within node, thread), in uniform_topology's numbering
    cpu_of = np.array([[[t * n_cores + n * cores + c for t in range(threads)] for c in range(cores)]
                       for n in range(nodes)], dtype=np.int64)
    cpus = sorted(topology.cpus)
    dist = distance_matrix(topology, np.array(cpus, dtype=np.int64))
    tensor = truth.tensor
    kind = truth.indices(workloads)
    load = np.asarray(loads if loads is not None else [1.0] * vms, dtype=float)
    best_value, best_row, best_perf = -np.inf, -1, None
    for start in range(0, len(groups), chunk):
        part = groups[start:start + chunk]
        host = part[:, :, 0]
        cpu = cpu_of[part[:, :, 1], part[:, :, 2], part[:, :, 3]]
        slot = host * len(cpus) + cpu  # [L, V]
        asked = (slot[:, :, None] == slot[:, None, :]) * load[None, None, :]
        granted = load[None, :] * np.minimum(1.0, 1.0 / asked.sum(axis=2))  # [L, V]
        same_host = host[:, :, None] == host[:, None, :]
        d = dist[cpu[:, :, None], cpu[:, None, :]]  # [L, x, y]
        loss = tensor[d, kind[None, None, :], kind[None, :, None]]  # y hurts x
        active = same_host & (slot[:, :, None] != slot[:, None, :])
        factor = np.where(active, np.clip(1.0 - loss * granted[:, None, :], 0.0, None), 1.0)
        perf = granted * factor.prod(axis=2) / np.minimum(load, 1.0)[None, :]
        score = (utility(perf, fairness) if fairness > 0 else perf).mean(axis=1)
        row = int(np.argmax(score))
        if score[row] > best_value + 1e-12:
            best_value, best_row, best_perf = float(score[row]), start + row, perf[row]
    assert best_perf is not None
    chosen = groups[best_row]
    layout = {names[v]: (int(chosen[v, 0]), int(cpu_of[chosen[v, 1], chosen[v, 2], chosen[v, 3]]))
              for v in range(vms)}
    return Optimum(float(best_perf.mean()), {names[v]: float(best_perf[v]) for v in range(vms)}, layout, total,
                   best_value)


def case_optimum(truth: GroundTruth, workloads: dict[str, str], *, hosts: int, nodes: int, cores: int, threads: int,
                 limit: int = DEFAULT_LIMIT, fairness: float = 0.0) -> tuple[dict[str, float], dict[str, object]] | None:
    """`best_layout` in the evaluation's terms: per-VM performance and how it was found."""
    names = sorted(workloads)
    found = best_layout(truth, [workloads[n] for n in names], names=names, hosts=hosts, nodes=nodes, cores=cores,
                        threads=threads, limit=limit, fairness=fairness)
    if found is None:
        return None
    maximized = "mean true performance" if fairness <= 0 else f"mean of p - {fairness:g}·max(0, 1 - p)²"
    return found.per_vm, {"method": "every distinct layout enumerated (hosts, nodes, cores, threads "
                                    "interchangeable; time sharing included)", "layouts": found.layouts,
                          "maximized": maximized, "objective": round(found.objective, 6),
                          "layout": {n: list(v) for n, v in sorted(found.layout.items())}}
