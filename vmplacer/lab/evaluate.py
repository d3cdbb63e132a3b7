"""Evaluate the interference model the way the seed validated it (§3.5), on simulated hosts.

Training: random placements are profiled with Freeze'nSense through the
ports — ζ of every VM over a window, then for each VM in turn the others are
suspended, ζb is sampled, the others are resumed — and the model is fitted
from those observations. Testing: other random placements, never profiled,
are predicted and compared with the simulator's noise-free truth by relative
RMSE (seed eq. 3.6), next to the linear predictor (time shares only).

Only ports and core are used here; the simulator is injected (`Testbed`).
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from vmplacer.core.interference import (
    InterferenceModel,
    ModelConfig,
    Observation,
    Tenant,
    interference_terms,
)
from vmplacer.core.pairs import PairTable
from vmplacer.core.profile_stats import measured_share
from vmplacer.core.stats import rrmse
from vmplacer.core.topology import HostTopology, uniform_topology
from vmplacer.core.trial import Measured
from vmplacer.ports import Clock, DomainInfo, Hypervisor, HypervisorError, Sample, Sampler

log = logging.getLogger(__name__)

WORKLOAD_LABEL = "workload"
CLASS_LABEL = "workload_class"
LOAD_LABEL = "load"
EVAL_WORKLOAD_CLASS = "batch"


class SimulatedHost(Hypervisor, Protocol):
    """A host whose domains can be created at will and whose truth can be read."""

    def define_domain(self, name: str, *, workload: str, vcpupin: Iterable[int], load: float = 1.0,
                      workload_class: str = "unknown") -> DomainInfo: ...
    def true_performance(self, name: str) -> float: ...


class Testbed(Protocol):
    clock: Clock

    def add_host(self, name: str, topology: HostTopology) -> SimulatedHost: ...
    def sampler(self, host: SimulatedHost) -> Sampler: ...


@dataclass(frozen=True)
class ProfileSettings:
    """Freeze'nSense timing (docs/research/method.md §2): ζ over `window_s`, ζb over `t_m` while others are frozen."""

    window_s: float = 1.0
    t_m: float = 0.01
    rounds: int = 1
    pair_probes: int = 0  # per round: freeze all but two neighbours, sample both (app/profiler.py)
    max_ratio: float = 1.5  # ζ/ζb above this is physically implausible: sample rejected


# --------------------------------------------------------------------------- measurement
def tenants_of(domains: Iterable[DomainInfo]) -> list[Tenant]:
    """Running domains as model tenants; workload key, class and load come from labels."""
    tenants = []
    for domain in domains:
        if domain.state != "running" or domain.placement is None:
            continue
        labels = domain.labels
        try:
            load = float(labels.get(LOAD_LABEL, "1.0"))
        except ValueError:
            raise ValueError(f"domain {domain.name!r}: label {LOAD_LABEL!r} is not a number: "
                             f"{labels.get(LOAD_LABEL)!r}") from None
        tenants.append(Tenant(
            name=domain.name,
            cpus=dict(domain.placement.vcpupin),
            key=labels.get(WORKLOAD_LABEL, domain.name),
            workload_class=labels.get(CLASS_LABEL, "unknown"),
            load=load,
        ))
    return tenants


def measure(sampler: Sampler, clock: Clock, names: Sequence[str], window_s: float) -> dict[str, Sample]:
    """ζ of every named domain over one window, neighbours running."""
    token = sampler.begin(list(names))
    clock.sleep(window_s)
    return sampler.end(token)


def freeze_and_sense(hypervisor: Hypervisor, sampler: Sampler, clock: Clock, target: str, t_m: float) -> Sample:
    """ζb of `target`: suspend every other running domain, sample for t_m, resume them.

    Whatever happens while frozen, every domain this call suspended is resumed;
    a failed resume is retried once and then reported after the others were
    resumed, because a VM left paused is worse than a lost sample.
    """
    return freeze_all_but(hypervisor, sampler, clock, (target,), t_m)[target]


def freeze_all_but(hypervisor: Hypervisor, sampler: Sampler, clock: Clock, keep: Sequence[str],
                   t_m: float) -> dict[str, Sample]:
    """Samples of `keep` over t_m while every other running domain is suspended."""
    others = [d.name for d in hypervisor.domains() if d.name not in keep and d.state == "running"]
    frozen: list[str] = []
    try:
        for name in others:
            hypervisor.suspend(name)
            frozen.append(name)
        token = sampler.begin(list(keep))
        clock.sleep(t_m)
        return sampler.end(token)
    finally:
        failures = []
        for name in frozen:
            try:
                hypervisor.resume(name)
            except HypervisorError:
                try:
                    hypervisor.resume(name)
                except HypervisorError as exc:
                    failures.append(exc)
        if failures:
            names = ", ".join(repr(exc.domain or str(exc)) for exc in failures)
            raise HypervisorError(f"could not resume {names} after sampling {', '.join(map(repr, keep))}",
                                  host=getattr(hypervisor, "name", ""), domain=keep[0])


def profile_host(hypervisor: Hypervisor, sampler: Sampler, clock: Clock,
                 settings: ProfileSettings = ProfileSettings(), *, key_by_name: bool = False) -> list[Observation]:
    """Freeze'nSense every running domain of one host; one observation per VM and round.

    `key_by_name` keys observations by guest name, as the online learner does
    (app/learn.py), instead of by the `workload` label shared by replicas."""
    return [o for _, o in _profile_named(hypervisor, sampler, clock, settings, key_by_name)]


