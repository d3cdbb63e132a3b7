"""Rebalancing policies compared on simulated hosts, measured by the simulator's ground truth.

One case: a pair matrix (the simulator's hidden truth), hosts, one-vCPU VMs
running workloads drawn from the matrix, and a starting placement — the
seed's worst case (VMs packed on SMT sibling threads of the first host) or
random pCPUs (collisions allowed). Then, each on its own copy of the start:

* none — nothing moves;
* seed_policy — the seed's relocation experiment (docs/research/method.md §2): profile
  with Freeze'nSense, move the two most-degraded VMs to distant cores (the
  free pCPU farthest from every other VM on their host);
* blind_spread — interference-blind spreading: every VM re-placed on the
  least crowded pCPU, core and host, workloads ignored;
* vmplacer — the production loop (profile → learn → plan → apply, through
  `Rebalancer` and the executor) for a few rounds, the model learned only
  from its own Freeze'nSense samples;
* optimum — every assignment of VMs to pCPUs enumerated (when few enough).

Performance = mean over VMs of the fraction of isolated performance
(`SimHost.true_performance`, noise-free).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmplacer.lab.evaluate import profile_and_measure
from vmplacer.lab.profiling import ProfileSettings, run_profiler
from vmplacer.app.apply.executor import ExecutorSettings
from vmplacer.app.rebalance.rebalancer import ROUNDS_PER_PROFILE, RebalancePorts, Rebalancer, RunOptions, RunReport
from vmplacer.lab.verdicts import SIMPLE, model_objectives, reach, step_threshold, true_objective, verdict
from vmplacer.core.model.interference import InterferenceModel, ModelConfig, Observation
from vmplacer.core.rebalance.layout_problem import LayoutSolver
from vmplacer.core.model.pairs import PairTable
from vmplacer.core.model.profile_stats import degradation
from vmplacer.core.rebalance.plan import Action, CancelRequest, Plan, PlanError
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.topology.host import HostTopology, uniform_topology
from vmplacer.core.rebalance.trial import CLOSE_CALL_NOTE, Measured, TrialOutcome, trial_outcome, verdict_label

STARTS = ("siblings", "random")

# What the model assumes about distance before its own samples say otherwise (ModelConfig.distance_prior):
# SMT siblings hurt most — docs/research/method.md §1: ~22 % mean loss for sibling pairs against ~4 % on separate
# cores, so about 5× the loss at the reference (same-LLC) distance; cores of another node share less
# (only the memory controller, or only the interconnect): halved per step, no measurement behind it.
DISTANCE_PRIOR = {"same-core": 5.0, "same-node": 0.5, "remote-node": 0.25}
POLICIES = ("none", "seed_policy", "blind_spread", "vmplacer", "optimum")
DEFAULT_OPTIMUM_LIMIT = 50_000


# --------------------------------------------------------------------------- in-process stores
class MemoryPlanStore:
    """The PlanStore port in memory (simulations, tests)."""

    def __init__(self, wall: Callable[[], float]) -> None:
        self.wall = wall
        self.plans: dict[int, Plan] = {}
        self.finished: dict[tuple[int, int], float] = {}

    def moves_since(self, guests: Sequence[str] | None, since: float) -> dict[str, int]:
        counts: dict[str, int] = {}
        for plan_id, plan in self.plans.items():
            for action in plan.actions:
                at = self.finished.get((plan_id, action.index))
                if (action.state in ("succeeded", "rolled_back") and action.kind != "probe" and action.guest
                        and at is not None and at >= since and (guests is None or action.guest in guests)):
                    counts[action.guest] = counts.get(action.guest, 0) + (2 if action.state == "rolled_back" else 1)
        return counts

    def save(self, plan: Plan, created_by: str = "") -> Plan:
        from dataclasses import replace

        plan_id = len(self.plans) + 1
        plan = replace(plan, id=plan_id)
        self.plans[plan_id] = plan
        return plan

    def get(self, plan_id: int) -> Plan | None:
        return self.plans.get(plan_id)

    def transition(self, plan_id: int, from_state: str, to_state: str, message: str = "") -> bool:
        plan = self.plans[plan_id]
        if plan.state != from_state:
            return False
        self.plans[plan_id] = plan.moved_to(to_state, message)
        return True

    def record_action(self, plan_id: int, action: Action, *, started: bool = False, finished: bool = False) -> None:
        plan = self.plans.get(plan_id)
        if plan is None:
            raise PlanError(f"plan {plan_id} does not exist")
        self.plans[plan_id] = plan.with_action(action)
        if finished:
            self.finished[(plan_id, action.index)] = self.wall()

    def cancel(self, plan_id: int, from_state: str, message: str) -> bool:
        plan = self.plans[plan_id]
        if plan.state != from_state:
            return False
        self.plans[plan_id] = plan.cancelled(message)
        return True

    def request_cancel(self, plan_id: int, by: str, reason: str = "") -> bool:
        from dataclasses import replace

        plan = self.plans[plan_id]
        if plan.state != "running":
            return False
        if plan.cancel_request is None:
            self.plans[plan_id] = replace(plan, cancel_request=CancelRequest(by, reason, self.wall()))
        return True

    def cancel_requested(self, plan_id: int) -> CancelRequest | None:
        plan = self.plans.get(plan_id)
        return plan.cancel_request if plan is not None else None

    def close_orphaned(self, by: str = "vmplacer", *, dry_run: bool = False) -> list[int]:
        """Plans in memory end with the process that runs them: none is ever left orphaned."""
        return []

    def last_moved(self, guests: Sequence[str] | None = None, since: float | None = None) -> dict[str, float]:
        result: dict[str, float] = {}
        for plan_id, plan in self.plans.items():
            for action in plan.actions:
                if action.state == "succeeded" and action.kind != "probe" and action.guest:
                    at = self.finished.get((plan_id, action.index))
                    if at is not None and (guests is None or action.guest in guests) and (since is None or at >= since):
                        result[action.guest] = max(at, result.get(action.guest, at))
        return result

    def last_placements(self, guests: Sequence[str]) -> dict:
        latest: dict[str, tuple[float, object]] = {}
        for plan_id, plan in self.plans.items():
            for action in plan.actions:
                at = self.finished.get((plan_id, action.index))
                if (action.state == "succeeded" and action.kind in ("repin", "migrate")
                        and action.guest is not None and action.guest in guests
                        and action.after is not None and at is not None
                        and at >= latest.get(action.guest, (-1.0, None))[0]):
                    latest[action.guest] = (at, action.after)
        return {guest: after for guest, (_, after) in latest.items()}

    def trial_outcomes(self, since: float) -> list[TrialOutcome]:
        found = []
        for plan_id, plan in self.plans.items():
            for action in plan.actions:
                at = self.finished.get((plan_id, action.index))
                if at is None:
                    continue
                outcome = trial_outcome(action.kind, action.state, action.parameters, action.host, at)
                if outcome is not None and at >= since:
                    found.append(outcome)
        return found

    def trial_counts(self, since: float) -> dict[tuple[str, str, str], int]:
        counts: dict[tuple[str, str, str], int] = {}
        for o in self.trial_outcomes(since):
            key = (o.host, o.kind, verdict_label(o.kept))
            counts[key] = counts.get(key, 0) + 1
        return counts

    def moves(self, state: str = "succeeded") -> list[Action]:
        """Moves (repins, migrations, memory moves) in `state`: done, or `rolled_back` (undone)."""
        return [a for p in sorted(self.plans.values(), key=lambda p: p.id or 0) for a in p.actions
                if a.state == state and a.kind != "probe"]


class MemoryLeaseStore:
    def __init__(self) -> None:
        self.held: dict[str, str] = {}

    def acquire(self, hosts, holder, ttl_s) -> bool:
        if any(self.held.get(h, holder) != holder for h in hosts):
            return False
        self.held.update({h: holder for h in hosts})
        return True

    def renew(self, hosts, holder, ttl_s) -> bool:
        return all(self.held.get(h) == holder for h in hosts)

    def release(self, hosts, holder) -> None:
        for host in hosts:
            if self.held.get(host) == holder:
                del self.held[host]


# --------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class HostShape:
    nodes: int = 1
    cores_per_node: int = 4
    threads_per_core: int = 2

    def topology(self, name: str) -> HostTopology:
        return uniform_topology(nodes=self.nodes, cores_per_node=self.cores_per_node,
                                threads_per_core=self.threads_per_core, name=name)

    @property
    def pcpus(self) -> int:
        return self.nodes * self.cores_per_node * self.threads_per_core


MIXES = ("any", "hungry-compute")


@dataclass(frozen=True)
class Case:
    start: str
    hosts: int
    vms: int
    shape: HostShape = HostShape()
    seed: int = 0
    mix: str = "any"  # any: workloads drawn from the whole matrix; hungry-compute: see `workloads_of`


def workloads_of(table: PairTable, case: Case, names: Sequence[str], rng: random.Random) -> dict[str, str]:
    """The VMs' workloads. `any`: each drawn from the matrix. `hungry-compute`: alternately from
    the half of the matrix that hurts and suffers most (cache- and memory-hungry) and the half
    that hurts and suffers least (compute-bound), so each hungry guest has a quiet one to pair with."""
    if case.mix not in MIXES:
        raise ValueError(f"mix must be one of {', '.join(MIXES)}, got {case.mix!r}")
    workloads = list(table.workloads)
    if case.mix == "any":
        return {name: rng.choice(workloads) for name in names}
    hurts, suffers = table.interference(), table.sensitivity()
    ranked = sorted(workloads, key=lambda w: (-(hurts.get(w, 0.0) + suffers.get(w, 0.0)), w))
    half = max(1, len(ranked) // 2)
    hungry, compute = ranked[:half], ranked[half:] or ranked[:half]
    return {name: rng.choice(hungry if i % 2 == 0 else compute) for i, name in enumerate(names)}


@dataclass
class Start:
    workloads: dict[str, str]  # vm -> workload
    placement: dict[str, tuple[str, int]]  # vm -> (host, pCPU)


def starting_point(table: PairTable, case: Case) -> Start:
    """Workloads (drawn once per seed, the same for both starts) and the starting pCPUs."""
    if case.start not in STARTS:
        raise ValueError(f"start must be one of {', '.join(STARTS)}, got {case.start!r}")
    rng = random.Random(case.seed)
    names = [f"vm{i}" for i in range(case.vms)]
    workloads = workloads_of(table, case, names, rng)
    hosts = [f"host{i}" for i in range(case.hosts)]
    placement: dict[str, tuple[str, int]] = {}
    topology = case.shape.topology(hosts[0])
    if case.start == "siblings":
        # The seed's worst case: sibling threads of as few cores of the first host as possible.
        # More VMs than pCPUs (overcommitted): the rest time-share them in the same order.
        threads = [cpu for core in topology.cores for cpu in core.cpus]
        for index, name in enumerate(names):
            placement[name] = (hosts[0], threads[index % len(threads)])
    else:
        cpus = sorted(topology.cpus)
        placement_rng = random.Random(case.seed * 7919 + 1)
        for name in names:
            placement[name] = (placement_rng.choice(hosts), placement_rng.choice(cpus))
    return Start(workloads, placement)


Simulator = Callable[[PairTable, int, float], Any]  # (truth, seed, noise) -> a simulated cluster
# (truth, case, start) -> (per-VM performance of the best layout, how it was found), or None
Optimum = Callable[["PairTable", "Case", "Start"], "tuple[dict[str, float], dict[str, Any]] | None"]


def build(table: PairTable, case: Case, start: Start, *, noise: float, seed: int, simulator: Simulator):
    cluster = simulator(table, seed, noise)
    for index in range(case.hosts):
        name = f"host{index}"
        cluster.add_host(name, case.shape.topology(name))
    for vm, (host, cpu) in sorted(start.placement.items()):
        cluster.hosts[host].define_domain(vm, workload=start.workloads[vm], vcpupin=[cpu],
                                          workload_class="batch", memory_kib=1024 * 1024)
    return cluster


def performance(cluster) -> dict[str, float]:
    return {d.name: host.true_performance(d.name) for host in cluster.hosts.values() for d in host.domains()}


def _hosts_of(cluster) -> dict[str, str]:
    """Each VM's host in a simulated cluster."""
    return {d.name: name for name, host in cluster.hosts.items() for d in host.domains()}


