"""Evaluate the interference model the way the seed validated it (§3.5), on simulated hosts.

Training: random placements are profiled by the shipped Freeze'nSense profiler
(app/observe/profiler.py, run in simulated time by lab/profiling.py) — per round, for
each VM in turn the others are suspended and ζb is sampled, then ζ of every VM
at a random moment of the sleep — and the model is fitted from those
observations. Testing: other random placements, never profiled,
are predicted and compared with the simulator's noise-free truth by relative
RMSE (seed eq. 3.6), next to the linear predictor (time shares only).

Only ports, core and the shipped profiler are used here; the simulator is injected (`Testbed`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from vmplacer.core.model.interference import InterferenceModel, ModelConfig, Observation
from vmplacer.core.model.pairs import PairTable
from vmplacer.core.model.stats import rrmse
from vmplacer.core.topology.host import HostTopology, uniform_topology
from vmplacer.core.rebalance.trial import Measured
from vmplacer.lab.profiling import (
    ProfiledHost,
    ProfileSettings,
    measured,
    observations_of,
    run_profiler,
    tenants_of,
)
from vmplacer.ports import Clock, DomainInfo, Hypervisor, Sampler

log = logging.getLogger(__name__)

EVAL_WORKLOAD_CLASS = "batch"


class SimulatedHost(ProfiledHost, Hypervisor, Protocol):
    """A host whose domains can be created at will and whose truth can be read."""

    def define_domain(self, name: str, *, workload: str, vcpupin: Iterable[int], load: float = 1.0,
                      workload_class: str = "unknown") -> DomainInfo: ...
    def true_performance(self, name: str) -> float: ...


class Testbed(Protocol):
    clock: Clock

    def add_host(self, name: str, topology: HostTopology) -> SimulatedHost: ...
    def sampler(self, host: SimulatedHost) -> Sampler: ...


# --------------------------------------------------------------------------- measurement
def profile_host(host: ProfiledHost, sampler: Sampler, clock: Clock,
                 settings: ProfileSettings = ProfileSettings(), *, key_by_name: bool = False) -> list[Observation]:
    """The shipped profiler over every running domain of one host (lab/profiling.py); its samples
    as model observations: one per guest and round, and one per guest of each pair probe.

    `key_by_name` keys observations by guest name (each guest its own key, as an unlabelled guest
    is), instead of by the `workload` label shared by replicas."""
    profiled = run_profiler(host, sampler, clock, settings)
    return observations_of(host, profiled, settings, key_by_name=key_by_name)


def profile_and_measure(host: ProfiledHost, sampler: Sampler, clock: Clock,
                        settings: ProfileSettings = ProfileSettings(), *,
                        key_by_name: bool = False) -> tuple[list[Observation], Measured]:
    """`profile_host`, plus each guest's measured share of its isolated performance read from the
    same run as the rebalancer reads it (app/observe/profiler.py `measured_of`): what a measured trial
    compares (core/rebalance/trial.py)."""
    profiled = run_profiler(host, sampler, clock, settings)
    observations = observations_of(host, profiled, settings, key_by_name=key_by_name)
    return observations, measured(host, profiled, f"{len(observations)} observations")


# --------------------------------------------------------------------------- placements
def simulated_topology(cores: int) -> HostTopology:
    """The evaluation hosts: one NUMA node up to 8 cores, two nodes above (no SMT, as in the seed)."""
    if cores < 2:
        raise ValueError(f"cores must be >= 2, got {cores}")
    nodes = 2 if cores > 8 and cores % 2 == 0 else 1
    return uniform_topology(nodes=nodes, cores_per_node=cores // nodes, threads_per_core=1,
                            name=f"sim-{cores}c")


def random_placement(rng: random.Random, topology: HostTopology, workloads: Sequence[str],
                     vms_per_core: int) -> list[tuple[str, str, frozenset[int]]]:
    """`vms_per_core` one-vCPU VMs on every core, workloads drawn with replacement."""
    placement = []
    for core in topology.cores:
        for slot in range(vms_per_core):
            workload = rng.choice(list(workloads))
            placement.append((f"vm-c{core.id}-{slot}", workload, frozenset(core.cpus)))
    return placement


def parse_range(text: str, field_name: str) -> tuple[int, int]:
    """"2" -> (2, 2); "1-3" -> (1, 3)."""
    try:
        if "-" in text:
            low, high = (int(part) for part in text.split("-", 1))
        else:
            low = high = int(text)
    except ValueError:
        raise ValueError(f"{field_name}: expected N or A-B, got {text!r}") from None
    if low < 1 or high < low:
        raise ValueError(f"{field_name}: expected 1 <= A <= B, got {text!r}")
    return low, high


# --------------------------------------------------------------------------- evaluation
@dataclass
class ModelEvaluation:
    matrix: str
    cores: int
    vms_per_core: tuple[int, int]
    trials: int
    observations: int
    predictions: int
    model_rrmse: float
    linear_rrmse: float
    by_vms_per_core: dict[int, dict[str, float | int]] = field(default_factory=dict)
    mean_confidence: float = 0.0
    model: InterferenceModel | None = None

    def to_dict(self) -> dict:
        low, high = self.vms_per_core
        return {
            "matrix": self.matrix,
            "cores": self.cores,
            "vms_per_core": f"{low}-{high}" if low != high else str(low),
            "trials": self.trials,
            "observations": self.observations,
            "predictions": self.predictions,
            "model_rrmse": round(self.model_rrmse, 4),
            "linear_rrmse": round(self.linear_rrmse, 4),
            "mean_confidence": round(self.mean_confidence, 3),
            "by_vms_per_core": {
                str(k): {name: (round(value, 4) if isinstance(value, float) else value)
                         for name, value in v.items()}
                for k, v in sorted(self.by_vms_per_core.items())
            },
        }


def _populate(host: SimulatedHost, placement: list[tuple[str, str, frozenset[int]]]) -> None:
    for name, workload, cpus in placement:
        host.define_domain(name, workload=workload, vcpupin=sorted(cpus), workload_class=EVAL_WORKLOAD_CLASS)


def profile_training_hosts(testbed: Testbed, table: PairTable, *, cores: int, vms_per_core: tuple[int, int],
                           trials: int, rng: random.Random,
                           settings: ProfileSettings = ProfileSettings(),
                           prefix: str = "train") -> list[Observation]:
    """Profile `trials` random placements with the shipped profiler; all their observations."""
    topology = simulated_topology(cores)
    observations: list[Observation] = []
    for trial in range(trials):
        host = testbed.add_host(f"{prefix}-{trial:04d}", topology)
        _populate(host, random_placement(rng, topology, table.workloads, rng.randint(*vms_per_core)))
        observations.extend(profile_host(host, testbed.sampler(host), testbed.clock, settings))
    return observations


def score_held_out(
    testbed: Testbed,
    table: PairTable,
    model: InterferenceModel,
    *,
    cores: int,
    vms_per_core: tuple[int, int],
    trials: int,
    rng: random.Random,
    observations: int = 0,
    prefix: str = "test",
) -> ModelEvaluation:
    """Predict `trials` fresh random placements; R_rmse against the noise-free truth."""
    topology = simulated_topology(cores)
    linear = InterferenceModel(model.config)
    rows: list[tuple[int, float, float, float, float]] = []  # (k, predicted, linear, true, confidence)
    for trial in range(trials):
        host = testbed.add_host(f"{prefix}-{trial:04d}", topology)
        k = rng.randint(*vms_per_core)
        _populate(host, random_placement(rng, topology, table.workloads, k))
        tenants = tenants_of(host.domains())
        predicted = model.predict(topology, tenants)
        baseline = linear.predict(topology, tenants)
        for tenant in tenants:
            true = host.true_performance(tenant.name)
            rows.append((k, predicted[tenant.name].perf, baseline[tenant.name].perf, true,
                         predicted[tenant.name].confidence))
    usable = [row for row in rows if row[3] > 0]
    if not usable:
        raise ValueError("no held-out VM has a positive true performance: nothing to score")
    if len(usable) < len(rows):
        log.warning("%d held-out VMs had zero true performance and were left out", len(rows) - len(usable))
    by_k: dict[int, dict[str, float | int]] = {}
    for k in sorted({row[0] for row in usable}):
        subset = [row for row in usable if row[0] == k]
        by_k[k] = {
            "model_rrmse": rrmse([r[1] for r in subset], [r[3] for r in subset]),
            "linear_rrmse": rrmse([r[2] for r in subset], [r[3] for r in subset]),
            "predictions": len(subset),
        }
    return ModelEvaluation(
        matrix=table.source,
        cores=cores,
        vms_per_core=vms_per_core,
        trials=trials,
        observations=observations,
        predictions=len(usable),
        model_rrmse=rrmse([r[1] for r in usable], [r[3] for r in usable]),
        linear_rrmse=rrmse([r[2] for r in usable], [r[3] for r in usable]),
        by_vms_per_core=by_k,
        mean_confidence=sum(r[4] for r in usable) / len(usable),
        model=model,
    )


def evaluate_model(
    testbed: Testbed,
    table: PairTable,
    *,
    cores: int = 8,
    vms_per_core: tuple[int, int] = (1, 3),
    trials: int = 50,
    seed: int = 0,
    config: ModelConfig | None = None,
    settings: ProfileSettings = ProfileSettings(),
) -> ModelEvaluation:
    """Fit on `trials` profiled random placements, score on `trials` held-out ones."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if not table.workloads:
        raise ValueError(f"{table.source}: names no workloads")
    rng = random.Random(seed)
    observations = profile_training_hosts(testbed, table, cores=cores, vms_per_core=vms_per_core,
                                          trials=trials, rng=rng, settings=settings)
    model = InterferenceModel(config).fit(observations)
    return score_held_out(testbed, table, model, cores=cores, vms_per_core=vms_per_core, trials=trials,
                          rng=rng, observations=len(observations))
