"""Decision quality on big hosts: the rebalancer against no action and the blind spread, in truth.

rebalance_eval.py measures vmplacer against the optimum on hosts of at most 16 pCPUs; on hosts of
112 or 512 pCPUs no optimum can be enumerated, yet that is where floating and dedicated guests
make planning hard (docs/big-hosts.md). Here one simulated host of such a shape runs a guest mix
built by the rules of benchmarks/host_shapes.py (`host_layout`: the same draws in the same order,
so a seed names the same host there and here), and three copies of it are scored by the
simulator's noise-free truth (`performance`: each guest's fraction of its isolated performance):

* start — nothing moves;
* blind_spread — rebalance_eval's interference-blind spread (one-vCPU pinned guests on the least
  crowded pCPUs; floating and dedicated guests stay and count as load);
* vmplacer, in one of two modes (`MODES`):
  - loop — the product's own loop as rebalance_eval's `VmplacerLoop` runs it (Freeze'nSense
    profile → learn → plan → apply through the executor, measured trials included) for `rounds`
    runs of the timer, the model learned only from its own samples of this host;
  - plan — one run of the product's `Rebalancer` with a given model (benchmarks/rebalance.py
    trains it on small simulated hosts, as benchmarks/host_shapes.py plans with it): observe →
    `plan_rebalance` → apply through the executor, without a profile step and so without
    measured trials (`RebalanceSettings.trials` off: a trial's probe is a profile). It exists
    because the shipped profiler costs minutes of CPU per run on a 512-pCPU host of 100
    guests (its neighbour distances are computed per pair of vCPU pieces, in Python).

Floating guests are domains whose vCPUs are pinned to every pCPU of the host (host_shapes'
empty set, which the rebalancer reads the same way) or of one node; dedicated guests carry the
pCPUs they own as vmplacer's domain metadata would (`SimHost.define_domain(exclusive_cpus=…)`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from vmplacer.app.apply.executor import ExecutorSettings
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer, RunOptions, RunReport
from vmplacer.core.model.interference import InterferenceModel, ModelConfig
from vmplacer.core.model.pairs import PairTable
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.layout_problem import LayoutSolver, utility
from vmplacer.core.rebalance.plan import Plan
from vmplacer.core.rebalance.state import RebalanceSettings, describe_guest
from vmplacer.core.topology.host import HostTopology, uniform_topology
from vmplacer.lab.rebalance_eval import (
    DISTANCE_PRIOR,
    MemoryLeaseStore,
    MemoryPlanStore,
    VmplacerLoop,
    blind_spread,
    performance,
)
from vmplacer.lab.simulator import SimCluster, SimHost

# pCPUs -> (nodes, cores per node, threads per core), as benchmarks/host_shapes.py names them
SHAPES: dict[int, tuple[int, int, int]] = {48: (2, 12, 2), 112: (2, 28, 2), 256: (4, 32, 2), 512: (16, 16, 2)}
MIXES = ("pinned", "unpinned", "node", "dedicated")
MEMORY_MIB_PER_PCPU = 8192
GUEST_MIB_PER_VCPU = 2048
HOST = "h0"
WORSE_BY = 0.05  # a guest whose truth drops by more than this share of its start is named
POLICIES = ("start", "blind_spread", "vmplacer")
MODES = ("loop", "plan")


@dataclass(frozen=True)
class BigCase:
    """One host: its shape (pCPUs, a key of SHAPES), guest mix and count, and the seed of its draws."""

    pcpus: int
    mix: str
    guests: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.pcpus not in SHAPES:
            raise ValueError(f"pcpus must be one of {sorted(SHAPES)}, got {self.pcpus!r}")
        if self.mix not in MIXES:
            raise ValueError(f"mix must be one of {', '.join(MIXES)}, got {self.mix!r}")

    @property
    def shape(self) -> str:
        return "x".join(str(n) for n in SHAPES[self.pcpus])


# --------------------------------------------------------------------------- the host's guests
def big_topology(pcpus: int, name: str = HOST) -> HostTopology:
    """The host of `pcpus` pCPUs, 8 GiB of memory per pCPU (host_shapes' hosts)."""
    nodes, cores, threads = SHAPES[pcpus]
    return uniform_topology(nodes=nodes, cores_per_node=cores, threads_per_core=threads,
                            memory_mib_per_node=MEMORY_MIB_PER_PCPU * cores * threads, name=name)


@dataclass(frozen=True)
class _Cores:
    """The host's threads by core, cores by node and pCPUs by node, all in ascending order."""

    threads: dict[int, list[int]]
    by_node: dict[int, list[int]]
    node_cpus: dict[int, frozenset[int]]


def _cores(topology: HostTopology) -> _Cores:
    threads: dict[int, list[int]] = {}
    for cpu in sorted(topology.cpus):
        threads.setdefault(topology.cpus[cpu].core, []).append(cpu)
    by_node: dict[int, list[int]] = {}
    for core, members in sorted(threads.items()):
        by_node.setdefault(topology.cpus[members[0]].node, []).append(core)
    node_cpus = {node: frozenset(c for core in cores for c in threads[core]) for node, cores in by_node.items()}
    return _Cores(threads, by_node, node_cpus)


def _kinds(mix: str, guests: int, cores: _Cores, rng: random.Random) -> tuple[list[str], dict[int, list[int]]]:
    """Each guest's kind (pinned, host2, node8, dedicated) and the cores of each dedicated one.

    Every 4th guest (i % 4 == 3) is the mix's other kind; a dedicated guest takes 4–16 whole
    cores, on one node when one has room, dedicated guests at most half the host's cores
    together; one that does not fit stays pinned."""
    other = {"unpinned": "host2", "node": "node8"}.get(mix)
    kinds = [other if other and i % 4 == 3 else "pinned" for i in range(guests)]
    dedicated: dict[int, list[int]] = {}
    if mix != "dedicated":
        return kinds, dedicated
    free = {node: list(members) for node, members in cores.by_node.items()}
    budget = len(cores.threads) // 2
    for i in range(3, guests, 4):
        size = rng.randint(4, 16)
        if size > budget:
            continue
        roomy = [node for node, members in free.items() if len(members) >= size]
        if roomy:
            chosen = sorted(rng.sample(free[rng.choice(roomy)], size))
        else:
            chosen = sorted(rng.sample([c for members in free.values() for c in members], size))
        free = {node: [c for c in members if c not in chosen] for node, members in free.items()}
        budget -= size
        dedicated[i] = chosen
        kinds[i] = "dedicated"
    return kinds, dedicated


def _placement(kind: str, cores: _Cores, chosen: Sequence[int], shared: Sequence[int],
               rng: random.Random) -> tuple[dict[int, frozenset[int]], dict[str, Any]]:
    """One guest's vcpupin (host-floating vCPUs: the empty set) and its Placement's extra fields."""
    if kind == "pinned":
        return {0: frozenset({rng.choice(shared)})}, {}
    if kind == "host2":
        return {0: frozenset(), 1: frozenset()}, {}
    if kind == "node8":
        node = rng.choice(sorted(cores.node_cpus))
        return {v: cores.node_cpus[node] for v in range(8)}, {}
    pins = {v: frozenset({cores.threads[core][0]}) for v, core in enumerate(chosen)}
    owned = frozenset(c for core in chosen for c in cores.threads[core])
    return pins, {"dedicated": True, "exclusive_cpus": owned}


def host_layout(name: str, pcpus: int, mix: str, guests: int, workloads: Sequence[str],
                seed: int) -> tuple[HostTopology, list[tuple[Placement, dict[str, str]]]]:
    """The host and its guests as benchmarks/host_shapes.py's `build_host` draws them: (topology,
    [(Placement, labels)]), from `random.Random(f"{seed}/{name}/{mix}/{guests}")`."""
    topology = big_topology(pcpus, name)
    rng = random.Random(f"{seed}/{name}/{mix}/{guests}")
    cores = _cores(topology)
    kinds, dedicated = _kinds(mix, guests, cores, rng)
    owned = {c for chosen in dedicated.values() for core in chosen for c in cores.threads[core]}
    shared = [c for c in sorted(topology.cpus) if c not in owned]
    result = []
    for i, kind in enumerate(kinds):
        guest = f"{name}-vm{i:03d}"
        labels = {"workload": rng.choice(list(workloads)), "workload_class": "batch"}
        pins, extra = _placement(kind, cores, dedicated.get(i, ()), shared, rng)
        if kind == "dedicated":
            labels["workload_class"] = "latency-critical"
        result.append((Placement(guest=guest, host=name, vcpupin=pins,
                                 memory_kib=GUEST_MIB_PER_VCPU * 1024 * len(pins), **extra), labels))
    return topology, result


# --------------------------------------------------------------------------- the simulated host
def simulated_pins(placement: Placement, topology: HostTopology) -> dict[int, frozenset[int]]:
    """The domain's vcpupin: a vCPU pinned to the empty set floats over every pCPU of the host."""
    return {v: cpus or topology.online_cpus for v, cpus in placement.vcpupin.items()}


def build_big_host(table: PairTable, case: BigCase, *, noise: float = 0.03) -> SimCluster:
    """A simulated cluster of one host of `case`, its guests' workloads drawn from the truth's."""
    cluster = SimCluster(table, seed=case.seed, noise=noise)
    topology, guests = host_layout(HOST, case.pcpus, case.mix, case.guests, sorted(table.workloads), case.seed)
    host = cluster.add_host(HOST, topology)
    for placement, labels in guests:
        _define(host, placement, labels, topology)
    return cluster


def _define(host: SimHost, placement: Placement, labels: Mapping[str, str], topology: HostTopology) -> None:
    host.define_domain(placement.guest, workload=labels["workload"], workload_class=labels["workload_class"],
                       vcpupin=simulated_pins(placement, topology), memory_kib=placement.memory_kib,
                       exclusive_cpus=placement.exclusive_cpus if placement.dedicated else None)


# --------------------------------------------------------------------------- vmplacer's runs
@dataclass
class Runs:
    """What vmplacer's runs left: the plans they made, their reports and plan store."""

    plans: list[Plan]
    reports: list[RunReport]
    store: MemoryPlanStore
    observations: int
    wall_s: float


def run_loop(cluster: SimCluster, settings: RebalanceSettings, config: ModelConfig, rounds: int,
             solver: LayoutSolver | None) -> Runs:
    """`rounds` runs of vmplacer's loop (profile → learn → plan → apply, trials as configured)."""
    loop = VmplacerLoop(cluster, settings, config, solver=solver)
    began = time.perf_counter()
    plans = loop.run(rounds)
    return Runs(plans, loop.reports, loop.plans, len(loop.observations), time.perf_counter() - began)


def run_plan(cluster: SimCluster, settings: RebalanceSettings, model: InterferenceModel,
             solver: LayoutSolver | None) -> Runs:
    """One run of the product's Rebalancer with `model`: observe, plan, apply through the
    executor; no profile step, so no measured trials."""
    clock = cluster.clock
    store = MemoryPlanStore(clock.now)
    rebalancer = Rebalancer(
        RebalancePorts(hosts=dict(cluster.hosts), plans=store, leases=MemoryLeaseStore(), clock=clock,
                       wall=clock.now, load_model=lambda: model, solver=solver),
        holder="eval", settings=replace(settings, trials=False),
        executor_settings=ExecutorSettings(retries=0, migration_timeout_s=600))
    began = time.perf_counter()
    report = rebalancer.run(RunOptions(profile_seconds=0.0))
    plans = [report.plan] if report.plan is not None else []
    return Runs(plans, [report], store, model.observations, time.perf_counter() - began)


# --------------------------------------------------------------------------- one case
def evaluate_big_host(table: PairTable, case: BigCase, *, mode: str = "loop", rounds: int = 3,
                      model: InterferenceModel | None = None, noise: float = 0.03,
                      settings: RebalanceSettings | None = None, model_config: ModelConfig | None = None,
                      solver: LayoutSolver | None = None) -> dict[str, Any]:
    """start, blind spread and vmplacer (`mode`: loop for `rounds` runs, or one plan with
    `model`), each on its own copy of the case's host; the row.

    Truth per guest is `performance` (noise-free); `truth_gain` is the planner's objective
    (Σ weight · utility, its fairness and latency-critical weight) of the true per-guest
    performance, end minus start, in the units of the plans' `predicted_gain`."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "plan" and model is None:
        raise ValueError("mode plan needs a model")
    settings = settings or RebalanceSettings(max_actions=case.guests)
    start_cluster = build_big_host(table, case, noise=noise)
    per_guest = {"start": performance(start_cluster)}
    blind = build_big_host(table, case, noise=noise)
    blind_moves = blind_spread(blind)
    per_guest["blind_spread"] = performance(blind)
    mine = build_big_host(table, case, noise=noise)
    if mode == "loop":
        runs = run_loop(mine, settings, model_config or ModelConfig(distance_prior=DISTANCE_PRIOR), rounds, solver)
    else:
        assert model is not None
        runs = run_plan(mine, settings, model, solver)
    per_guest["vmplacer"] = performance(mine)
    row = _case_row(start_cluster, case, mode, rounds if mode == "loop" else 1, settings)
    row.update(_truth_rows(per_guest, _weights(start_cluster, settings), settings.fairness))
    row["blind_spread_moves"] = blind_moves
    row["vmplacer_runs"] = _runs_row(runs)
    row["predicted_gain"] = round(sum(p["predicted_gain"] for p in row["vmplacer_runs"]["plans"]), 4)
    row["worse_off"] = {p: worse_off(per_guest["start"], per_guest[p]) for p in ("blind_spread", "vmplacer")}
    row["model_observations"] = runs.observations
    return row


def _case_row(cluster: SimCluster, case: BigCase, mode: str, rounds: int,
              settings: RebalanceSettings) -> dict[str, Any]:
    domains = cluster.hosts[HOST].domains()
    placements = [d.placement for d in domains if d.placement is not None]
    return {"pcpus": case.pcpus, "shape": case.shape, "mix": case.mix, "guests": case.guests, "seed": case.seed,
            "vcpus": sum(d.vcpus for d in domains),
            "floating_guests": sum(1 for p in placements if any(len(pins) > 1 for pins in p.vcpupin.values())),
            "dedicated_guests": sum(1 for p in placements if p.dedicated),
            "mode": mode, "runs": rounds, "max_actions": settings.max_actions}


def _weights(cluster: SimCluster, settings: RebalanceSettings) -> dict[str, float]:
    """Each guest's weight in the planner's objective, as the rebalancer describes it."""
    return {d.name: describe_guest(d.placement, labels=d.labels, settings=settings).weight
            for d in cluster.hosts[HOST].domains() if d.placement is not None}


def planner_objective(values: Mapping[str, float], weights: Mapping[str, float], fairness: float) -> float:
    """The planner's objective (Σ weight · utility) of per-guest performance."""
    names = sorted(values)
    perf = np.asarray([values[n] for n in names])
    return float((utility(perf, fairness) * np.asarray([weights[n] for n in names])).sum())


def _truth_rows(per_guest: Mapping[str, Mapping[str, float]], weights: Mapping[str, float],
                fairness: float) -> dict[str, Any]:
    means = {p: sum(v.values()) / len(v) for p, v in per_guest.items()}
    objective = {p: planner_objective(v, weights, fairness) for p, v in per_guest.items()}
    return {"truth": {p: round(means[p], 4) for p in POLICIES},
            "min_guest": {p: round(min(per_guest[p].values()), 4) for p in POLICIES},
            "vmplacer_minus_start": round(means["vmplacer"] - means["start"], 4),
            "vmplacer_minus_blind_spread": round(means["vmplacer"] - means["blind_spread"], 4),
            "truth_objective": {p: round(objective[p], 4) for p in POLICIES},
            "truth_gain": round(objective["vmplacer"] - objective["start"], 4)}


def worse_off(before: Mapping[str, float], after: Mapping[str, float],
              by: float = WORSE_BY) -> dict[str, list[float]]:
    """Guests whose truth dropped by more than `by` of where they started: name → [before, after]."""
    return {name: [round(before[name], 4), round(after[name], 4)] for name in sorted(before)
            if after[name] < before[name] * (1.0 - by)}


def _runs_row(runs: Runs) -> dict[str, Any]:
    """What vmplacer's runs planned and did: per plan its predicted gain, actions, notes."""
    cpu = [r.plan_cpu_s for r in runs.reports]
    return {"plans": [_plan_row(p) for p in runs.plans], "statuses": [r.status for r in runs.reports],
            "actions_done": _kinds_of(runs.store.moves()), "actions_undone": _kinds_of(runs.store.moves("rolled_back")),
            "plan_cpu_s": {"total": round(sum(cpu), 3), "max": round(max(cpu, default=0.0), 3),
                           "per_run": [round(c, 3) for c in cpu]},
            "wall_s": round(runs.wall_s, 2)}


def _kinds_of(actions: Sequence[Any]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for action in actions:
        kinds[action.kind] = kinds.get(action.kind, 0) + 1
    return dict(sorted(kinds.items()))


def _plan_row(plan: Plan) -> dict[str, Any]:
    notes = plan.settings.get("notes", {}) if isinstance(plan.settings, Mapping) else {}
    row: dict[str, Any] = {"state": plan.state, "actions": _kinds_of(plan.actions),
                           "predicted_gain": round(plan.objective_after - plan.objective_before, 4),
                           "summary": plan.summary}
    for key in ("left_out", "cut_short"):
        if notes.get(key):
            row[key] = [entry["host"] for entry in notes[key]]
    return row