def _mean(values: dict[str, float]) -> float:
    return sum(values.values()) / len(values) if values else 0.0


# --------------------------------------------------------------------------- the policies
def seed_policy(cluster, *, rounds: int = 3, moved: int = 2) -> int:
    """Freeze'nSense (the shipped profiler), then the `moved` most-degraded VMs to the free pCPU
    farthest from all others; degradation as the profiler reports it (medians of ζ and ζb)."""
    settings = ProfileSettings(rounds=rounds)
    scores: dict[str, float] = {}
    for host in cluster.hosts.values():
        profiled = run_profiler(host, cluster.sampler(host), cluster.clock, settings)
        for name, vm in sorted(profiled.result.vms.items() if profiled.result else ()):
            loss = degradation(vm.zeta, vm.zeta_b)
            if loss is not None:
                scores[name] = loss.estimate
    worst = sorted(scores, key=lambda n: (-scores[n], n))[:moved]
    moves = 0
    for name in worst:
        host = next(h for h in cluster.hosts.values() if name in {d.name for d in h.domains()})
        topology = host.topology()
        others = {next(iter(d.placement.vcpupin[0])) for d in host.domains() if d.name != name}
        busy_cores = {topology.cpus[c].core for c in others}
        free = [c for c in sorted(topology.cpus) if c not in others and topology.cpus[c].core not in busy_cores]
        free = free or [c for c in sorted(topology.cpus) if c not in others]
        if not free:
            continue

        def distance(cpu: int) -> tuple:
            ranks = sorted(topology.distance_class(cpu, o).rank for o in others) or [99]
            return (ranks[0], sum(ranks), -cpu)

        target = max(free, key=distance)
        if host.domain(name).placement.vcpupin[0] != frozenset({target}):
            host.pin_vcpu(name, 0, frozenset({target}))
            moves += 1
    return moves


