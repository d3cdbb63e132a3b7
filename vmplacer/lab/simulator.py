"""Simulated hosts: libvirt-like domains on a virtual clock with a hidden ground truth.

Implements the `Hypervisor`, `FreezableHost`, `Sampler` and `Clock` ports, so the profiler,
the executor and the evaluation run unchanged against hundreds of simulated
hosts in seconds. Time only moves when someone sleeps on the `VirtualClock`
(or an operation is given a latency), and each domain's progress is
integrated exactly between state changes.

The ground truth is deliberately *not* the interference model's form, so that
evaluating the model here tests it instead of echoing it:

* losses from several neighbours combine multiplicatively,
  perf = s · Π_j (1 − d_j), not additively;
* d_j = factor[distance class] · loss(background → foreground) · g_j, where
  the loss comes from a measured pair file and the factors are configurable;
* vCPUs sharing a pCPU split its time (throughput divided, no extra loss);
* every sample carries multiplicative noise (σ = 3 % by default);
* paused domains make no progress and disturb nobody.

A domain defined with `exclusive_cpus` carries them as vmplacer's metadata would (a dedicated
guest: the executor's `set_exclusive_cpus` moves them with it); big hosts of floating guests stay
cheap to simulate because identical vCPU pieces are grouped (`GROUP_PIECES_ABOVE`).

Seeded: the same seed and the same sequence of calls give the same samples.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from vmplacer.core.placement.bandwidth import CpuBandwidth
from vmplacer.core.model.interference import distance_matrix
from vmplacer.core.model.pairs import PairTable
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import NEIGHBOUR_CLASSES, DistanceClass, HostTopology
from vmplacer.ports import (
    DomainFacts,
    DomainGone,
    DomainInfo,
    DomainStatus,
    Hypervisor,
    HypervisorError,
    Sample,
)

# Default scale of a measured pair loss at each distance class, relative to the
# class the pair file was measured at (see docs/model.md for why these values).
DEFAULT_DISTANCE_FACTORS: dict[DistanceClass, float] = {
    DistanceClass.SAME_CORE: 2.0,
    DistanceClass.SAME_L2: 1.0,
    DistanceClass.SAME_LLC: 1.0,
    DistanceClass.SAME_NODE: 0.6,
    DistanceClass.REMOTE_NODE: 0.3,
}
DEFAULT_REFERENCE = DistanceClass.SAME_LLC
DEFAULT_NOISE = 0.03
INSTRUCTIONS_PER_CPU_SECOND = 1e9  # a vCPU running alone at full load
METRIC = "ips"

_N_CLASSES = len(DistanceClass)
# Above this many vCPU pieces (vCPU × allowed pCPU) a layout's truth is computed with identical
# pieces (same domain, pCPU and demand) grouped: a vCPU floating over a 32-pCPU node is 32
# pieces, 8 such vCPUs 256, and the pair arrays grow with the square. Grouping gives the same
# products ((1 − l·g)^k for k identical neighbours) to rounding; small layouts keep the plain sum.
GROUP_PIECES_ABOVE = 1024


class VirtualClock:
    """A clock that only moves when slept on: simulated minutes cost microseconds."""

    def __init__(self, start: float = 0.0):
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot sleep a negative time ({seconds} s)")
        self._now += seconds


class GroundTruth:
    """The simulator's hidden loss of a foreground caused by a background, per distance.

    A pair file measured at one distance (a matrix: `reference`) is scaled to
    the other classes by `factors`. A long file with per-distance rows is used
    as measured; distances it lacks are scaled from the nearest measured one.
    Workloads the file does not name neither suffer nor cause loss.
    """

    def __init__(
        self,
        table: PairTable,
        factors: Mapping[DistanceClass, float] | None = None,
        reference: DistanceClass = DEFAULT_REFERENCE,
    ):
        merged = dict(DEFAULT_DISTANCE_FACTORS)
        for cls, value in (factors or {}).items():
            cls = DistanceClass(cls)
            if cls not in NEIGHBOUR_CLASSES:
                raise ValueError(f"distance factor for {cls.value!r}: not a neighbour class")
            if not value >= 0:
                raise ValueError(f"distance factor for {cls.value!r} must be >= 0, got {value!r}")
            merged[cls] = float(value)
        if reference not in NEIGHBOUR_CLASSES:
            raise ValueError(f"reference distance {reference!r} is not a neighbour class")
        if merged[reference] <= 0:
            raise ValueError(f"the reference distance {reference.value!r} needs a factor > 0")
        self.table = table
        self.factors = merged
        self.reference = reference
        self.workloads = tuple(table.workloads)
        self._index = {name: i for i, name in enumerate(self.workloads)}
        n = len(self.workloads) + 1  # last slot: a workload the file does not name
        self._tensor = np.zeros((_N_CLASSES, n, n))
        measured: dict[DistanceClass, dict[tuple[str, str], float]] = {}
        for (distance, background, foreground), value in table.losses.items():
            measured.setdefault(distance or reference, {})[(background, foreground)] = value
        pairs = {pair for values in measured.values() for pair in values}
        for cls in NEIGHBOUR_CLASSES:
            for background, foreground in pairs:
                self._tensor[cls.rank, self._index[background], self._index[foreground]] = (
                    self._scaled(measured, cls, background, foreground)
                )

    def _scaled(self, measured, cls: DistanceClass, background: str, foreground: str) -> float:
        at = [d for d in measured if (background, foreground) in measured[d]]
        source = min(at, key=lambda d: (abs(d.rank - cls.rank), d.rank))
        value = measured[source][(background, foreground)]
        if source is cls:
            return value
        base = self.factors[source]
        return value * self.factors[cls] / base if base > 0 else 0.0

    def loss(self, background: str, foreground: str, distance: DistanceClass) -> float:
        if distance is DistanceClass.SAME_CPU:
            return 0.0
        n = len(self.workloads)
        return float(self._tensor[distance.rank, self._index.get(background, n), self._index.get(foreground, n)])

    def indices(self, workloads: Iterable[str]) -> np.ndarray:
        n = len(self.workloads)
        return np.array([self._index.get(w, n) for w in workloads], dtype=np.int64)

    @property
    def tensor(self) -> np.ndarray:
        """[distance rank, background, foreground] losses; read-only view."""
        view = self._tensor.view()
        view.flags.writeable = False
        return view


@dataclass
class _Domain:
    name: str
    workload: str
    workload_class: str
    load: float
    vcpupin: dict[int, frozenset[int]]
    memory_kib: int
    emulatorpin: frozenset[int] = frozenset()
    state: str = "running"
    pause_reason: str | None = None
    instructions: float = 0.0
    cpu_s: float = 0.0  # CPU time granted so far (what virDomainGetInfo's cpuTime reads)
    uuid: str = field(default="")
    bandwidth: CpuBandwidth = field(default_factory=CpuBandwidth)
    labels: dict[str, str] = field(default_factory=dict)
    # pCPUs the guest owns, as vmplacer's domain metadata records them; None: no such metadata
    exclusive_cpus: frozenset[int] | None = None

    def info(self, host: str) -> DomainInfo:
        placement = Placement(
            guest=self.name,
            host=host,
            vcpupin=dict(self.vcpupin),
            emulatorpin=self.emulatorpin,
            memory_kib=self.memory_kib,
            dedicated=bool(self.exclusive_cpus),
            exclusive_cpus=self.exclusive_cpus or frozenset(),
        )
        return DomainInfo(
            name=self.name,
            uuid=self.uuid,
            state=self.state,
            pause_reason=self.pause_reason,
            vcpus=len(self.vcpupin),
            memory_kib=self.memory_kib,
            placement=placement,
            labels={**self.labels, "workload": self.workload, "workload_class": self.workload_class,
                    "load": repr(self.load)},
        )


@dataclass
class _Failure:
    operation: str
    domain: str | None
    retriable: bool
    remaining: int


class SimCluster:
    """Simulated hosts sharing one virtual clock, one ground truth and one random stream."""

    def __init__(
        self,
        truth: GroundTruth | PairTable | None = None,
        *,
        seed: int = 0,
        noise: float = DEFAULT_NOISE,
        clock: VirtualClock | None = None,
        op_latency_s: float = 0.0,
        migration_mib_s: float = 1000.0,
    ):
        if isinstance(truth, PairTable):
            truth = GroundTruth(truth)
        if not noise >= 0:
            raise ValueError(f"noise must be >= 0, got {noise!r}")
        if not op_latency_s >= 0:
            raise ValueError(f"op_latency_s must be >= 0, got {op_latency_s!r}")
        if not migration_mib_s > 0:
            raise ValueError(f"migration_mib_s must be > 0, got {migration_mib_s!r}")
        self.truth = truth or GroundTruth(PairTable("<empty>", (), {}))
        self.noise = float(noise)
        self.clock = clock or VirtualClock()
        self.op_latency_s = float(op_latency_s)
        self.migration_mib_s = float(migration_mib_s)
        self.hosts: dict[str, SimHost] = {}
        self._rng = np.random.default_rng(seed)
        self._failures: list[_Failure] = []

    def add_host(self, name: str, topology: HostTopology) -> SimHost:
        if name in self.hosts:
            raise ValueError(f"simulated host {name!r} already exists")
        host = SimHost(name, topology, self)
        self.hosts[name] = host
        return host

    def sampler(self, host: SimHost) -> SimSampler:
        return SimSampler(host)

    def inject_failure(
        self, operation: str, domain: str | None = None, *, retriable: bool = False, times: int = 1
    ) -> None:
        """Make the next `times` calls of `operation` (e.g. "resume") fail, for one domain or any."""
        self._failures.append(_Failure(operation, domain, retriable, times))

    def _maybe_fail(self, operation: str, host: str, domain: str) -> None:
        for failure in self._failures:
            if failure.operation == operation and failure.domain in (None, domain) and failure.remaining > 0:
                failure.remaining -= 1
                raise HypervisorError(f"injected failure: {operation} of {domain!r} on {host!r}",
                                      host=host, domain=domain, retriable=failure.retriable)

    def _noise(self) -> float:
        if self.noise == 0:
            return 1.0
        return max(0.0, 1.0 + self.noise * float(self._rng.standard_normal()))


class SimHost:
    """One simulated host; implements the `Hypervisor` port."""

    def __init__(self, name: str, topology: HostTopology, cluster: SimCluster):
        self.name = name
        self._topology = topology
        self._cluster = cluster
        self._domains: dict[str, _Domain] = {}
        self._synced_at = cluster.clock.now()
        self._layout_version = 0
        self._rate_cache: dict[tuple, dict[str, tuple[float, float]]] = {}

    # ----- Hypervisor port ------------------------------------------------------
    def topology(self) -> HostTopology:
        return self._topology

    def domains(self) -> list[DomainInfo]:
        return [d.info(self.name) for d in self._domains.values()]

    def domain(self, name: str) -> DomainInfo:
        return self._get(name).info(self.name)

    def suspend(self, name: str) -> None:
        self._operation("suspend", name)
        domain = self._get(name)
        if domain.state != "paused":
            self._sync()
            domain.state, domain.pause_reason = "paused", "user"

    def resume(self, name: str) -> None:
        self._operation("resume", name)
        domain = self._get(name)
        if domain.state == "paused":
            self._sync()
            domain.state, domain.pause_reason = "running", None

    def pin_vcpu(self, name: str, vcpu: int, cpus: frozenset[int]) -> None:
        self._operation("pin_vcpu", name)
        domain = self._get(name)
        if vcpu not in domain.vcpupin:
            raise HypervisorError(f"domain {name!r} on {self.name!r}: vCPU {vcpu} does not exist "
                                  f"(it has {len(domain.vcpupin)})", host=self.name, domain=name)
        self._check_cpus(name, "vcpupin", cpus)
        self._sync()
        domain.vcpupin[vcpu] = frozenset(cpus)
        self._layout_changed()

    def pin_emulator(self, name: str, cpus: frozenset[int]) -> None:
        self._operation("pin_emulator", name)
        domain = self._get(name)
        self._check_cpus(name, "emulatorpin", cpus)
        domain.emulatorpin = frozenset(cpus)

    def migrate(
        self,
        name: str,
        destination: Hypervisor,
        *,
        bandwidth_mib_s: int | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self._operation("migrate", name)
        domain = self._get(name)
        if not isinstance(destination, SimHost) or destination._cluster is not self._cluster:
            raise HypervisorError(f"cannot migrate {name!r}: destination is not a simulated host of this "
                                  "cluster", host=self.name, domain=name)
        if destination is self:
            raise HypervisorError(f"cannot migrate {name!r} to the host it runs on ({self.name!r})",
                                  host=self.name, domain=name)
        if name in destination._domains:
            raise HypervisorError(f"cannot migrate {name!r}: a domain of that name exists on "
                                  f"{destination.name!r}", host=self.name, domain=name)
        missing = sorted({c for cpus in domain.vcpupin.values() for c in cpus} - destination._topology.online_cpus)
        if missing:
            raise HypervisorError(f"cannot migrate {name!r}: its vcpupin uses pCPUs {missing} that "
                                  f"{destination.name!r} does not have", host=self.name, domain=name)
        bandwidth = float(bandwidth_mib_s or self._cluster.migration_mib_s)
        duration = domain.memory_kib / 1024.0 / bandwidth
        clock = self._cluster.clock
        if timeout_s is not None and duration > timeout_s:
            clock.sleep(timeout_s)
            raise HypervisorError(f"migration of {name!r} to {destination.name!r} timed out after "
                                  f"{timeout_s} s (needs {duration:.1f} s)", host=self.name, domain=name,
                                  retriable=True)
        clock.sleep(duration)  # live: keeps running here while memory is copied
        self._sync()
        destination._sync()
        del self._domains[name]
        destination._domains[name] = domain
        self._layout_changed()
        destination._layout_changed()

    def set_exclusive_cpus(self, name: str, cpus: frozenset[int]) -> None:
        """Record the pCPUs a dedicated guest owns, as the libvirt host writes its metadata; a
        domain defined without that record (not placed as dedicated) is left as it is."""
        self._operation("set_exclusive_cpus", name)
        domain = self._get(name)
        if domain.exclusive_cpus is None:
            return
        if cpus:
            self._check_cpus(name, "exclusive_cpus", cpus)
        domain.exclusive_cpus = frozenset(cpus)

    # ----- BandwidthControl port (throttles) ---------------------------------------------
    def cpu_bandwidth(self, name: str) -> CpuBandwidth:
        return self._get(name).bandwidth

    def set_cpu_bandwidth(self, name: str, bandwidth: CpuBandwidth) -> None:
        """Cap each vCPU at `bandwidth.share` of a pCPU (the guest's demand is cut to it)."""
        self._operation("set_cpu_bandwidth", name)
        domain = self._get(name)
        self._sync()
        domain.bandwidth = bandwidth
        self._layout_changed()

    # ----- FreezableHost port (what the production profiler uses) ------------------------
    def domain_states(self) -> dict[str, DomainStatus]:
        return {
            d.name: DomainStatus(d.name, d.uuid, d.state, d.pause_reason) for d in self._domains.values()
        }

    def domain_facts(self, names: list[str]) -> dict[str, DomainFacts]:
        """Pinned pCPUs (None when a vCPU may run on every online pCPU) and labels; unknown names skipped."""
        facts = {}
        online = self._topology.online_cpus
        for name in names:
            domain = self._domains.get(name)
            if domain is None:
                continue
            pinned = all(cpus != online for cpus in domain.vcpupin.values())
            pcpus = frozenset().union(*domain.vcpupin.values())
            facts[name] = DomainFacts(pcpus if pinned else None, domain.info(self.name).labels)
        return facts

    # ----- simulator-only ---------------------------------------------------------
    def define_domain(
        self,
        name: str,
        *,
        workload: str,
        vcpupin: Mapping[int, Iterable[int]] | Iterable[int],
        load: float = 1.0,
        workload_class: str = "unknown",
        memory_kib: int = 1024 * 1024,
        running: bool = True,
        labels: Mapping[str, str] | None = None,
        exclusive_cpus: Iterable[int] | None = None,
    ) -> DomainInfo:
        """Create (and by default start) a domain running `workload` with this pinning.

        `exclusive_cpus`: the pCPUs it owns, recorded as vmplacer's metadata of a dedicated guest
        (then `set_exclusive_cpus` keeps them current; without it the domain has no such record)."""
        if not name:
            raise ValueError("domain: field 'name' must not be empty")
        if name in self._domains:
            raise ValueError(f"domain {name!r}: already defined on {self.name!r}")
        if not 0.0 < load <= 1.0:
            raise ValueError(f"domain {name!r}: field 'load' must be in (0, 1], got {load!r}")
        if isinstance(vcpupin, Mapping):
            pins = {int(v): frozenset(int(c) for c in cpus) for v, cpus in vcpupin.items()}
        else:
            pins = {i: frozenset({int(c)}) for i, c in enumerate(sorted(set(vcpupin)))}
        if not pins:
            raise ValueError(f"domain {name!r}: field 'vcpupin' is empty")
        owned = None if exclusive_cpus is None else frozenset(int(c) for c in exclusive_cpus)
        checked = [("vcpupin", cpus) for cpus in pins.values()] + ([("exclusive_cpus", owned)] if owned else [])
        for field_name, cpus in checked:
            try:
                self._check_cpus(name, field_name, cpus)
            except HypervisorError as exc:
                raise ValueError(str(exc)) from None
        self._sync()
        self._domains[name] = _Domain(
            name=name,
            workload=workload,
            workload_class=workload_class,
            load=float(load),
            vcpupin=pins,
            memory_kib=int(memory_kib),
            state="running" if running else "paused",
            pause_reason=None if running else "user",
            uuid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"vmplacer-sim:{self.name}:{name}")),
            labels=dict(labels or {}),
            exclusive_cpus=owned,
        )
        self._layout_changed()
        return self.domain(name)

    def undefine(self, name: str) -> None:
        self._get(name)
        self._sync()
        del self._domains[name]
        self._layout_changed()

    def instructions(self, name: str) -> float:
        """Instructions retired so far (noise-free): what a counter would read."""
        self._sync()
        return self._get(name).instructions

    def cpu_time_s(self, name: str) -> float:
        """CPU time the domain was granted so far, in seconds (noise-free)."""
        self._sync()
        return self._get(name).cpu_s

    def set_load(self, name: str, load: float) -> None:
        """Change what the guest's workload asks for (0 < load ≤ 1 of a pCPU per vCPU): idle ↔ busy."""
        if not 0.0 < load <= 1.0:
            raise ValueError(f"domain {name!r}: field 'load' must be in (0, 1], got {load!r}")
        domain = self._get(name)
        self._sync()
        domain.load = float(load)
        self._layout_changed()

    def true_performance(self, name: str) -> float:
        """Noise-free performance now, as a fraction of running alone (0 when paused)."""
        domain = self._get(name)
        if domain.state != "running":
            return 0.0
        rate, alone = self._rates()[name]
        return rate / alone

    # ----- internals ----------------------------------------------------------------
    def _operation(self, operation: str, name: str) -> None:
        if self._cluster.op_latency_s:
            self._cluster.clock.sleep(self._cluster.op_latency_s)
        self._cluster._maybe_fail(operation, self.name, name)

    def _get(self, name: str) -> _Domain:
        try:
            return self._domains[name]
        except KeyError:
            raise DomainGone(f"domain {name!r} is not on host {self.name!r}", host=self.name,
                             domain=name) from None

    def _check_cpus(self, name: str, field_name: str, cpus: Iterable[int]) -> None:
        cpus = frozenset(cpus)
        if not cpus:
            raise HypervisorError(f"domain {name!r} on {self.name!r}: field {field_name!r} is empty",
                                  host=self.name, domain=name)
        unknown = sorted(cpus - self._topology.online_cpus)
        if unknown:
            raise HypervisorError(f"domain {name!r} on {self.name!r}: field {field_name!r} names pCPUs "
                                  f"{unknown} that are not online on this host", host=self.name, domain=name)

    def _layout_changed(self) -> None:
        self._layout_version += 1
        self._rate_cache.clear()

    def _sync(self) -> None:
        """Credit every running domain with the progress made since the last change."""
        now = self._cluster.clock.now()
        elapsed = now - self._synced_at
        if elapsed > 0:
            for name, (rate, _) in self._rates().items():
                self._domains[name].instructions += rate * elapsed
            for name, cpu in self._cpu_rates().items():
                self._domains[name].cpu_s += cpu * elapsed
        self._synced_at = now

    def _rates(self) -> dict[str, tuple[float, float]]:
        """Per running domain: (instructions/s now, instructions/s if it ran alone)."""
        running = tuple(sorted(n for n, d in self._domains.items() if d.state == "running"))
        cached = self._rate_cache.get(running)
        if cached is not None:
            return cached
        if len(self._rate_cache) > 64:
            self._rate_cache.clear()
        result = self._compute_rates([self._domains[n] for n in running])
        self._rate_cache[running] = result
        return result

    def _cpu_rates(self) -> dict[str, float]:
        """Per running domain: pCPU time granted per second (all vCPUs), by the same fair split."""
        running = [d for d in self._domains.values() if d.state == "running"]
        asked: dict[int, float] = {}
        for domain in running:
            for allowed in domain.vcpupin.values():
                for cpu in allowed:
                    asked[cpu] = asked.get(cpu, 0.0) + min(domain.load, domain.bandwidth.share) / len(allowed)
        return {d.name: sum(min(d.load, d.bandwidth.share) / len(allowed) * min(1.0, 1.0 / asked[cpu])
                            for allowed in d.vcpupin.values() for cpu in allowed) for d in running}

    def _compute_rates(self, domains: list[_Domain]) -> dict[str, tuple[float, float]]:
        if not domains:
            return {}
        owner, cpus, demand = [], [], []
        for index, domain in enumerate(domains):
            for _, allowed in sorted(domain.vcpupin.items()):
                for pcpu in sorted(allowed):
                    owner.append(index)
                    cpus.append(pcpu)
                    demand.append(min(domain.load, domain.bandwidth.share) / len(allowed))
        own = np.asarray(owner, dtype=np.int64)
        cpu = np.asarray(cpus, dtype=np.int64)
        dem = np.asarray(demand)
        count = np.ones(own.size)  # identical pieces each row stands for (1: not grouped)
        grouped = own.size > GROUP_PIECES_ABOVE
        if grouped:
            own, cpu, dem, count = _grouped(own, cpu, dem)
        slots, cpu_slot = np.unique(cpu, return_inverse=True)
        asked = np.bincount(cpu_slot, weights=dem * count, minlength=slots.size)
        granted = dem * np.minimum(1.0, 1.0 / asked[cpu_slot])
        own_slot = own * slots.size + cpu_slot
        asked_alone = np.bincount(own_slot, weights=dem * count, minlength=len(domains) * slots.size)
        granted_alone = dem * np.minimum(1.0, 1.0 / asked_alone[own_slot])

        workload = self._cluster.truth.indices(d.workload for d in domains)[own]
        distance = distance_matrix(self._topology, cpu)
        loss = self._cluster.truth.tensor[distance, workload[None, :], workload[:, None]]  # [x, y]: y hurts x
        active = (own[:, None] != own[None, :]) & (cpu[:, None] != cpu[None, :])
        factor = np.where(active, np.clip(1.0 - loss * granted[None, :], 0.0, None), 1.0)
        # k identical neighbours hurt as k pieces do: (1 − l·g)^k
        speed = np.prod(factor ** count[None, :] if grouped else factor, axis=1)
        rate = np.bincount(own, weights=count * granted * speed, minlength=len(domains)) * INSTRUCTIONS_PER_CPU_SECOND
        alone = np.bincount(own, weights=count * granted_alone, minlength=len(domains)) * INSTRUCTIONS_PER_CPU_SECOND
        return {d.name: (float(rate[i]), float(alone[i])) for i, d in enumerate(domains)}


