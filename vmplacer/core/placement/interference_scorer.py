"""Model-aware admission: a `Scorer` that ranks a new guest's candidate placements by the
interference the model predicts, for the guest and for the guests it would join.

For one candidate placement on a host, with the guests already there:

    loss = (1 − perf_new) + Σ_j (work_j before − work_j after) / work_j alone before

perf as in `InterferenceModel.predict` (fraction of isolated performance, time
sharing included; work = perf × the pCPU time the guest gets alone), with the distance class between the candidate's pCPUs and
each other guest's pCPUs, and β's from `ShrunkBetas` so that a guest with no
samples is judged by its workload class, then by the fleet. Floating guests
lose the pCPUs the candidate would own (the placement service narrows their
pins the same way). The score is 1 / (1 + loss): 1 with no predicted loss,
falling as loss grows, never below 0; `WeightedScorer` mixes it with the
topology scorers by the configured weight. With no data the scorer is not
composed at all (`admission_scorer`), so placements stay exactly the
topology-only ones.

It also asks the engine for `alternatives`: more candidate pCPUs per node
(each starting from another core), because the engine's default fill builds
one or two candidates per node and the model can only pick among what is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from vmplacer.core.model.class_priors import Identity, ShrinkageSettings, ShrunkBetas
from vmplacer.core.placement.admission_delta import KeptHost
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.model.interference import UNKNOWN_CLASS, Tenant, TenantLayout, remaining, tenant_pieces
from vmplacer.core.model.identity import LABEL_CLASS, LABEL_WORKLOAD, ModelIdentityError, model_identity  # noqa: F401
from vmplacer.core.placement.occupancy import exclusive_of, split_vcpus
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.scoring import Scorer, WeightedScorer, default_scorer
from vmplacer.core.topology.host import HostTopology

# Labels read (the rebalancer reads the same ones; operators set them in the request's `labels`).
# The model key and class come from core/model/identity.py, as the rebalancer and learning take them.
LABEL_LOAD = "load"


@dataclass(frozen=True)
class AdmissionSettings:
    """`weight`: the interference scorer's weight relative to all topology scorers together
    (0 = topology only); `candidates`: extra candidate starting cores tried per node."""

    weight: float = 1.0
    candidates: int = 16
    shrinkage: ShrinkageSettings = field(default_factory=ShrinkageSettings)

    def __post_init__(self) -> None:
        if not (isinstance(self.weight, (int, float)) and math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"admission: field 'weight' must be a number >= 0, got {self.weight!r}")
        if not (isinstance(self.candidates, int) and 0 <= self.candidates <= 1024):
            raise ValueError(f"admission: field 'candidates' must be an integer in 0..1024, got {self.candidates!r}")


@dataclass(frozen=True)
class GuestProfile:
    """What admission knows of a guest: its model key, workload class and busyness."""

    name: str
    key: str = ""
    workload_class: str = UNKNOWN_CLASS
    load: float = 1.0


def profile_from_labels(name: str, labels: Mapping[str, str], workload_class: str = UNKNOWN_CLASS) -> GuestProfile:
    """A guest already on a host, from its labels. A `load` label that is not a number in
    (0, 1] is the rebalancer's to refuse; admission then takes the guest as fully busy."""
    if not labels:  # most guests: every placement builds one profile per guest on the host
        return GuestProfile(name, name, workload_class or UNKNOWN_CLASS, 1.0)
    try:
        load = float(labels.get(LABEL_LOAD, "1"))
    except ValueError:
        load = 1.0
    if not (0.0 < load <= 1.0):
        load = 1.0
    try:
        identity = model_identity(name, labels, workload_class=workload_class)
    except ModelIdentityError:  # hand-edited metadata: the rebalancer refuses it; admission keys by name
        identity = model_identity(name, workload_class=workload_class)
    return GuestProfile(name, identity.key, identity.workload_class, load)