def blind_spread(cluster) -> int:
    """Every VM (in name order) on the pCPU with the fewest VMs, then core, then host.

    Only one-vCPU VMs pinned to one pCPU that owns none are moved; the others (floating over a
    node or the host, dedicated on their own cores) stay where they are and count as load: a
    floating vCPU as its share of each pCPU it may run on, and nothing lands on a pCPU a
    dedicated guest owns."""
    domains = [(h, d) for h in cluster.hosts.values() for d in h.domains()]
    located = {d.name: (h.name, d) for h, d in domains if _spreadable(d)}
    count_cpu: dict[tuple[str, int], float] = {}
    count_core: dict[tuple[str, int], float] = {}
    count_host: dict[str, float] = {}
    owned = _count_fixed(domains, count_cpu, count_core, count_host)
    moves = 0
    for name in sorted(located):
        best = None
        for host in cluster.hosts.values():
            topology = host.topology()
            for cpu in sorted(topology.cpus):
                if (host.name, cpu) in owned:
                    continue
                core = topology.cpus[cpu].core
                key = (count_cpu.get((host.name, cpu), 0), count_core.get((host.name, core), 0),
                       count_host.get(host.name, 0))
                if best is None or key < best[0]:
                    best = (key, host, cpu, core)
        assert best is not None
        _, host, cpu, core = best
        source, domain = located[name]
        if source != host.name:
            cluster.hosts[source].migrate(name, host)
            moves += 1
        if domain.placement.vcpupin[0] != frozenset({cpu}):
            host.pin_vcpu(name, 0, frozenset({cpu}))
            moves += 1
        count_cpu[(host.name, cpu)] = count_cpu.get((host.name, cpu), 0) + 1
        count_core[(host.name, core)] = count_core.get((host.name, core), 0) + 1
        count_host[host.name] = count_host.get(host.name, 0) + 1
    return moves


