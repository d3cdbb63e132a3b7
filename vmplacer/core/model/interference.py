"""Pairwise, topology-aware interference model (seed 004, chapters 3–4).

Each VM's performance is predicted as a fraction of its isolated performance
(1.0 = as fast as when it runs alone on the host, with the same pinning):

    perf(x) = s(x) · (1 − Σ_y β_c(key_y → key_x) · g_y)

per vCPU x, averaged over the VM's vCPUs (weighted by the time they get), with

* g_y  — the time share vCPU y actually gets on its pCPU (its demand, divided
  down when several vCPUs share one pCPU: throughput is split, not lost);
* s(x) — x's own time share relative to running alone (1 unless pCPUs are
  shared);
* β_c(u → v) — the loss VM u causes VM v when their pCPUs are in distance
  class c (same-core, same-l2, same-llc, same-node, remote-node). Two vCPUs on
  one pCPU never run at the same instant, so they only split time.

This is the seed's first-order model: for whole tasks on separate cores the
sum over all pairs is eq. 3.5, L_sys = Σ|T_i| − ΣΣ T_iᵀ B T_j.

`ModelConfig.form` = multiplicative reads the same sum as a rate instead:
perf(x) = s(x) · exp(−Σ_y β_c · g_y), each neighbour taking its share of what
the others left, as contention for one cache or memory bus compounds. The two
agree for small losses; on a full or overcommitted host of heavy neighbours
the additive sum passes 1 and stops telling layouts apart. An observation then
gives ln s − ln(ζ/ζb) = Σ β·w/s, fitted the same way.

Coefficients are learned, not measured pair by pair. One Freeze'nSense
observation of VM v (ζ with neighbours running, ζb with them frozen) gives one
linear equation: s − ζ/ζb = Σ_(u,c) β_c(u → v) · w_(u,c). Least squares over
many observations, in two stages so that VMs never seen together still get a
coefficient:

1. a factor model
       β_c(u → v) ≈ f_c · (μ + I_class(u) + S_class(v) + I_u + S_v + P_u · Q_v):
   per-VM interference I and sensitivity S (seed ch. 4) shrunk toward their
   workload class, classes shrunk toward the global mean μ, a pressure ×
   susceptibility product P_u·Q_v for "heavy hitter meets fragile victim"
   (which additive scores miss), and one scale f_c per distance class; solved
   jointly by damped Gauss-Newton, the best-observed distance class fixed at
   its prior;
2. each observed (u, v, c) coefficient solved from its own data, shrunk
   toward the factor model's value.

No data at all leaves every β at 0: the model is then the linear predictor
(time shares only) and never fails. The sufficient statistics are kept per
observed VM (ZᵀZ and Zᵀy over its (neighbour, distance) features), so
`update` adds one observation in place and the state serialises to a plain
dict; see docs/model.md.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

import numpy as np

from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.model.stats import ridge_toward
from vmplacer.core.topology.host import NEIGHBOUR_CLASSES, DistanceClass, HostTopology

MODEL_FORMAT = "vmplacer-interference-model"
MODEL_VERSION = 1
UNKNOWN_CLASS = "unknown"

ADDITIVE = "additive"  # perf = s·(1 − Σ β·g): the seed's eq. 3.5
MULTIPLICATIVE = "multiplicative"  # perf = s·exp(−Σ β·g): each neighbour takes a share of what is left
FORMS = (ADDITIVE, MULTIPLICATIVE)
RATIO_FLOOR = 0.01  # ζ/ζb below this is read as this in the multiplicative form (its log would run away)

_CLASSES: tuple[DistanceClass, ...] = tuple(DistanceClass)  # index == DistanceClass.rank
_N_CLASSES = len(_CLASSES)
_SAME_CPU = DistanceClass.SAME_CPU.rank
_LOOPED_PINS = 8  # layouts of fewer pins per tenant on average are flattened pin by pin (no array set-up)
DENSE_PIECES = 256  # layouts of more pieces sum neighbours per pCPU (`_Layout.neighbour_sum`), not per pair
_DEFAULT_REFERENCE = DistanceClass.SAME_LLC


# --------------------------------------------------------------------------- values
@dataclass(frozen=True)
class Tenant:
    """One VM on a candidate host: who it is, where its vCPUs run, how busy it is.

    `cpus` is a vCPU → pCPUs map (a vCPU allowed on several pCPUs is spread
    evenly over them) or simply a collection of pCPUs, one vCPU on each.
    `load` is the time share each vCPU asks for (1.0 = always busy).
    """

    name: str
    cpus: Mapping[int, frozenset[int]] | Iterable[int]
    key: str = ""
    workload_class: str = UNKNOWN_CLASS
    load: float = 1.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("tenant: field 'name' must not be empty")
        if isinstance(self.cpus, Mapping):
            cpus = {int(vcpu): frozenset(map(int, pcpus)) for vcpu, pcpus in self.cpus.items()}
        else:
            cpus = {index: frozenset({int(p)}) for index, p in enumerate(sorted(set(self.cpus)))}
        if not cpus:
            raise ValueError(f"tenant {self.name!r}: field 'cpus' is empty")
        for vcpu, pcpus in cpus.items():
            if not pcpus:
                raise ValueError(f"tenant {self.name!r}: field 'cpus': vCPU {vcpu} has no pCPU")
        if not (isinstance(self.load, (int, float)) and 0.0 < self.load <= 1.0):
            raise ValueError(f"tenant {self.name!r}: field 'load' must be in (0, 1], got {self.load!r}")
        object.__setattr__(self, "cpus", cpus)
        object.__setattr__(self, "key", self.key or self.name)
        object.__setattr__(self, "workload_class", self.workload_class or UNKNOWN_CLASS)

    @classmethod
    def from_placement(
        cls, placement: Placement, *, key: str = "", workload_class: str = UNKNOWN_CLASS, load: float = 1.0
    ) -> Tenant:
        return cls(placement.guest, dict(placement.vcpupin), key or placement.guest, workload_class, load)


@dataclass(frozen=True)
class Exposure:
    """Time a VM spent next to a neighbour workload at one distance.

    `load` is the neighbour's time share weighted by the observed VM's own
    share (the w in s − ζ/ζb = Σ β·w); for single-vCPU VMs on their own pCPUs
    it is just the neighbour's time share.
    """

    key: str
    distance: DistanceClass
    load: float
    workload_class: str = UNKNOWN_CLASS


@dataclass(frozen=True)
class Observation:
    """One Freeze'nSense result: ζ with neighbours running, ζb with them frozen."""

    key: str
    zeta: float
    zeta_b: float
    neighbours: tuple[Exposure, ...]
    own_share: float = 1.0  # time share with neighbours running vs alone (shared pCPUs)
    workload_class: str = UNKNOWN_CLASS

    def __post_init__(self) -> None:
        who = f"observation of {self.key!r}"
        if not self.key:
            raise ValueError("observation: field 'key' must not be empty")
        if not (math.isfinite(self.zeta_b) and self.zeta_b > 0):
            raise ValueError(f"{who}: field 'zeta_b' must be a finite number > 0, got {self.zeta_b!r}")
        if not (math.isfinite(self.zeta) and self.zeta >= 0):
            raise ValueError(f"{who}: field 'zeta' must be a finite number >= 0, got {self.zeta!r}")
        if not (0.0 < self.own_share <= 1.0):
            raise ValueError(f"{who}: field 'own_share' must be in (0, 1], got {self.own_share!r}")
        object.__setattr__(self, "neighbours", tuple(self.neighbours))
        for exposure in self.neighbours:
            if exposure.distance not in NEIGHBOUR_CLASSES:
                raise ValueError(f"{who}: neighbour {exposure.key!r}: field 'distance' must be one of "
                                 f"{', '.join(c.value for c in NEIGHBOUR_CLASSES)}, got {exposure.distance!r}")
            if not (math.isfinite(exposure.load) and exposure.load >= 0):
                raise ValueError(f"{who}: neighbour {exposure.key!r}: field 'load' must be >= 0, "
                                 f"got {exposure.load!r}")

    @property
    def degradation(self) -> float:
        """1 − ζ/ζb: everything the VM lost, time sharing included."""
        return 1.0 - self.zeta / self.zeta_b

    @property
    def interference_loss(self) -> float:
        """The part of the loss the β's must explain: own_share − ζ/ζb."""
        return self.own_share - self.zeta / self.zeta_b