def profile_and_measure(hypervisor: Hypervisor, sampler: Sampler, clock: Clock,
                        settings: ProfileSettings = ProfileSettings(), *,
                        key_by_name: bool = False,
                        probed: Counter[frozenset[str]] | None = None) -> tuple[list[Observation], Measured]:
    """`profile_host`, plus each guest's measured share of its isolated performance
    (`measured_share` of its valid ζ and ζb samples, pair probes left out): what a measured
    trial compares (core/trial.py). `probed` counts the pair probes per pair across calls."""
    named = _profile_named(hypervisor, sampler, clock, settings, key_by_name, probed)
    kept: dict[str, tuple[list[float], list[float]]] = {}
    for name, observation in named:
        if name is None:
            continue
        zeta, zeta_b = kept.setdefault(name, ([], []))
        zeta.append(observation.zeta)
        zeta_b.append(observation.zeta_b)
    shares = {n: measured_share(zeta, zeta_b) for n, (zeta, zeta_b) in sorted(kept.items())}
    measured = Measured(host=hypervisor.name,
                        performance={n: share for n, share in shares.items() if share is not None},
                        samples={n: len(kept[n][0]) for n, share in shares.items() if share is not None})
    return [o for _, o in named], measured


def _profile_named(hypervisor: Hypervisor, sampler: Sampler, clock: Clock, settings: ProfileSettings,
                   key_by_name: bool, probed: Counter[frozenset[str]] | None = None,
                   ) -> list[tuple[str | None, Observation]]:
    """(guest, observation) per ζ/ζb pair; (None, observation) per pair probe."""
    topology = hypervisor.topology()
    tenants = tenants_of(hypervisor.domains())
    if key_by_name:
        tenants = [replace(t, key=t.name) for t in tenants]
    if not tenants:
        return []
    by_name = {t.name: t for t in tenants}
    terms = interference_terms(topology, tenants)
    names = [t.name for t in tenants]
    observations: list[tuple[str | None, Observation]] = []
    probed = probed if probed is not None else Counter()
    for _ in range(settings.rounds):
        alone: dict[str, float] = {}
        zetas = measure(sampler, clock, names, settings.window_s)
        for name in names:
            zeta_b = freeze_and_sense(hypervisor, sampler, clock, name, settings.t_m)
            zeta = zetas.get(name)
            if zeta is None or not (zeta.valid and zeta_b.valid):
                reason = zeta_b.reason if zeta is not None and zeta.valid else (zeta.reason if zeta else "missing")
                log.debug("sample of %s rejected: %s", name, reason)
                continue
            if zeta_b.value <= 0 or zeta.value / zeta_b.value > settings.max_ratio:
                log.debug("sample of %s rejected: ratio %.3f out of bounds", name,
                          zeta.value / zeta_b.value if zeta_b.value > 0 else float("inf"))
                continue
            share, exposures = terms[name]
            tenant = by_name[name]
            observations.append((name, Observation(
                key=tenant.key, zeta=zeta.value, zeta_b=zeta_b.value, neighbours=exposures,
                own_share=share, workload_class=tenant.workload_class,
            )))
            alone[name] = zeta_b.value
        for pair, pair_terms in _pairs_to_probe(topology, tenants, settings.pair_probes, probed):
            observations += _pair_probe(hypervisor, sampler, clock, pair, pair_terms, alone, settings)
    return observations


PairTerms = dict[str, tuple[float, tuple]]


def _pairs_to_probe(topology: HostTopology, tenants: list[Tenant], budget: int,
                    probed: Counter[frozenset[str]]) -> list[tuple[tuple[Tenant, Tenant], PairTerms]]:
    """Up to `budget` pairs of neighbours that interfere at some distance, least probed
    first, each with its interference terms; none on a host of two (nothing else to freeze:
    the probe would be a ζ)."""
    if budget <= 0 or len(tenants) < 3:
        return []
    pairs = []
    for i, a in enumerate(tenants):
        for b in tenants[i + 1:]:
            terms = interference_terms(topology, [a, b])
            if any(terms[t.name][1] for t in (a, b)):
                pairs.append(((a, b), terms))
    pairs.sort(key=lambda item: probed[frozenset((item[0][0].name, item[0][1].name))])  # stable: host order
    chosen = pairs[:budget]
    for (a, b), _ in chosen:
        probed[frozenset((a.name, b.name))] += 1
    return chosen


def _pair_probe(hypervisor: Hypervisor, sampler: Sampler, clock: Clock, pair: tuple[Tenant, Tenant],
                terms: PairTerms, alone: dict[str, float],
                settings: ProfileSettings) -> list[tuple[str | None, Observation]]:
    """Both guests sampled while everything else is frozen; each next to its ζb of the round."""
    first, second = pair
    samples = freeze_all_but(hypervisor, sampler, clock, (first.name, second.name), settings.t_m)
    result: list[tuple[str | None, Observation]] = []
    for tenant in (first, second):
        share, exposures = terms[tenant.name]
        sample = samples.get(tenant.name)
        zeta_b = alone.get(tenant.name)
        if not exposures or sample is None or not sample.valid or not zeta_b:
            continue
        if sample.value / zeta_b > settings.max_ratio:
            continue
        result.append((None, Observation(
            key=tenant.key, zeta=sample.value, zeta_b=zeta_b, neighbours=exposures,
            own_share=share, workload_class=tenant.workload_class)))
    return result


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
    """Profile `trials` random placements with Freeze'nSense; all their observations."""
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