def _spreadable(domain) -> bool:
    """A VM the blind spread moves: one vCPU pinned to one pCPU, owning none."""
    pins = domain.placement.vcpupin
    return len(pins) == 1 and len(pins.get(0, ())) == 1 and not domain.placement.exclusive_cpus


def _count_fixed(domains, count_cpu: dict, count_core: dict, count_host: dict) -> set[tuple[str, int]]:
    """The load of the VMs the blind spread leaves in place, counted in; the pCPUs they own."""
    owned: set[tuple[str, int]] = set()
    for host, domain in domains:
        if _spreadable(domain):
            continue
        topology = host.topology()
        owned |= {(host.name, cpu) for cpu in domain.placement.exclusive_cpus}
        for cpus in domain.placement.vcpupin.values():
            for cpu in cpus:
                share = 1.0 / len(cpus)
                core = topology.cpus[cpu].core
                count_cpu[(host.name, cpu)] = count_cpu.get((host.name, cpu), 0) + share
                count_core[(host.name, core)] = count_core.get((host.name, core), 0) + share
                count_host[host.name] = count_host.get(host.name, 0) + share
    return owned


@dataclass
class VmplacerLoop:
    """vmplacer's loop on a simulated cluster: Rebalancer + executor, a model learned from its samples."""

    cluster: Any
    settings: RebalanceSettings = field(default_factory=RebalanceSettings)
    model_config: ModelConfig | None = None
    # As in production: a profile step and a trial's probe are ROUNDS_PER_PROFILE Freeze'nSense
    # rounds each of the shipped profiler (a new one per call, as production builds it), with
    # `profiler.pair_probes` (default 4) pair probes per round.
    profile_rounds: int = ROUNDS_PER_PROFILE
    probe_rounds: int = ROUNDS_PER_PROFILE
    pair_probes: int = 4
    observations: list[Observation] = field(default_factory=list)
    model: InterferenceModel | None = None
    solver: LayoutSolver | None = None
    reports: list[RunReport] = field(default_factory=list)  # each run's report (its plan, plan CPU time)

    def __post_init__(self) -> None:
        clock = self.cluster.clock
        self.plans = MemoryPlanStore(clock.now)
        self.rebalancer = Rebalancer(
            RebalancePorts(hosts=dict(self.cluster.hosts), plans=self.plans, leases=MemoryLeaseStore(),
                           clock=clock, wall=clock.now,
                           load_model=lambda: self.model or InterferenceModel(self.model_config),
                           learn=self._learn, profile=self._profile,
                           probe=self._probe, solver=self.solver),
            holder="eval", settings=self.settings,
            executor_settings=ExecutorSettings(retries=0, migration_timeout_s=600),
        )

    def _profile(self, host_name: str, seconds: float, scope: Sequence[str], rounds: int | None = None) -> Measured:
        host = self.cluster.hosts[host_name]
        settings = ProfileSettings(rounds=rounds or self.profile_rounds, pair_probes=self.pair_probes)
        found, measured = profile_and_measure(host, self.cluster.sampler(host), self.cluster.clock, settings)
        self.observations.extend(found)
        return Measured(host_name, measured.performance, measured.samples, f"{len(found)} observations")

    def _probe(self, host_name: str, seconds: float) -> Measured:
        return self._profile(host_name, seconds, (), self.probe_rounds)

    def _learn(self) -> str:
        self.model = InterferenceModel(self.model_config).fit(self.observations)
        return f"fitted on {len(self.observations)} observations"

    def run(self, rounds: int) -> list[Plan]:
        plans = []
        for _ in range(rounds):
            report = self.rebalancer.run(RunOptions(profile_seconds=1.0))
            self.reports.append(report)
            if report.plan is not None:
                plans.append(report.plan)
            self.cluster.clock.sleep(self.settings.cooldown_s + 1.0)
        return plans