@dataclass(frozen=True)
class Prediction:
    """Predicted performance of one VM as a fraction of its isolated performance.

    `share` is what time sharing alone leaves (the linear predictor);
    `throughput` is perf × the pCPU time the VM would get alone (its load per
    vCPU), so summing it over VMs gives the seed's system load L_sys. `confidence` in [0, 1] says how
    much of the predicted interference rests on observed data (1 = exact
    pairs well observed or no neighbours; 0 = no data, linear fallback).
    """

    perf: float
    confidence: float
    share: float
    throughput: float


@dataclass(frozen=True)
class ModelConfig:
    """Shrinkage strengths, in units of "unit-exposure observations" of prior weight, and the
    form in which neighbours' losses combine (`FORMS`)."""

    pair_shrinkage: float = 0.5  # (u, v, c) coefficient toward the factor model
    key_shrinkage: float = 2.0  # a VM's sensitivity/interference toward its workload class
    class_shrinkage: float = 0.5  # a workload class toward the global mean (classes are well observed)
    distance_shrinkage: float = 1.0  # a distance-class scale toward its prior
    distance_prior: Mapping[str, float] = field(default_factory=dict)  # class -> scale; default 1.0
    confidence_evidence: float = 3.0  # observations at which confidence reaches 1/2
    iterations: int = 30  # Gauss-Newton steps of the factor model (it usually stops earlier)
    form: str = ADDITIVE  # how neighbours' losses combine: see `FORMS` and `remaining`

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"model config: field 'form' must be one of {', '.join(FORMS)}, got {self.form!r}")
        for name in ("pair_shrinkage", "key_shrinkage", "class_shrinkage", "distance_shrinkage",
                     "confidence_evidence"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"model config: field {name!r} must be a number >= 0, got {value!r}")
        if not (isinstance(self.iterations, int) and self.iterations >= 1):
            raise ValueError(f"model config: field 'iterations' must be an integer >= 1, got {self.iterations!r}")
        prior = {}
        for name, value in dict(self.distance_prior).items():
            try:
                cls = DistanceClass(name)
            except ValueError:
                raise ValueError(f"model config: field 'distance_prior': unknown distance class {name!r}") from None
            if cls not in NEIGHBOUR_CLASSES:
                raise ValueError(f"model config: field 'distance_prior': {cls.value!r} is not a neighbour class")
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"model config: field 'distance_prior.{cls.value}' must be >= 0, got {value!r}")
            prior[cls.value] = float(value)
        object.__setattr__(self, "distance_prior", prior)

    def prior_scale(self, cls: DistanceClass) -> float:
        if cls is DistanceClass.SAME_CPU:
            return 0.0
        return self.distance_prior.get(cls.value, 1.0)

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["distance_prior"] = dict(self.distance_prior)
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"model config: unknown field(s) {', '.join(sorted(unknown))}")
        return cls(**dict(data))


def remaining(loss: np.ndarray, form: str) -> np.ndarray:
    """The fraction of its speed a vCPU keeps, given Σ β·g over its neighbours.

    Additive, a sum of losses can exceed 1 on a full host of heavy neighbours and is cut at 0
    (after which no layout of those neighbours looks worse than another); multiplicative, each
    neighbour takes its share of what the others left, which is how contention for one cache
    or memory bus compounds. For small losses the two agree to first order."""
    return np.exp(-loss) if form == MULTIPLICATIVE else 1.0 - loss


def observed_target(obs: Observation, form: str) -> float:
    """What Σ β·w must explain for one observation, in the model's form: own_share − ζ/ζb
    (additive) or ln(own_share) − ln(ζ/ζb) (multiplicative; ζ/ζb read as at least RATIO_FLOOR)."""
    if form == MULTIPLICATIVE:
        return math.log(obs.own_share) - math.log(max(obs.zeta / obs.zeta_b, RATIO_FLOOR))
    return obs.interference_loss


def observed_exposure(obs: Observation, exposure: Exposure, form: str) -> float:
    """An exposure's w in one observation's equation, in the model's form.

    `Exposure.load` is the neighbour's time share times the observed guest's own share: the
    additive form's w, since a guest that runs a third of the time loses a third of what its
    neighbours would take from it alone. The multiplicative form explains ln(own_share) −
    ln(ζ/ζb), a loss rate that time sharing does not dilute (the prediction reads exp(−Σ β·g)
    with g the neighbour's share alone), so its w is the load divided by the own share. Kept as
    the load, a guest that shares its pCPU would teach coefficients 1/own_share too large."""
    if form == MULTIPLICATIVE:
        return exposure.load / obs.own_share
    return exposure.load


def observed_scale(obs: Observation, form: str) -> float:
    """How much one observation's equation weighs in the fit: 1 (additive), or in the
    multiplicative form the fraction of its speed the guest kept, ζ/ζb ÷ own_share, capped at 1.

    A log magnifies a small ratio's noise: a guest that kept 5 % of its speed, measured 1 %
    off, is 0.2 off in ln but 0.01 off in speed. Weighing the ln equation by the kept fraction
    (the first-order change of variable, δq ≈ q·δ ln q) fits the errors in speed, as the
    additive form and the planner's objective count them."""
    if form != MULTIPLICATIVE:
        return 1.0
    return min(1.0, max(obs.zeta / obs.zeta_b, RATIO_FLOOR) / obs.own_share)


# --------------------------------------------------------------------------- statistics
class _Block:
    """Sufficient statistics of every observation of one target workload."""

    __slots__ = ("features", "gram", "rhs", "size", "observations", "yy")

    def __init__(self) -> None:
        self.features: dict[tuple[str, int], int] = {}
        self.gram = np.zeros((4, 4))
        self.rhs = np.zeros(4)
        self.size = 0
        self.observations = 0
        self.yy = 0.0

    def index(self, feature: tuple[str, int]) -> int:
        found = self.features.get(feature)
        if found is not None:
            return found
        if self.size == self.rhs.shape[0]:
            capacity = 2 * self.size
            gram = np.zeros((capacity, capacity))
            gram[: self.size, : self.size] = self.gram[: self.size, : self.size]
            rhs = np.zeros(capacity)
            rhs[: self.size] = self.rhs[: self.size]
            self.gram, self.rhs = gram, rhs
        self.features[feature] = self.size
        self.size += 1
        return self.size - 1

    def add_rows(self, rows: np.ndarray, cols: np.ndarray, values: np.ndarray, targets: np.ndarray,
                 scale: np.ndarray | None = None) -> None:
        """Add observations given as a sparse design (row, feature, value) and their y, each row
        (design and y) multiplied by its `scale` when given (weighted least squares)."""
        z = np.zeros((targets.shape[0], self.size))
        np.add.at(z, (rows, cols), values)
        if scale is not None:
            z *= scale[:, None]
            targets = targets * scale
        self.gram[: self.size, : self.size] += z.T @ z
        self.rhs[: self.size] += z.T @ targets
        self.observations += int(targets.shape[0])
        self.yy += float(targets @ targets)

    def views(self) -> tuple[np.ndarray, np.ndarray]:
        return self.gram[: self.size, : self.size], self.rhs[: self.size]