def profile_of_spec(spec: GuestSpec) -> GuestProfile:
    """A new guest: key and class from its labels, else its spec's workload class. Its demand
    is unknown until measured, so it is taken as fully busy (the cautious choice)."""
    try:
        identity = model_identity(spec.name, spec=spec)
    except ModelIdentityError:  # a spec built past validation: keyed by name, as describe_guest's fallback
        identity = model_identity(spec.name, workload_class=spec.workload_class)
    return GuestProfile(spec.name, identity.key, identity.workload_class, 1.0)


@dataclass(frozen=True)
class AdmissionLoss:
    """Predicted loss of one candidate: the new guest's, and what each guest it joins loses."""

    guest: float
    joined: dict[str, float]

    @property
    def total(self) -> float:
        return self.guest + sum(self.joined.values())

    def to_dict(self) -> dict[str, object]:
        return {"guest": round(self.guest, 4), "total": round(self.total, 4),
                "joined": {name: round(v, 4) for name, v in sorted(self.joined.items(), key=lambda kv: -kv[1])}}


class InterferenceScorer:
    """Scores a candidate 1 / (1 + predicted loss); see the module docstring.

    `judge_as_changes`: candidates are judged as changes to the kept neighbours
    (`admission_delta.KeptHost`) where that can tell, else rebuilt in full."""

    judge_as_changes = True

    def __init__(self, betas: ShrunkBetas, guest: GuestProfile,
                 neighbours: Mapping[str, GuestProfile] | None = None, alternatives: int = 16):
        self.betas = betas
        self.guest = guest
        self.neighbours = dict(neighbours or {})
        self.alternatives = alternatives
        self._base_for: object = None
        self._base: dict[str, tuple[float, float]] = {}
        self._before: list[Tenant] = []  # the others as tenants, before the candidate
        self._floating: dict[str, Placement] = {}  # others with floating vCPUs (their pins may narrow)
        self._identities: dict[str, Identity] = {}
        self._pieces: dict[int, tuple[Tenant, np.ndarray, np.ndarray]] = {}  # the others' pieces, kept per search
        self._pools: dict[str, tuple[np.ndarray, int]] = {}  # floating others: (their pool, sorted; vCPUs)
        self._kept: KeptHost | None = None  # the others, kept so that a candidate is judged as a change
        self._kept_alone: tuple[np.ndarray, np.ndarray] = (np.zeros(0, dtype=object), np.zeros(0))

    def score(self, topology: HostTopology, placement: Placement, others: Sequence[Placement]) -> float:
        return 1.0 / (1.0 + max(self.loss(topology, placement, others).total, 0.0))

    def identity(self, name: str) -> Identity:
        found = self._identities.get(name)
        if found is None:
            profile = self.guest if name == self.guest.name else self.neighbours.get(name, GuestProfile(name))
            found = self._identities[name] = self.betas.identity(profile.name, profile.key, profile.workload_class)
        return found

    def _load(self, name: str) -> float:
        profile = self.guest if name == self.guest.name else self.neighbours.get(name)
        return profile.load if profile is not None else 1.0

    def loss(self, topology: HostTopology, placement: Placement, others: Sequence[Placement]) -> AdmissionLoss:
        if self._base_for is not others:  # the baseline is the same for every candidate of one search
            self._before = _tenants(topology, others, frozenset(), self._load)
            self._pieces = {}
            self._floating = {p.guest: p for p in others if split_vcpus(p)[1]}
            self._kept = None
            if self._before and self.judge_as_changes:  # the kept host's own flattening is the baseline
                layout = TenantLayout.build(topology, self._before, self._pieces, True)
                self._pools = _pools(self._before, self._floating, self._pieces)
                self._kept = KeptHost(self.betas, topology, layout, self._pools, set(self._floating),
                                      self.identity, self.identity(placement.guest))
                self._kept_alone = (np.array([t.name for t in self._before], dtype=object), layout.alone)
                self._base = {t.name: (float(self._kept.before[i]), float(layout.alone[i]))
                              for i, t in enumerate(self._before)}
            else:
                self._base = self._perf(topology, self._before, keep=True)
                self._pools = _pools(self._before, self._floating, self._pieces)
            self._base_for = others
        taken = exclusive_of(placement)
        judged = self._judged(topology, placement, taken)
        if judged is not None:
            return judged
        taken_cpus = np.fromiter(taken, dtype=np.int64, count=len(taken))
        tenants, pieces = [], self._pieces
        for tenant in self._before:
            floating = self._floating.get(tenant.name)
            if floating is None or not any(cpus & taken for cpus in tenant.cpus.values()):
                tenants.append(tenant)
            elif tenant.name in self._pools:  # its vCPUs leave the candidate's pCPUs: its pieces, narrowed
                if pieces is self._pieces:
                    pieces = dict(self._pieces)
                pieces[id(tenant)] = (tenant, *_narrowed(tenant, *self._pools[tenant.name], taken_cpus))
                tenants.append(tenant)
            else:
                tenants.extend(_tenants(topology, [floating], taken, self._load))
        tenants.extend(_tenants(topology, [placement], frozenset(), self._load))
        after = _performance(self.betas, topology, tenants, self.identity, pieces, keep=False)
        joined = {}
        for name, (work, _) in after.items():
            if name == placement.guest or name not in self._base:
                continue
            before, alone = self._base[name]
            lost = (before - work) / alone  # in the guest's own units: a narrowed pool counts too
            if abs(lost) > 1e-12:
                joined[name] = lost
        work, alone = after.get(placement.guest, (1.0, 1.0))
        return AdmissionLoss(1.0 - work / alone, joined)

    def _judged(self, topology: HostTopology, placement: Placement, taken: frozenset[int]) -> AdmissionLoss | None:
        """The candidate's loss as a change to the kept host, or None where only a full rebuild can tell."""
        if self._kept is None or placement.guest in self._base:
            return None
        guest = _tenants(topology, [placement], frozenset(), self._load)
        if not guest:
            return None
        cpus, demand = tenant_pieces(topology, guest[0], {}, keep=False)
        work = self._kept.judge(taken, cpus, demand)
        if work is None:
            return None
        names, alone = self._kept_alone
        lost = (work.before - work.after) / alone
        changed = np.flatnonzero(np.abs(lost) > 1e-12)
        joined = dict(zip(names[changed].tolist(), lost[changed].tolist()))
        return AdmissionLoss(1.0 - work.guest_work / work.guest_alone, joined)

    def _perf(self, topology: HostTopology, tenants: list[Tenant], keep: bool) -> dict[str, tuple[float, float]]:
        """`keep`: the tenants' pieces are kept for the search (the others, not each candidate's own)."""
        return _performance(self.betas, topology, tenants, self.identity, self._pieces, keep)