def optimum(table: PairTable, case: Case, start: Start, simulator: Simulator,
            limit: int = DEFAULT_OPTIMUM_LIMIT) -> dict[str, float] | None:
    """Best mean true performance over every assignment of VMs to pCPUs (None above `limit`)."""
    hosts = [f"host{i}" for i in range(case.hosts)]
    slots = [(h, c) for h in hosts for c in range(case.shape.pcpus)]
    if len(slots) ** case.vms > limit:
        return None
    cluster = build(table, case, start, noise=0.0, seed=0, simulator=simulator)
    names = sorted(start.placement)
    where = {name: start.placement[name][0] for name in names}
    best_value, best = -1.0, None
    for choice in itertools.product(range(len(slots)), repeat=case.vms):
        for name, slot in zip(names, choice):
            host, cpu = slots[slot]
            if where[name] != host:
                cluster.hosts[where[name]].migrate(name, cluster.hosts[host])
                where[name] = host
            cluster.hosts[host].pin_vcpu(name, 0, frozenset({cpu}))
        values = performance(cluster)
        mean = _mean(values)
        if mean > best_value + 1e-12:
            best_value, best = mean, values
    return best


# --------------------------------------------------------------------------- one case
def evaluate_case(table: PairTable, case: Case, *, simulator: Simulator, matrix: str = "", rounds: int = 5,
                  checkpoints: Sequence[int] = (), noise: float = 0.03, settings: RebalanceSettings | None = None,
                  model_config: ModelConfig | None = None,
                  optimum_limit: int = DEFAULT_OPTIMUM_LIMIT,
                  solver: LayoutSolver | None = None, best: Optimum | None = None,
                  best_objective: Optimum | None = None) -> dict[str, Any]:
    """Every policy on its own copy of one starting point; the JSON row of the benchmark.

    `best` finds the optimum (default: every assignment enumerated, up to
    `optimum_limit`); `best_objective`, when given, the layout that maximizes the
    planner's own objective (fairness φ included; `objective_optimum` in the row);
    `solver` lays out small hosts exactly in vmplacer's plans.
    `checkpoints` are earlier run counts at which vmplacer's performance is also
    recorded (`vmplacer_by_run`, with the moves done and undone so far), so one row
    shows how fast it converges and whether it keeps moving once it has.
    """
    marks = sorted({n for n in checkpoints if 0 < n < rounds} | {rounds})
    start = starting_point(table, case)
    per_vm: dict[str, dict[str, float] | None] = {}
    actions: dict[str, int] = {}
    clusters: dict[str, Any] = {}

    cluster = build(table, case, start, noise=noise, seed=case.seed, simulator=simulator)
    per_vm["none"] = performance(cluster)
    actions["none"] = 0
    clusters["none"] = cluster

    cluster = build(table, case, start, noise=noise, seed=case.seed, simulator=simulator)
    actions["seed_policy"] = seed_policy(cluster)
    per_vm["seed_policy"] = performance(cluster)
    clusters["seed_policy"] = cluster

    cluster = build(table, case, start, noise=noise, seed=case.seed, simulator=simulator)
    actions["blind_spread"] = blind_spread(cluster)
    per_vm["blind_spread"] = performance(cluster)
    clusters["blind_spread"] = cluster

    cluster = build(table, case, start, noise=noise, seed=case.seed, simulator=simulator)
    config = model_config or ModelConfig(distance_prior=DISTANCE_PRIOR)
    settings = settings or RebalanceSettings(max_actions=case.vms)
    loop = VmplacerLoop(cluster, settings, config, solver=solver)
    plans: list[Plan] = []
    by_run: dict[int, tuple[float, int, int]] = {}
    for mark in marks:
        plans += loop.run(mark - (max(by_run) if by_run else 0))
        by_run[mark] = (_mean(performance(cluster)), len(loop.plans.moves()),
                        len(loop.plans.moves("rolled_back")))
    per_vm["vmplacer"] = performance(cluster)
    actions["vmplacer"] = len(loop.plans.moves())
    clusters["vmplacer"] = cluster

    how: dict[str, Any] | None
    if best is None:
        found = optimum(table, case, start, simulator, optimum_limit)
        how = None if found is None else {"method": "every assignment enumerated"}
    else:
        result = best(table, case, start)
        found, how = (None, None) if result is None else result
    per_vm["optimum"] = found

    row: dict[str, Any] = {
        "matrix": matrix or table.source,
        "start": case.start,
        "hosts": case.hosts,
        "vms": case.vms,
        "host_shape": {"nodes": case.shape.nodes, "cores_per_node": case.shape.cores_per_node,
                       "threads_per_core": case.shape.threads_per_core},
        "seed": case.seed,
        "rounds": rounds,
    }
    for policy in POLICIES:
        values = per_vm[policy]
        row[policy] = None if values is None else round(_mean(values), 4)
    row["share_of_optimum"] = (None if row["optimum"] is None else
                               {p: round(row[p] / row["optimum"], 4) for p in POLICIES if p != "optimum"})
    row["optimum_found_by"] = how
    row["vmplacer_by_run"] = {str(n): {"mean": round(x, 4), "share_of_optimum": (
        None if row["optimum"] is None else round(round(x, 4) / row["optimum"], 4)), "moves": moves, "undone": undone}
        for n, (x, moves, undone) in by_run.items()}
    row["min_vm"] = {p: (None if v is None else round(min(v.values()), 4)) for p, v in per_vm.items()}
    row["per_vm"] = {p: (None if v is None else {k: round(x, 4) for k, x in sorted(v.items())})
                     for p, v in per_vm.items()}
    row["actions"] = actions
    row["workloads"] = dict(sorted(start.workloads.items()))
    row["model_observations"] = len(loop.observations)
    layout = (how or {}).get("layout")
    if layout:  # the optimum's layout, so the model's rating of it can be compared with its own choice
        clusters["optimum"] = _laid_out(table, case, start, simulator, noise, layout)
    row["time_shared_pcpus"] = {p: _time_shared(c) for p, c in clusters.items()}
    objectives = model_objectives(clusters, loop.model, settings)
    row["model_objective"] = objectives
    row["exact"] = _exact_summary(plans)
    row["trials"] = trial_summary(plans)
    hosts = {p: _hosts_of(c) for p, c in clusters.items()}
    measured = {p: v for p, v in per_vm.items() if v is not None}  # the policies that placed every VM
    reaches = ({p: reach(measured, hosts, p, interchangeable=True, fairness=settings.fairness)
                for p in SIMPLE if p in measured}
               if "vmplacer" in measured else {})
    row["vmplacer_vs_simple"] = verdict({p: row[p] for p in POLICIES}, objectives, plans, settings.min_gain,
                                        reaches=reaches, min_migration_gain=settings.min_migration_gain,
                                        min_gain_share=settings.min_gain_share)
    if "optimum" in measured and "optimum" in hosts and "vmplacer" in measured:
        row["vmplacer_vs_optimum"] = step_threshold(
            reach(measured, hosts, "optimum", interchangeable=True, fairness=settings.fairness),
            settings.min_gain, settings.min_migration_gain, settings.min_gain_share)
    if best_objective is not None and "vmplacer" in measured:
        row["objective_optimum"] = _objective_optimum(table, case, start, simulator, noise, settings,
                                                      best_objective(table, case, start), measured["vmplacer"],
                                                      hosts["vmplacer"])
    return row