class _FactorLayout:
    """Where each factor-model parameter lives in the parameter vector:
    [μ | class interference | class sensitivity | I_u | S_v | P_u | Q_v]."""

    def __init__(self, n_wcls: int, n_keys: int):
        self.n_keys = n_keys
        self.class_interference = 1
        self.class_sensitivity = 1 + n_wcls
        self.interference = 1 + 2 * n_wcls
        self.sensitivity = self.interference + n_keys
        self.pressure = self.sensitivity + n_keys
        self.susceptibility = self.pressure + n_keys
        self.size = self.susceptibility + n_keys
        self.pressure_slice = slice(self.pressure, self.susceptibility)
        self.susceptibility_slice = slice(self.susceptibility, self.size)

    def prior(self) -> np.ndarray:
        """Everything 0 except the susceptibilities, 1: an unseen VM is averagely sensitive."""
        theta = np.zeros(self.size)
        theta[self.susceptibility_slice] = 1.0
        return theta

    def penalty(self, cfg: ModelConfig) -> np.ndarray:
        pen = np.empty(self.size)
        pen[0] = 1e-9
        pen[self.class_interference:self.interference] = cfg.class_shrinkage
        pen[self.interference:] = cfg.key_shrinkage
        return np.maximum(pen, 1e-9)  # no data in a direction -> exactly the prior

    def split(self, theta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                np.ndarray, np.ndarray]:
        return (
            float(theta[0]),
            theta[self.class_interference:self.class_sensitivity],
            theta[self.class_sensitivity:self.interference],
            theta[self.interference:self.sensitivity],
            theta[self.sensitivity:self.pressure],
            theta[self.pressure_slice],
            theta[self.susceptibility_slice],
        )


@dataclass
class _Solution:
    """Dense arrays for fast prediction, rebuilt after data changes."""

    keys: dict[str, int]
    wclasses: dict[str, int]
    key_wclass: np.ndarray  # per key: workload-class index
    mu: float
    class_interference: np.ndarray
    class_sensitivity: np.ndarray
    interference: np.ndarray  # per key (+1 padding slot for unknown keys)
    sensitivity: np.ndarray
    pressure: np.ndarray  # per key: the product term P_u · Q_v
    susceptibility: np.ndarray
    scale: np.ndarray  # per distance class
    residual: np.ndarray  # [class, interferer, target] (padded)
    confidence: np.ndarray  # [class, interferer, target] (padded)
    reference: DistanceClass
    noise_sd: float = 0.0  # residual standard deviation of one observation's loss around the fit