def _grouped(own: np.ndarray, cpu: np.ndarray, dem: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Identical pieces (domain, pCPU, demand) as one row each, with how many they are."""
    keys = np.stack([own.astype(np.float64), cpu.astype(np.float64), dem])
    unique, count = np.unique(keys, axis=1, return_counts=True)
    return unique[0].astype(np.int64), unique[1].astype(np.int64), unique[2], count.astype(np.float64)


@dataclass(frozen=True)
class _Window:
    started: float
    counters: dict[str, float]


class SimSampler:
    """Throughput of domains over a window (instructions/s), with the cluster's noise.

    Implements the `Sampler` port. A domain that left the host, was created
    during the window or made no progress at all gives an invalid sample with
    the reason, never an exception.
    """

    metric = METRIC

    def __init__(self, host: SimHost):
        self.host = host

    def begin(self, domains: list[str]) -> object:
        self.host._sync()
        counters = {}
        for name in domains:
            if name in self.host._domains:
                counters[name] = self.host._domains[name].instructions
        return (_Window(self.host._cluster.clock.now(), counters), list(domains))

    def end(self, token: object) -> dict[str, Sample]:
        window, names = cast(tuple[_Window, list[str]], token)
        self.host._sync()
        elapsed = self.host._cluster.clock.now() - window.started
        result = {}
        for name in names:
            domain = self.host._domains.get(name)
            if name not in window.counters or domain is None:
                result[name] = Sample(name, METRIC, 0.0, elapsed, valid=False,
                                      reason=f"domain was not on host {self.host.name!r} for the whole window")
                continue
            if elapsed <= 0:
                result[name] = Sample(name, METRIC, 0.0, 0.0, valid=False, reason="empty window")
                continue
            progress = domain.instructions - window.counters[name]
            if progress <= 0:
                result[name] = Sample(name, METRIC, 0.0, elapsed, valid=False,
                                      reason="no progress in the window (paused)")
                continue
            value = progress / elapsed * self.host._cluster._noise()
            result[name] = Sample(name, METRIC, value, elapsed)
        return result