def _objective_optimum(table: PairTable, case: Case, start: Start, simulator: Simulator, noise: float,
                       settings: RebalanceSettings, found, mine: dict[str, float],
                       my_hosts: dict[str, str]) -> dict[str, Any] | None:
    """vmplacer against the layout that maximizes its own objective in truth: the objective per VM
    of both, and whether the step between them clears the threshold a perfect model with the
    same objective and hysteresis would need to take it."""
    if found is None:
        return None
    theirs, how = found
    cluster = _laid_out(table, case, start, simulator, noise, how["layout"])
    step = reach({"vmplacer": mine, "objective_optimum": theirs},
                 {"vmplacer": my_hosts, "objective_optimum": _hosts_of(cluster)}, "objective_optimum",
                 interchangeable=True, fairness=settings.fairness)
    count = len(mine)
    return {"fairness": settings.fairness,
            "objective_per_vm": round(how["objective"], 4),
            "vmplacer_objective_per_vm": round(true_objective(mine.values(), settings.fairness) / count, 4),
            "mean": round(_mean(theirs), 4),
            "per_vm": {k: round(x, 4) for k, x in sorted(theirs.items())},
            "layout": how["layout"],
            "step": step_threshold(step, settings.min_gain, settings.min_migration_gain, settings.min_gain_share)}