def predicted_performance(betas: ShrunkBetas, topology: HostTopology, placements: Sequence[Placement],
                          profiles: Mapping[str, GuestProfile]) -> dict[str, float]:
    """Each guest's predicted performance (fraction of isolated) on one host, β's shrunk
    guest → class → global: what admission optimises, for reports and benchmarks."""
    def identity(name: str) -> Identity:
        profile = profiles.get(name, GuestProfile(name))
        return betas.identity(profile.name, profile.key, profile.workload_class)

    def load(name: str) -> float:
        profile = profiles.get(name)
        return profile.load if profile is not None else 1.0

    work = _performance(betas, topology, _tenants(topology, placements, frozenset(), load), identity)
    return {name: done / alone for name, (done, alone) in work.items()}


def _performance(betas: ShrunkBetas, topology: HostTopology, tenants: list[Tenant], identity_of,
                 memo: dict[int, tuple[Tenant, np.ndarray, np.ndarray]] | None = None,
                 keep: bool = True) -> dict[str, tuple[float, float]]:
    """Per tenant: (work done, work alone with the same pins), both in pCPU-time units, with
    `InterferenceModel.predict`'s arithmetic (time shares, distance classes) and shrunk β's;
    their ratio is `predict`'s perf. `memo`: tenants' pieces kept between calls (`TenantLayout.build`)."""
    if not tenants:
        return {}
    layout = TenantLayout.build(topology, tenants, memo, keep)
    identities: dict[Identity, int] = {}
    kind = np.array([identities.setdefault(identity_of(t.name), len(identities)) for t in layout.tenants],
                    dtype=np.int64)
    table = betas.table(tuple(identities))
    loss = layout.neighbour_sum(table, kind[layout.owner])  # [x]: what every neighbour costs piece x
    got = np.bincount(layout.owner, weights=layout.granted * remaining(loss, betas.form), minlength=len(layout.tenants))
    return {t.name: (max(float(got[i]), 0.0), float(layout.alone[i])) for i, t in enumerate(layout.tenants)}


