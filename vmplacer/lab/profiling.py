"""The shipped Freeze'nSense profiler (app/observe/profiler.py) on a simulated host, and its samples read
the way the lab needs them.

The simulated host is the `FreezableHost`, its sampler the `Sampler` and the cluster's virtual
clock the profiler's `Clock` (and the freezer's and the samples' time): the `Profiler` and its
`Freezer` run unchanged, in simulated time, so what the evaluations measure is what the product
measures — its rounds, ζ windows at random moments of the sleep, pair probes chosen its way.
What only the lab does is read the samples: as model observations keyed the way the evaluation
keys tenants (`workload` label, or the guest's name), and as each guest's measured share through
the rebalancer's own mapping (`measured_of`).

Deterministic under a seed: the profiler draws from its own seeded random stream, the freezer
suspends and resumes one domain at a time (its single worker), and the noise of the samples is
the cluster's seeded stream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Protocol

from vmplacer.app.observe.freeze import Freezer
from vmplacer.app.observe.profiler import ProfileResult, Profiler, ProfilerConfig, measured_of
from vmplacer.core.model.interference import Exposure, Observation, Tenant, interference_terms
from vmplacer.core.model.identity import model_identity
from vmplacer.core.topology.host import HostTopology
from vmplacer.core.rebalance.trial import Measured
from vmplacer.ports import Clock, DomainInfo, FreezableHost, FreezeEntry, ProfileSample, Sampler

log = logging.getLogger(__name__)

LOAD_LABEL = "load"
# The freezer's watchdog waits in real time. A simulated freeze lasts simulated t_m and a few
# microseconds of real time, so the product's bound (max_freeze, 0.5 s) would only fire when the
# machine running the lab stalls — dropping samples at random and making a seeded evaluation
# depend on the machine's load. The lab's watchdog still ends a freeze of a hung simulation.
LAB_WATCHDOG_S = 60.0


class ProfiledHost(FreezableHost, Protocol):
    """A simulated host as the profiler and the lab read it."""

    def topology(self) -> HostTopology: ...
    def domains(self) -> list[DomainInfo]: ...


@dataclass(frozen=True)
class ProfileSettings:
    """One profiling run (docs/research/method.md §2), in the product's terms: `rounds` ζb of every
    guest (the profiler's `samples`), t_m the freeze window, `window_s` the sleep between rounds
    (t_sleep) in which each ζ is taken, `pair_probes` per round."""

    window_s: float = 1.0
    t_m: float = 0.01
    rounds: int = 1
    pair_probes: int = 0  # per round: freeze all but a guest and one neighbour, sample both
    max_ratio: float = 1.5  # a model observation with ζ/ζb above this is physically implausible: left out

    def config(self) -> ProfilerConfig:
        return ProfilerConfig(t_m_s=self.t_m, t_sleep_s=self.window_s, samples=self.rounds,
                              pair_probes=self.pair_probes)


class _MemoryJournal:
    """The `FreezeJournal` port in memory: a simulated freeze needs no durable row (nothing
    outlives the process that would have to resume it)."""

    def __init__(self) -> None:
        self._rows: dict[int, FreezeEntry] = {}
        self._next = 1

    def open(self, host: str, domains: list[tuple[str, str]], max_freeze_s: float,
             owner: dict[str, object]) -> int:
        entry, self._next = self._next, self._next + 1
        self._rows[entry] = FreezeEntry(entry, host, tuple(domains), owner, 0.0, max_freeze_s)
        return entry

    def close(self, entry_id: int) -> None:
        self._rows.pop(entry_id, None)

    def pending(self, host: str | None = None) -> list[FreezeEntry]:
        return [row for row in self._rows.values() if host is None or row.host == host]


class _SampleLog:
    """The `ProfileStore` port in memory: the samples of one run, as production stores them."""

    def __init__(self) -> None:
        self.samples: list[ProfileSample] = []

    def start_run(self, host: str, metric: str, parameters: dict[str, object]) -> int:
        return 1

    def add_samples(self, run_id: int, samples: list[ProfileSample]) -> None:
        self.samples.extend(samples)

    def finish_run(self, run_id: int, results: dict[str, object], status: str = "finished") -> None:
        pass


@dataclass
class Profiled:
    """One run of the shipped profiler on a simulated host: its result and every sample it stored."""

    result: ProfileResult | None  # None: no domain was running, nothing to profile
    samples: list[ProfileSample]


def run_profiler(host: ProfiledHost, sampler: Sampler, clock: Clock,
                 settings: ProfileSettings = ProfileSettings()) -> Profiled:
    """The product's `Profiler` over `settings.rounds` rounds of every running domain of `host`."""
    if not any(status.running for status in host.domain_states().values()):
        return Profiled(None, [])
    config = settings.config()
    freezer = Freezer(host, _MemoryJournal(), max_freeze_s=max(LAB_WATCHDOG_S, config.max_freeze_s),
                      owner={"process": "vmplacer-lab"}, workers=1, clock=clock.now)
    log_ = _SampleLog()
    profiler = Profiler(host, sampler, freezer, config, store=log_, topology=host.topology(), clock=clock,
                        wall=clock.now)
    try:
        result = profiler.run()
    finally:
        freezer.close()
    return Profiled(result, log_.samples)


# --------------------------------------------------------------------------- reading the samples
def tenants_of(domains: list[DomainInfo]) -> list[Tenant]:
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
        identity = model_identity(domain.name, labels)  # as the rebalancer and the product's learner key it
        tenants.append(Tenant(
            name=domain.name,
            cpus=dict(domain.placement.vcpupin),
            key=identity.key,
            workload_class=identity.workload_class,
            load=load,
        ))
    return tenants


def observations_of(host: ProfiledHost, profiled: Profiled, settings: ProfileSettings = ProfileSettings(), *,
                    key_by_name: bool = False) -> list[Observation]:
    """The run's samples as model observations of the host's layout (unchanged while profiled).

    Each ζb with the guest's ζ nearest in time (as the product's learner pairs them, app/learn/online.py)
    is one observation of every neighbour at once; each ζp with the guest's nearest ζb is one of
    the single neighbour that ran beside it. Unlike the product's learner, exposures are keyed and
    weighted as the evaluation predicts tenants (`interference_terms`: workload keys, time shares),
    so the lab's model is scored on the terms it predicts with. `key_by_name` keys guests by name."""
    if not profiled.samples:
        return []
    topology = host.topology()
    tenants = tenants_of(host.domains())
    if key_by_name:
        tenants = [replace(t, key=t.name) for t in tenants]
    by_name = {t.name: t for t in tenants}
    terms = interference_terms(topology, tenants)
    kinds: dict[str, dict[str, list[ProfileSample]]] = {}
    for sample in profiled.samples:
        kinds.setdefault(sample.guest, {"zeta": [], "zeta_b": [], "zeta_p": []})[sample.kind].append(sample)
    observations: list[Observation] = []
    for name, samples in sorted(kinds.items()):
        tenant = by_name.get(name)
        if tenant is None:
            continue
        for alone in samples["zeta_b"]:
            if not samples["zeta"] or alone.value <= 0:
                continue
            shared = min(samples["zeta"], key=lambda s: abs(s.at - alone.at))
            observation = _observation(tenant, shared.value, alone.value, terms[name], settings)
            if observation is not None:
                observations.append(observation)
        for pair in samples["zeta_p"]:
            partners = [n.name for n in pair.neighbours if not n.frozen and n.name in by_name]
            usable = [s for s in samples["zeta_b"] if s.value > 0]
            if len(partners) != 1 or not usable:
                continue
            alone = min(usable, key=lambda s: abs(s.at - pair.at))
            pair_terms = interference_terms(topology, [tenant, by_name[partners[0]]])[name]
            if pair_terms[1]:
                observation = _observation(tenant, pair.value, alone.value, pair_terms, settings)
                if observation is not None:
                    observations.append(observation)
    return observations


def _observation(tenant: Tenant, zeta: float, zeta_b: float, terms: tuple[float, tuple[Exposure, ...]],
                 settings: ProfileSettings) -> Observation | None:
    if zeta / zeta_b > settings.max_ratio:
        log.debug("sample of %s left out: ratio %.3f out of bounds", tenant.name, zeta / zeta_b)
        return None
    share, exposures = terms
    return Observation(key=tenant.key, zeta=zeta, zeta_b=zeta_b, neighbours=exposures, own_share=share,
                       workload_class=tenant.workload_class)


def measured(host: ProfiledHost, profiled: Profiled, message: str = "") -> Measured:
    """Each guest's measured share of its isolated performance, as the rebalancer reads a run."""
    if profiled.result is None:
        return Measured(host.name, {}, {}, message)
    return measured_of(host.name, profiled.result.vms, message)