def _laid_out(table: PairTable, case: Case, start: Start, simulator: Simulator, noise: float,
              layout: dict[str, Sequence[int]]) -> Any:
    """A fresh cluster of the case with every VM pinned as `layout` says (vm → [host index, pCPU])."""
    cluster = build(table, case, start, noise=noise, seed=case.seed, simulator=simulator)
    where = {name: start.placement[name][0] for name in layout}
    for name, (host_index, cpu) in sorted(layout.items()):
        host = f"host{host_index}"
        if where[name] != host:
            cluster.hosts[where[name]].migrate(name, cluster.hosts[host])
        cluster.hosts[host].pin_vcpu(name, 0, frozenset({cpu}))
    return cluster


def _time_shared(cluster: Any) -> int:
    """pCPUs that more than one VM is pinned to alone (time sharing)."""
    count = 0
    for host in cluster.hosts.values():
        pinned = [next(iter(d.placement.vcpupin[0])) for d in host.domains()
                  if d.state == "running" and len(d.placement.vcpupin.get(0, ())) == 1]
        count += sum(1 for c in set(pinned) if pinned.count(c) > 1)
    return count


def _exact_summary(plans: Sequence[Plan]) -> dict[str, int]:
    """How often the exact solver ran in vmplacer's plans, proved its layout optimal, and was followed."""
    reports = [r for p in plans for r in p.settings.get("notes", {}).get("exact", [])]
    return {"solves": sum(1 for r in reports if "objective" in r),
            "optimal": sum(1 for r in reports if r.get("status") == "optimal"),
            "taken": sum(1 for r in reports if r.get("taken"))}


def trial_summary(plans: Sequence[Plan]) -> dict[str, int]:
    """Measured trials in vmplacer's plans: layouts tried and kept, tried and undone, planned
    moves undone because they measured worse, and close calls probed a second time."""
    probes = [a for p in plans for a in p.actions if a.kind == "probe" and a.parameters.get("trial")]
    explore = [a for a in probes if a.parameters["trial"].get("kind") == "explore"]
    confirm = [a for a in probes if a.parameters["trial"].get("kind") == "confirm"]
    return {"explored": len(explore), "kept": sum(1 for a in explore if a.state == "succeeded"),
            "undone": sum(1 for a in explore if a.state == "rolled_back"),
            "confirmed": sum(1 for a in confirm if a.state == "succeeded"),
            "moves_undone": sum(1 for a in confirm if a.state == "rolled_back"),
            "rechecked": sum(1 for a in probes if CLOSE_CALL_NOTE in (a.message or ""))}