def _pools(tenants: list[Tenant], floating: Mapping[str, Placement],
           pieces: Mapping[int, tuple[Tenant, np.ndarray, np.ndarray]]) -> dict[str, tuple[np.ndarray, int]]:
    """Tenants whose every vCPU floats over one pool (the common floating guest): name -> (the
    pool's pCPUs, sorted: their kept pieces; vCPUs). A candidate narrows them by array operations."""
    pools = {}
    for tenant in tenants:
        placement = floating.get(tenant.name)
        if placement is None or len(split_vcpus(placement)[1]) != len(tenant.cpus):
            continue
        sets = list(tenant.cpus.values())
        kept = pieces.get(id(tenant))
        if kept is not None and all(cpus == sets[0] for cpus in sets[1:]):
            pools[tenant.name] = (kept[1], len(sets))
    return pools


def _narrowed(tenant: Tenant, pool: np.ndarray, vcpus: int, taken: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pieces of `tenant` (every vCPU over `pool`) once its vCPUs leave `taken` — as
    `_tenants` narrows it, unless that leaves nothing — with `TenantLayout.build`'s floats."""
    stays = ~np.isin(pool, taken)
    cpus = pool[stays] if 0 < int(stays.sum()) < len(pool) else pool
    share = tenant.load / len(cpus)
    demand = np.full(len(cpus), share)
    for _ in range(vcpus - 1):
        demand += share
    return cpus, demand


def _tenants(topology: HostTopology, placements: Sequence[Placement], taken: frozenset[int],
             load_of) -> list[Tenant]:
    """Placements as model tenants. Floating vCPUs leave pCPUs in `taken` (the candidate's own,
    as `refresh_shared_pins` will narrow them); vCPUs pinned nowhere float over every usable pCPU."""
    usable = frozenset(topology.usable_cpus) or frozenset(c for c, cpu in topology.cpus.items() if cpu.online)
    tenants = []
    for placement in placements:
        _, shared = split_vcpus(placement)
        pins = {}
        for vcpu, cpus in placement.vcpupin.items():
            cpus = frozenset(c for c in cpus if c in topology.cpus) or usable
            if vcpu in shared and cpus - taken and cpus & taken:
                cpus = cpus - taken
            pins[vcpu] = cpus
        if pins and all(pins.values()):
            tenants.append(Tenant(placement.guest, pins, load=load_of(placement.guest)))
    return tenants


def admission_scorer(betas: ShrunkBetas | None, spec: GuestSpec, neighbours: Mapping[str, GuestProfile],
                     settings: AdmissionSettings) -> Scorer:
    """The engine's scorer for placing `spec`: the topology scorers, plus the interference
    scorer at `settings.weight` of their total when the model has data. Without data (or
    weight 0) this *is* `default_scorer()`, so placements are exactly the topology-only ones."""
    base = default_scorer()
    if betas is None or betas.empty or settings.weight <= 0:
        return base
    total = sum(weight for weight, _ in base.parts)
    scorer = InterferenceScorer(betas, profile_of_spec(spec), neighbours, settings.candidates)
    return base.plus(settings.weight * total, scorer)


def interference_part(scorer: Scorer) -> InterferenceScorer | None:
    """The interference scorer inside a composed scorer (for explanations), if any."""
    if isinstance(scorer, InterferenceScorer):
        return scorer
    if isinstance(scorer, WeightedScorer):
        for _, part in scorer.parts:
            if isinstance(part, InterferenceScorer):
                return part
    return None