def _nearer_never_less(scale: np.ndarray, evidence: np.ndarray, reference: DistanceClass) -> np.ndarray:
    """The distance scales made non-increasing from same-core to remote-node (weighted
    pool-adjacent-violators), the reference class held where it is.

    Nearer pCPUs share more hardware (docs/research/method.md §1): a fit that rates SMT siblings
    below cores that only share the LLC is reading noise or confounded layouts.
    Classes without data follow their neighbours.
    """
    ranks = list(range(1, _N_CLASSES))  # same-core … remote-node
    weights = [1e12 if r == reference.rank else max(float(evidence[r]), 1e-9) for r in ranks]
    blocks: list[list[float]] = []  # [weighted sum, weight, count]
    for r, w in zip(ranks, weights):
        blocks.append([scale[r] * w, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            total, weight, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += weight
            blocks[-1][2] += count
    result = scale.copy()
    r = 1
    for total, weight, count in blocks:
        result[r:r + count] = total / weight
        r += count
    return result


def _fit_factors(blocks, key_wclass: np.ndarray, params: _FactorLayout, cfg: ModelConfig,
                 prior_scale: np.ndarray, reference: DistanceClass,
                 observed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1: the factor model and the distance scales by damped Gauss-Newton.

    β_j = f_c · (μ + I_class(u) + S_class(v) + I_u + S_v + P_u·Q_v) is bilinear
    (f with the rest, P with Q), so it is solved by Levenberg-Marquardt on the
    sufficient statistics: alternating one factor at a time crawls when
    scales and factors trade off, a joint step does not. Penalties pull every
    parameter toward its prior; the reference class, same-cpu and classes
    without data keep their prior scale.
    """
    n_theta = params.size
    n = n_theta + _N_CLASSES
    prior = np.concatenate([params.prior(), prior_scale])
    frozen = np.zeros(n, dtype=bool)
    frozen[n_theta:] = ~observed
    frozen[n_theta + _SAME_CPU] = True
    frozen[n_theta + reference.rank] = True
    free = ~frozen
    base_penalty = np.concatenate([params.penalty(cfg), np.zeros(_N_CLASSES)])

    def evaluate(x: np.ndarray, jacobian: bool):
        mu, ci, cs, inter, sens, press, susc = params.split(x[:n_theta])
        scale = x[n_theta:]
        objective = 0.0
        hessian = np.zeros((n, n)) if jacobian else None
        gradient = np.zeros(n) if jacobian else None
        weighted = weight = 0.0
        for v, u, c, gram, rhs in blocks:
            base = mu + ci[key_wclass[u]] + cs[key_wclass[v]] + inter[u] + sens[v] + press[u] * susc[v]
            beta = scale[c] * base
            g_beta = gram @ beta
            objective += float(beta @ g_beta - 2.0 * beta @ rhs)
            diag = np.diag(gram)
            weighted += float(diag @ base**2)
            weight += float(diag.sum())
            if not jacobian:
                continue
            rows = u.size
            cols = np.empty((rows, 8), dtype=np.int64)
            vals = np.empty((rows, 8))
            f = scale[c]
            cols[:, 0] = 0
            cols[:, 1] = params.class_interference + key_wclass[u]
            cols[:, 2] = params.class_sensitivity + key_wclass[v]
            cols[:, 3] = params.interference + u
            cols[:, 4] = params.sensitivity + v
            cols[:, 5] = params.pressure + u
            cols[:, 6] = params.susceptibility + v
            cols[:, 7] = n_theta + c
            vals[:, :5] = f[:, None]
            vals[:, 5] = f * susc[v]
            vals[:, 6] = f * press[u]
            vals[:, 7] = base
            local, inverse = np.unique(cols, return_inverse=True)
            jac = np.zeros((rows, local.size))
            np.add.at(jac, (np.repeat(np.arange(rows), 8), inverse.reshape(-1)), vals.reshape(-1))
            hessian[np.ix_(local, local)] += jac.T @ gram @ jac
            gradient[local] += jac.T @ (g_beta - rhs)
        unit = weighted / weight if weight > 0 else 1.0
        return objective, hessian, gradient, unit

    def penalties(x: np.ndarray, unit: float) -> np.ndarray:
        # Q multiplies P and f multiplies β: their priors weigh like observations
        # of a typical P resp. β, not of 1.0, so the units match the data's
        pen = base_penalty.copy()
        press = x[params.pressure_slice]
        pen[params.susceptibility_slice] *= max(float(np.mean(press**2)) if press.size else 0.0, 1e-9)
        pen[n_theta:] = max(cfg.distance_shrinkage * unit, 1e-12)
        return pen

    x = prior.copy()
    objective, hessian, gradient, unit = evaluate(x, True)
    pen = penalties(x, unit)
    total = objective + float(pen @ (x - prior) ** 2)
    damping = 1e-3
    for _ in range(cfg.iterations):
        h = hessian[np.ix_(free, free)] + np.diag(pen[free])
        g = gradient[free] + pen[free] * (x[free] - prior[free])
        improved = False
        while damping < 1e10:
            system = h + damping * np.diag(np.maximum(np.diag(h), 1e-12))
            try:
                step = np.linalg.solve(system, -g)
            except np.linalg.LinAlgError:
                damping *= 10.0
                continue
            candidate = x.copy()
            candidate[free] += step
            cand_objective, _, _, _ = evaluate(candidate, False)
            cand_total = cand_objective + float(pen @ (candidate - prior) ** 2)
            if cand_total <= total:
                improved = True
                break
            damping *= 4.0
        if not improved:
            break
        gain = total - cand_total
        x = candidate
        damping = max(damping / 3.0, 1e-9)
        objective, hessian, gradient, unit = evaluate(x, True)
        pen = penalties(x, unit)
        total = objective + float(pen @ (x - prior) ** 2)
        if gain <= 1e-14 * max(1.0, abs(total)):
            break
    return x[:n_theta], x[n_theta:]


# --------------------------------------------------------------------------- layout
@dataclass
class _Layout:
    """A placement flattened into (tenant, pCPU, demand) pieces with their time shares: one
    piece per tenant and pCPU it may run on (its vCPUs that may run there, together)."""

    tenants: list[Tenant]
    owner: np.ndarray  # piece -> tenant index
    demand: np.ndarray
    granted: np.ndarray  # time share the piece gets with everybody running
    alone: np.ndarray  # per tenant: total time it would get alone
    cpu: np.ndarray  # piece -> pCPU
    cpu_slot: np.ndarray  # piece -> index of its pCPU among `cpu_ids`
    cpu_ids: np.ndarray  # the pCPUs pieces are on, sorted
    topology: HostTopology
    _distance: np.ndarray | None = None
    _cpu_distance: np.ndarray | None = None
    _groups: np.ndarray | None = None
    _nested: bool | None = None

    @property
    def distance(self) -> np.ndarray:
        """[piece, piece] distance-class index (made on first use: P × P entries)."""
        if self._distance is None:
            self._distance = self.cpu_distance()[self.cpu_slot[:, None], self.cpu_slot[None, :]]
        return self._distance

    @property
    def neighbour(self) -> np.ndarray:
        """[piece, piece] True when y can interfere with x (another tenant, another pCPU)."""
        return (self.owner[:, None] != self.owner[None, :]) & (self.distance != _SAME_CPU)

    def cpu_distance(self) -> np.ndarray:
        """[pCPU, pCPU] distance-class index between the pCPUs pieces are on."""
        if self._cpu_distance is None:
            self._cpu_distance = distance_matrix(self.topology, self.cpu_ids)
        return self._cpu_distance

    def cpu_groups(self) -> np.ndarray | None:
        """[level, pCPU]: the group each pCPU pieces are on belongs to at each level (core, L2,
        LLC, node, host), when the levels nest so that two pCPUs' distance class is the first
        level they share — true of every usual topology. Then a sum over the pieces at one
        distance is a difference of two group sums, O(P) instead of a pCPU × pCPU array.
        None when they do not nest (e.g. nodes smaller than an LLC): the matrix form is used."""
        if self._nested is None:
            index = _host_index(self.topology)
            self._groups = None if index.groups is None else index.groups[:, index.column[self.cpu_ids]]
            self._nested = self._groups is not None
        return self._groups

    @classmethod
    def build(cls, topology: HostTopology, tenants: Iterable[Tenant],
              memo: dict[int, tuple[Tenant, np.ndarray, np.ndarray]] | None = None, keep: bool = True) -> _Layout:
        """`memo` (optional): each tenant's pieces (pCPUs, demands) kept by the caller between
        builds of layouts that share most tenants (admission scores hundreds of candidates
        over the same neighbours); the same pieces, in the same order, the same floats. With
        `keep` False the tenants not in it yet are flattened without being added (a candidate's
        own tenants: keeping them would grow the memo with every candidate)."""
        tenants = list(tenants)
        if memo is None and sum(len(pins) for t in tenants for pins in t.cpus.values()) > _LOOPED_PINS * len(tenants):
            memo = {}  # floating tenants: each one's pieces in a few array operations, not pin by pin
        if memo is not None:
            return cls._from_pieces(topology, tenants, [_tenant_pieces(topology, t, memo, keep) for t in tenants])
        names: set[str] = set()
        slot: dict[tuple[int, int], int] = {}  # (tenant, pCPU) -> piece
        owner: list[int] = []
        pcpus: list[int] = []
        demand: list[float] = []
        for index, tenant in enumerate(tenants):
            if tenant.name in names:
                raise ValueError(f"tenant {tenant.name!r}: field 'name' appears twice in the placement")
            names.add(tenant.name)
            for vcpu, allowed in sorted(tenant.cpus.items()):
                for pcpu in sorted(allowed):
                    if pcpu not in topology.cpus:
                        raise ValueError(f"tenant {tenant.name!r}: field 'cpus': vCPU {vcpu} pinned to pCPU "
                                         f"{pcpu}, which host {topology.name!r} does not have")
                    share = tenant.load / len(allowed)
                    piece = slot.setdefault((index, pcpu), len(owner))
                    if piece < len(owner):
                        demand[piece] += share
                        continue
                    owner.append(index)
                    pcpus.append(pcpu)
                    demand.append(share)
        return cls._shared(topology, tenants, np.asarray(owner, dtype=np.int64), np.asarray(pcpus, dtype=np.int64),
                           np.asarray(demand, dtype=float))

    @classmethod
    def _from_pieces(cls, topology: HostTopology, tenants: list[Tenant],
                     pieces: list[tuple[np.ndarray, np.ndarray]]) -> _Layout:
        if len({t.name for t in tenants}) != len(tenants):
            seen: set[str] = set()
            twice = next(t.name for t in tenants if t.name in seen or seen.add(t.name))  # type: ignore[func-returns-value]
            raise ValueError(f"tenant {twice!r}: field 'name' appears twice in the placement")
        if not pieces:
            empty = np.zeros(0, dtype=np.int64)
            return cls._shared(topology, tenants, empty, empty, np.zeros(0))
        owner = np.repeat(np.arange(len(pieces), dtype=np.int64), [len(c) for c, _ in pieces])
        return cls._shared(topology, tenants, owner, np.concatenate([c for c, _ in pieces]),
                           np.concatenate([d for _, d in pieces]))

    @classmethod
    def _shared(cls, topology: HostTopology, tenants: list[Tenant], own: np.ndarray, cpu: np.ndarray,
                dem: np.ndarray) -> _Layout:
        """The layout of pieces (owner, pCPU, demand): every pCPU's time split among them."""
        # time shares: a pCPU asked for more than 100 % splits its time in proportion to demand
        cpu_ids, cpu_slot = np.unique(cpu, return_inverse=True)
        load_on_cpu = np.bincount(cpu_slot, weights=dem, minlength=cpu_ids.size)
        granted = dem * np.minimum(1.0, 1.0 / np.maximum(load_on_cpu[cpu_slot], 1e-300))
        own_slot = own * cpu_ids.size + cpu_slot
        own_load = np.bincount(own_slot, weights=dem, minlength=len(tenants) * cpu_ids.size)
        granted_alone = dem * np.minimum(1.0, 1.0 / np.maximum(own_load[own_slot], 1e-300))
        alone = np.bincount(own, weights=granted_alone, minlength=len(tenants))
        return cls(tenants, own, dem, granted, alone, cpu, cpu_slot.reshape(-1), cpu_ids, topology)

    def neighbour_sum(self, table: np.ndarray, piece_key: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
        """[x]: Σ_y table[distance(x, y), key of y, key of x] · weight_y over the pieces y that can
        interfere with x (`weight`: the granted shares unless given). On layouts of more than
        `DENSE_PIECES` pieces it is summed per pCPU and key — pCPU × pCPU and per-tenant arrays,
        never piece × piece — the same sums in another order."""
        weight = self.granted if weight is None else weight
        size = len(self.owner)
        if size <= DENSE_PIECES:
            beta = table[self.distance, piece_key[None, :], piece_key[:, None]]
            return (beta * np.where(self.neighbour, weight[None, :], 0.0)).sum(axis=1)
        keys = table.shape[1]
        on_cpu = np.zeros((len(self.cpu_ids), keys))
        np.add.at(on_cpu, (self.cpu_slot, piece_key), weight)
        groups = self.cpu_groups()
        if groups is not None and bool((piece_key == piece_key[self._first_piece()][self.owner]).all()):
            return self._nested_sum(groups, table, piece_key, weight, on_cpu)
        distance = self.cpu_distance()
        by_cpu = np.zeros((len(self.cpu_ids), keys))  # [pCPU, key of x]
        for rank in np.unique(distance).tolist():
            if rank == _SAME_CPU:
                continue
            by_cpu += ((distance == rank).astype(float) @ on_cpu) @ table[rank]
        total = by_cpu[self.cpu_slot, piece_key]
        order = np.argsort(self.owner, kind="stable")
        bounds = np.flatnonzero(np.diff(self.owner[order])) + 1
        for mine in np.split(order, bounds):  # a tenant's own pieces do not interfere with it
            if len(mine) < 2:
                continue
            between = distance[self.cpu_slot[mine][:, None], self.cpu_slot[mine][None, :]]
            key = piece_key[mine]
            own = np.where(between != _SAME_CPU, table[between, key[None, :], key[:, None]], 0.0)
            total[mine] -= own @ weight[mine]
        return total

    def _first_piece(self) -> np.ndarray:
        """[tenant]: the index of its first piece (every tenant has one)."""
        first = np.full(len(self.tenants), len(self.owner), dtype=np.int64)
        np.minimum.at(first, self.owner, np.arange(len(self.owner)))
        return np.minimum(first, max(len(self.owner) - 1, 0))

    def _nested_sum(self, groups: np.ndarray, table: np.ndarray, piece_key: np.ndarray, weight: np.ndarray,
                    on_cpu: np.ndarray) -> np.ndarray:
        """`neighbour_sum` from group sums: what lies at distance class l + 1 from a pCPU is what
        shares its level-l group less what shares its level-(l − 1) group (level −1: the pCPU
        itself); a tenant's own pieces (one key each) come off the same way, per tenant."""
        count = len(self.cpu_ids)
        by_cpu = np.zeros((count, table.shape[1]))  # [pCPU, key of x]
        inner = on_cpu  # what shares the previous level's group with each pCPU, per key
        mine_inner = weight  # the same, of each piece's own tenant
        own = np.zeros(len(self.owner))
        same = table[np.arange(1, len(groups) + 1)[:, None], piece_key[None, :], piece_key[None, :]]  # [l, x]
        for level, group in enumerate(groups):
            size = int(group.max()) + 1 if count else 0
            summed = np.zeros((size, on_cpu.shape[1]))
            np.add.at(summed, group, on_cpu)
            around = summed[group]
            by_cpu += (around - inner) @ table[level + 1]
            inner = around
            slot = self.owner * size + group[self.cpu_slot]
            mine = np.bincount(slot, weights=weight, minlength=len(self.tenants) * size)[slot]
            own += (mine - mine_inner) * same[level]
            mine_inner = mine
        return by_cpu[self.cpu_slot, piece_key] - own


@dataclass(frozen=True)
class _HostIndex:
    """What layouts on one host look up per pCPU id, worked out once per topology object."""

    known: np.ndarray  # [pCPU id] the host has it
    column: np.ndarray  # [pCPU id] its column in `groups`
    groups: np.ndarray | None  # `nested_groups` of all the host's pCPUs (None: they do not nest)


_HOST_INDEX: dict[int, tuple[weakref.ref, _HostIndex]] = {}
_HOST_INDEX_KEPT = 64


def _host_index(topology: HostTopology) -> _HostIndex:
    """The topology's `_HostIndex` (a layout's pCPUs are some of the host's, and groups that nest
    keep nesting in any subset)."""
    kept = _HOST_INDEX.get(id(topology))
    if kept is not None and kept[0]() is topology:
        return kept[1]
    cpus = np.asarray(sorted(topology.cpus), dtype=np.int64)
    size = int(cpus.max()) + 1 if cpus.size and cpus.min() >= 0 else 0
    known = np.zeros(size, dtype=bool)
    column = np.zeros(size, dtype=np.int64)
    if size:
        known[cpus] = True
        column[cpus] = np.arange(cpus.size)
    found = _HostIndex(known, column, nested_groups(topology, cpus) if size else None)
    while len(_HOST_INDEX) >= _HOST_INDEX_KEPT:
        del _HOST_INDEX[next(iter(_HOST_INDEX))]
    _HOST_INDEX[id(topology)] = (weakref.ref(topology), found)
    return found


def nested_groups(topology: HostTopology, cpus: np.ndarray) -> np.ndarray | None:
    """[level, i]: group index of pCPU cpus[i] at each level — core, L2, LLC, node, host — each
    group inside one group of every coarser level, or None when `distance_matrix`'s classes
    (the first of core, L2, LLC, node two pCPUs share) are not the first level of these groups
    they share: a level's groups must not span two groups of a coarser one. An unknown L2 or LLC
    counts as the next finer level's group: shared by no two pCPUs that do not share that one,
    as `distance_matrix` reads it."""
    if cpus.size == 0:
        return None
    rows = []
    for p in cpus:
        c = topology.cpus[int(p)]
        l2 = ("l2", c.l2) if c.l2 is not None else ("core", c.core)
        llc = ("llc", c.llc) if c.llc is not None else l2
        rows.append((("core", c.core), l2, llc, c.node))
    levels = []
    for level in range(4):
        ids: dict[object, int] = {}
        levels.append([ids.setdefault(row[level], len(ids)) for row in rows])
        if level and len(set(levels[level - 1])) != len({(row[level - 1], row[level]) for row in rows}):
            return None  # a finer group spans two of this level's
    return np.asarray(levels + [[0] * len(rows)], dtype=np.int64)


TenantLayout = _Layout  # the flattening `predict` uses, shared so other predictors do the same arithmetic


def _tenant_pieces(topology: HostTopology, tenant: Tenant,
                   memo: dict[int, tuple[Tenant, np.ndarray, np.ndarray]], keep: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """One tenant's pieces as `_Layout.build` makes them (one per pCPU it may run on, in first-
    seen order, its vCPUs' shares added in vCPU order: the same floats), kept in `memo` by the
    tenant itself."""
    kept = memo.get(id(tenant))
    if kept is not None and kept[0] is tenant:
        return kept[1], kept[2]
    assert isinstance(tenant.cpus, Mapping)
    items = sorted(tenant.cpus.items())
    pins = [np.sort(np.fromiter(allowed, dtype=np.int64, count=len(allowed))) for _, allowed in items]
    known = _host_index(topology).known
    for (vcpu, _), cpus in zip(items, pins):
        outside = (cpus < 0) | (cpus >= known.size)
        outside[~outside] = ~known[cpus[~outside]]
        if outside.any():
            raise ValueError(f"tenant {tenant.name!r}: field 'cpus': vCPU {vcpu} pinned to pCPU "
                             f"{int(cpus[outside][0])}, which host {topology.name!r} does not have")
    if all(np.array_equal(pins[0], cpus) for cpus in pins[1:]):  # every vCPU over the same pCPUs
        share = tenant.load / len(pins[0])
        demand = np.full(len(pins[0]), share)
        for _ in pins[1:]:
            demand += share
        found = (tenant, pins[0], demand)
    else:
        cpu = np.concatenate(pins)
        shares = np.concatenate([np.full(len(cpus), tenant.load / len(cpus)) for cpus in pins])
        distinct, first, inverse = np.unique(cpu, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        demand = np.zeros(len(distinct))
        np.add.at(demand, rank[inverse.reshape(-1)], shares)  # unbuffered: in vCPU order, as added one by one
        found = (tenant, distinct[order], demand)
    if keep:
        memo[id(tenant)] = found
    return found[1], found[2]


tenant_pieces = _tenant_pieces  # one tenant's (pCPUs, demands), as every layout flattens it


def host_groups(topology: HostTopology) -> np.ndarray | None:
    """`nested_groups` of all the host's pCPUs (columns: pCPU ids sorted), kept per topology."""
    return _host_index(topology).groups


def distance_matrix(topology: HostTopology, cpus: np.ndarray) -> np.ndarray:
    """Distance-class index (DistanceClass.rank) between every two pCPUs listed."""
    attrs = np.array(
        [
            (
                c.core,
                c.l2 if c.l2 is not None else -1 - i,
                c.llc if c.llc is not None else -1 - i,
                c.node,
            )
            for i, c in enumerate(topology.cpus[int(p)] for p in cpus)
        ],
        dtype=np.int64,
    ).reshape(-1, 4)
    if attrs.shape[0] == 0:
        return np.zeros((0, 0), dtype=np.int64)
    # unknown cache groups get a unique negative id per entry: never "shared"
    same = [attrs[:, k][:, None] == attrs[:, k][None, :] for k in range(4)]
    result = np.full((cpus.size, cpus.size), DistanceClass.REMOTE_NODE.rank, dtype=np.int64)
    result[same[3]] = DistanceClass.SAME_NODE.rank
    result[same[2]] = DistanceClass.SAME_LLC.rank
    result[same[1]] = DistanceClass.SAME_L2.rank
    result[same[0]] = DistanceClass.SAME_CORE.rank
    result[cpus[:, None] == cpus[None, :]] = _SAME_CPU
    return result


def interference_terms(
    topology: HostTopology, tenants: Iterable[Tenant], names: Iterable[str] | None = None
) -> dict[str, tuple[float, tuple[Exposure, ...]]]:
    """What each VM is exposed to in a placement: its own time share and its neighbours.

    This is the right-hand side of one Freeze'nSense equation per VM; the
    profiler pairs it with the measured ζ/ζb to make an `Observation`.
    Neighbours with the same workload key at the same distance are summed.
    """
    layout = _Layout.build(topology, tenants)
    by_name = {t.name: i for i, t in enumerate(layout.tenants)}
    wanted = list(by_name) if names is None else list(names)
    local: dict[tuple[str, str], int] = {}
    piece_key = np.array(
        [local.setdefault((layout.tenants[o].key, layout.tenants[o].workload_class), len(local))
         for o in layout.owner],
        dtype=np.int64,
    )
    labels = list(local)
    result: dict[str, tuple[float, tuple[Exposure, ...]]] = {}
    for name in wanted:
        index = by_name.get(name)
        if index is None:
            raise ValueError(f"tenant {name!r} is not in the placement")
        mine = np.flatnonzero(layout.owner == index)
        alone = layout.alone[index]
        table = np.zeros((len(labels), _N_CLASSES))
        between = layout.cpu_distance()[layout.cpu_slot[mine][:, None], layout.cpu_slot[None, :]]  # its rows
        for row, x in enumerate(mine):
            others = np.flatnonzero((layout.owner != index) & (between[row] != _SAME_CPU))
            np.add.at(table, (piece_key[others], between[row, others]),
                      layout.granted[x] * layout.granted[others] / alone)
        exposures = tuple(
            Exposure(labels[k][0], _CLASSES[c], float(table[k, c]), labels[k][1])
            for k, c in zip(*np.nonzero(table))
        )
        own_share = float(layout.granted[mine].sum() / alone)
        result[name] = (min(own_share, 1.0), exposures)
    return result


# --------------------------------------------------------------------------- the model
class InterferenceModel:
    """Learns β's from observations; predicts every VM's performance in a placement."""

    def __init__(self, config: ModelConfig | None = None):
        self.config = config or ModelConfig()
        self._blocks: dict[str, _Block] = {}
        self._wclass: dict[str, str] = {}
        self._solution: _Solution | None = None

    # ----- learning ------------------------------------------------------------
    @property
    def observations(self) -> int:
        return sum(block.observations for block in self._blocks.values())

    def fit(self, observations: Iterable[Observation]) -> InterferenceModel:
        """Forget everything, learn from `observations` (batched: fast for many)."""
        self._blocks = {}
        self._wclass = {}
        self._add(list(observations))
        self._solve()
        return self

    def update(self, observation: Observation) -> None:
        """Add one observation; coefficients are re-solved at the next query."""
        self._add([observation])

    def _add(self, observations: list[Observation]) -> None:
        grouped: dict[str, list[Observation]] = {}
        for obs in observations:
            if not isinstance(obs, Observation):
                raise TypeError(f"expected Observation, got {type(obs).__name__}")
            grouped.setdefault(obs.key, []).append(obs)
        for key, group in grouped.items():
            block = self._blocks.setdefault(key, _Block())
            rows: list[int] = []
            cols: list[int] = []
            values: list[float] = []
            targets = np.empty(len(group))
            scale = np.empty(len(group))
            for row, obs in enumerate(group):
                self._note_class(key, obs.workload_class)
                targets[row] = observed_target(obs, self.config.form)
                scale[row] = observed_scale(obs, self.config.form)
                for exposure in obs.neighbours:
                    if exposure.load == 0:
                        continue
                    self._note_class(exposure.key, exposure.workload_class)
                    rows.append(row)
                    cols.append(block.index((exposure.key, exposure.distance.rank)))
                    values.append(observed_exposure(obs, exposure, self.config.form))
            block.add_rows(np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64),
                           np.asarray(values, dtype=float), targets,
                           None if self.config.form != MULTIPLICATIVE else scale)
        self._solution = None

    def _note_class(self, key: str, wclass: str) -> None:
        """Remember a workload's class; a known class is never overwritten by "unknown"."""
        if wclass != UNKNOWN_CLASS or key not in self._wclass:
            self._wclass[key] = wclass

    # ----- solving ---------------------------------------------------------------
    def _solve(self) -> _Solution:
        if self._solution is not None:
            return self._solution
        cfg = self.config
        key_names = sorted(set(self._wclass) | set(self._blocks))
        keys = {name: i for i, name in enumerate(key_names)}
        class_names = sorted({self._wclass.get(name, UNKNOWN_CLASS) for name in key_names})
        wclasses = {name: i for i, name in enumerate(class_names)}
        n_keys, n_wcls = len(keys), len(wclasses)
        key_wclass = np.array([wclasses[self._wclass.get(name, UNKNOWN_CLASS)] for name in key_names],
                              dtype=np.int64)
        params = _FactorLayout(n_wcls, n_keys)

        blocks = []  # (target index, interferer indices, distance indices, ZᵀZ, Zᵀy)
        sizes: list[tuple[int, float]] = []  # (observations, yᵀy) per block
        evidence_by_class = np.zeros(_N_CLASSES)
        for name, block in self._blocks.items():
            if block.size == 0:
                continue
            gram, rhs = block.views()
            feats = sorted(block.features.items(), key=lambda item: item[1])
            u = np.array([keys[f[0]] for f, _ in feats], dtype=np.int64)
            c = np.array([f[1] for f, _ in feats], dtype=np.int64)
            blocks.append((keys[name], u, c, gram, rhs))
            sizes.append((block.observations, block.yy))
            np.add.at(evidence_by_class, c, np.diag(gram))
        observed = np.flatnonzero(evidence_by_class > 0)
        reference = (_CLASSES[int(observed[np.argmax(evidence_by_class[observed])])]
                     if observed.size else _DEFAULT_REFERENCE)

        prior_scale = np.array([cfg.prior_scale(cls) for cls in _CLASSES])
        theta, scale = params.prior(), prior_scale.copy()
        if blocks:
            observed = evidence_by_class > 0
            theta, scale = _fit_factors(blocks, key_wclass, params, cfg, prior_scale, reference, observed)
            ordered = _nearer_never_less(scale, evidence_by_class, reference)
            if not np.allclose(ordered, scale):
                # The data alone put a farther class above a nearer one (few layouts, classes
                # always seen together): keep the topology's order and refit the rest.
                theta, scale = _fit_factors(blocks, key_wclass, params, cfg, ordered, reference,
                                            np.zeros_like(observed))

        mu, ci, cs, inter, sens, press, susc = params.split(theta)
        inter = np.append(inter, 0.0)  # padding slot: a workload never observed
        sens = np.append(sens, 0.0)
        press = np.append(press, 0.0)
        susc = np.append(susc, 1.0)

        # stage 2: each observed (u, v, c) from its own data, shrunk toward the factor model
        pad = n_keys + 1
        residual = np.zeros((_N_CLASSES, pad, pad))
        ev_triple = np.zeros((_N_CLASSES, pad, pad))
        squares, freedom = 0.0, 0
        for (v, u, c, gram, rhs), (count, yy) in zip(blocks, sizes):
            base = (mu + ci[key_wclass[u]] + inter[u] + cs[key_wclass[v]] + sens[v] + press[u] * susc[v])
            prior = scale[c] * base
            beta = ridge_toward(gram, rhs, prior, cfg.pair_shrinkage)
            residual[c, u, v] = beta - prior
            ev_triple[c, u, v] = np.diag(gram)
            squares += max(0.0, yy - 2.0 * float(beta @ rhs) + float(beta @ gram @ beta))
            freedom += count - len(beta)
        noise_sd = math.sqrt(squares / freedom) if freedom > 0 else 0.0

        confidence = self._confidence(ev_triple, cfg.confidence_evidence)
        self._solution = _Solution(keys, wclasses, key_wclass, mu, ci, cs, inter, sens, press, susc, scale,
                                   residual, confidence, reference, noise_sd)
        return self._solution

    @staticmethod
    def _confidence(ev_triple: np.ndarray, k: float) -> np.ndarray:
        """Evidence → confidence: exact coefficient > same pair at another distance
        > both VMs seen with others > only class/global averages. A coefficient not
        observed at its own distance is trusted only as far as that distance class was
        observed at all: its scale is otherwise the prior's guess."""
        k = max(k, 1e-9)
        ev_pair = ev_triple.sum(axis=0)
        ev_inter = ev_pair.sum(axis=1)  # as interferer
        ev_target = ev_pair.sum(axis=0)  # as target
        total = float(ev_pair.sum())
        both = np.minimum(ev_inter[:, None], ev_target[None, :])
        level_pair = 0.75 * ev_pair / (ev_pair + k)
        level_keys = 0.5 * both / (both + k)
        unknown = 0.25 * total / (total + k)
        fallback = np.where(ev_pair > 0, level_pair, np.where(both > 0, level_keys, unknown))
        ev_class = ev_triple.sum(axis=(1, 2))
        level_class = ev_class / (ev_class + k)
        return np.where(ev_triple > 0, ev_triple / (ev_triple + k),
                        fallback[None, :, :] * level_class[:, None, None])

    # ----- querying -------------------------------------------------------------
    @property
    def noise_sd(self) -> float:
        """How far one observation's loss lies from the fit (residual standard deviation): the
        scale of what a coefficient resting on few observations may be wrong by."""
        return 0.0 if not self._blocks else float(self._solve().noise_sd)

    @property
    def reference_distance(self) -> DistanceClass:
        """The distance class best observed (its scale is fixed at its prior)."""
        return self._solve().reference

    def distance_scale(self, distance: DistanceClass) -> float:
        return float(self._solve().scale[distance.rank])

    def known_keys(self) -> tuple[str, ...]:
        return tuple(self._solve().keys)

    def workload_class_of(self, key: str) -> str:
        """The workload class a known key was observed with (``unknown`` for others)."""
        return self._wclass.get(key, UNKNOWN_CLASS)

    def evidence(self) -> dict[str, float]:
        """Per known key: how much data rests on it, in unit-exposure observations — the
        observations of it as the measured VM plus its exposures as a neighbour (Σ w²), the
        unit the shrinkage strengths are given in."""
        result = {key: 0.0 for key in self._wclass}
        for key, block in self._blocks.items():
            result[key] = result.get(key, 0.0) + block.observations
            diagonal = np.diag(block.views()[0])
            for (neighbour, _), index in block.features.items():
                result[neighbour] = result.get(neighbour, 0.0) + float(diagonal[index])
        return result

    def pair_evidence(self) -> dict[tuple[DistanceClass, str, str], float]:
        """(distance, background, foreground) -> the data resting on that exact coefficient, in
        unit-exposure observations (Σ w² of the background's exposures in the foreground's
        observations at that distance; one observation next to a fully busy neighbour counts 1):
        what backs one cell of the coefficient tables, 0 where only the factor model speaks."""
        result: dict[tuple[DistanceClass, str, str], float] = {}
        for key, block in self._blocks.items():
            diagonal = np.diag(block.views()[0])
            for (neighbour, rank), index in block.features.items():
                result[(_CLASSES[rank], neighbour, key)] = float(diagonal[index])
        return result

    def beta_tensor(self, identities: list[tuple[str, str]]) -> np.ndarray:
        """[distance rank, background, foreground] β between (key, workload class) identities,
        the same values `beta` gives one by one (0 at ``same-cpu``: time sharing only)."""
        sol = self._solve()
        idx, inter, sens, press, susc = self._key_vectors(identities)
        base = inter[:, None] + sens[None, :] + press[:, None] * susc[None, :]
        table = sol.scale[:, None, None] * base[None, :, :] + sol.residual[:, idx[:, None], idx[None, :]]
        table[_SAME_CPU] = 0.0
        return table

    def _key_vectors(self, keys: list[tuple[str, str]]) -> tuple[np.ndarray, ...]:
        """Per (key, workload class): padded index and the factor terms
        (interference incl. μ, sensitivity, pressure, susceptibility)."""
        sol = self._solve()
        pad = len(sol.keys)
        n = len(keys)
        idx = np.empty(n, dtype=np.int64)
        inter, sens = np.empty(n), np.empty(n)
        for i, (key, wclass) in enumerate(keys):
            k = sol.keys.get(key)
            if k is not None:
                idx[i] = k
                w = sol.key_wclass[k]
                inter[i] = sol.mu + sol.class_interference[w] + sol.interference[k]
                sens[i] = sol.class_sensitivity[w] + sol.sensitivity[k]
            else:
                idx[i] = pad
                w = sol.wclasses.get(wclass)
                inter[i] = sol.mu + (sol.class_interference[w] if w is not None else 0.0)
                sens[i] = sol.class_sensitivity[w] if w is not None else 0.0
        return idx, inter, sens, sol.pressure[idx], sol.susceptibility[idx]

    def beta(
        self,
        background: str,
        foreground: str,
        distance: DistanceClass | None = None,
        *,
        background_class: str = UNKNOWN_CLASS,
        foreground_class: str = UNKNOWN_CLASS,
    ) -> float:
        """Loss `background` causes `foreground` at `distance` (default: the reference class)."""
        sol = self._solve()
        cls = (distance or sol.reference).rank
        idx, inter, sens, press, susc = self._key_vectors(
            [(background, background_class), (foreground, foreground_class)])
        base = inter[0] + sens[1] + press[0] * susc[1]
        return float(sol.scale[cls] * base + sol.residual[cls, idx[0], idx[1]])

    def beta_confidence(
        self,
        background: str,
        foreground: str,
        distance: DistanceClass | None = None,
        *,
        background_class: str = UNKNOWN_CLASS,
        foreground_class: str = UNKNOWN_CLASS,
    ) -> float:
        """0–1: how much of `beta(...)` rests on observed data (see `Prediction.confidence`)."""
        sol = self._solve()
        cls = (distance or sol.reference).rank
        idx = self._key_vectors([(background, background_class), (foreground, foreground_class)])[0]
        return float(sol.confidence[cls, idx[0], idx[1]])

    def sensitivity(self, key: str, distance: DistanceClass | None = None) -> float:
        """Mean loss `key` suffers from the known workloads (seed ch. 4: column mean)."""
        others = self.known_keys()
        if not others:
            return 0.0
        return sum(self.beta(u, key, distance) for u in others) / len(others)

    def interference(self, key: str, distance: DistanceClass | None = None) -> float:
        """Mean loss `key` causes the known workloads (seed ch. 4: row mean)."""
        others = self.known_keys()
        if not others:
            return 0.0
        return sum(self.beta(key, v, distance) for v in others) / len(others)

    def predict(self, topology: HostTopology, tenants: Iterable[Tenant]) -> dict[str, Prediction]:
        """Every tenant's performance (fraction of isolated) and confidence in this placement."""
        layout = _Layout.build(topology, tenants)
        if not layout.tenants:
            return {}
        sol = self._solve()
        local_keys: dict[tuple[str, str], int] = {}
        tenant_local = np.empty(len(layout.tenants), dtype=np.int64)
        for i, tenant in enumerate(layout.tenants):
            tenant_local[i] = local_keys.setdefault((tenant.key, tenant.workload_class), len(local_keys))
        idx, inter, sens, press, susc = self._key_vectors(list(local_keys))
        piece_key = tenant_local[layout.owner]
        if len(layout.owner) <= DENSE_PIECES:
            k_x = piece_key[:, None]  # target (row)
            k_y = piece_key[None, :]  # interferer (column)
            dist = layout.distance
            base = inter[k_y] + sens[k_x] + press[k_y] * susc[k_x]
            beta = sol.scale[dist] * base + sol.residual[dist, idx[k_y], idx[k_x]]
            weight = np.where(layout.neighbour, layout.granted[None, :], 0.0)
            loss = (beta * weight).sum(axis=1)
            conf_pairs = sol.confidence[dist, idx[k_y], idx[k_x]]
            exposure = weight.sum(axis=1) * layout.granted
            conf_mass = (conf_pairs * weight).sum(axis=1) * layout.granted
        else:  # the same sums per pCPU and key: [distance, key of y, key of x] tables
            base = inter[:, None] + sens[None, :] + press[:, None] * susc[None, :]
            beta_table = sol.scale[:, None, None] * base[None, :, :] + sol.residual[:, idx[:, None], idx[None, :]]
            loss = layout.neighbour_sum(beta_table, piece_key)
            exposure = layout.neighbour_sum(np.ones_like(beta_table), piece_key) * layout.granted
            conf_mass = layout.neighbour_sum(sol.confidence[:, idx[:, None], idx[None, :]], piece_key) * layout.granted

        n = len(layout.tenants)
        got = np.bincount(layout.owner, weights=layout.granted * remaining(loss, self.config.form), minlength=n)
        share = np.bincount(layout.owner, weights=layout.granted, minlength=n)
        exp_sum = np.bincount(layout.owner, weights=exposure, minlength=n)
        conf_sum = np.bincount(layout.owner, weights=conf_mass, minlength=n)
        result = {}
        for i, tenant in enumerate(layout.tenants):
            alone = layout.alone[i]
            perf = max(float(got[i] / alone), 0.0)
            confidence = float(conf_sum[i] / exp_sum[i]) if exp_sum[i] > 0 else 1.0
            result[tenant.name] = Prediction(
                perf=perf,
                confidence=min(max(confidence, 0.0), 1.0),
                share=min(float(share[i] / alone), 1.0),
                throughput=perf * float(alone),
            )
        return result

    # ----- persistence -----------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain, JSON-able state: config + sufficient statistics (refit on load)."""
        blocks = []
        for key in sorted(self._blocks):
            block = self._blocks[key]
            gram, rhs = block.views()
            feats = sorted(block.features.items(), key=lambda item: item[1])
            blocks.append({
                "key": key,
                "observations": block.observations,
                "yy": block.yy,
                "features": [[name, _CLASSES[cls].value] for (name, cls), _ in feats],
                "gram": gram.tolist(),
                "rhs": rhs.tolist(),
            })
        return {
            "format": MODEL_FORMAT,
            "version": MODEL_VERSION,
            "config": self.config.to_dict(),
            "workload_classes": dict(sorted(self._wclass.items())),
            "blocks": blocks,
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> InterferenceModel:
        if data.get("format") != MODEL_FORMAT:
            raise ValueError(f"interference model: field 'format' must be {MODEL_FORMAT!r}, "
                             f"got {data.get('format')!r}")
        if data.get("version") != MODEL_VERSION:
            raise ValueError(f"interference model: field 'version' {data.get('version')!r} is not "
                             f"supported (expected {MODEL_VERSION})")
        config = dict(data.get("config", {}))
        config.setdefault("form", ADDITIVE)  # statistics stored before the form was named are additive
        model = cls(ModelConfig.from_dict(config))
        model._wclass = {str(k): str(v) for k, v in dict(data.get("workload_classes", {})).items()}
        for number, entry in enumerate(data.get("blocks", [])):
            where = f"interference model: blocks[{number}]"
            try:
                key = str(entry["key"])
                features = [(str(name), DistanceClass(dist).rank) for name, dist in entry["features"]]
                gram = np.asarray(entry["gram"], dtype=float).reshape(len(features), len(features))
                rhs = np.asarray(entry["rhs"], dtype=float).reshape(len(features))
                observations = int(entry["observations"])
                yy = float(entry["yy"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{where}: malformed ({exc})") from None
            block = _Block()
            for feature in features:
                block.index(feature)
            block.gram[: block.size, : block.size] = gram
            block.rhs[: block.size] = rhs
            block.observations = observations
            block.yy = yy
            model._blocks[key] = block
            model._wclass.setdefault(key, UNKNOWN_CLASS)
            for name, _ in features:
                model._wclass.setdefault(name, UNKNOWN_CLASS)
        return model
