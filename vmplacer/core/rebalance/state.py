"""What the rebalancer knows about a cluster: hosts, guests, and how each guest may move.

Built by the application from live domains, recorded placements and
profiles; consumed by the rebalance policy as plain values (the policy never
asks a host or a database anything). `describe_guest` turns a placement, its
labels and (for guests vmplacer placed) their spec into the rules the search
obeys: which vCPUs may move, whether the guest owns its pCPUs, whether it
may leave its host.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.model.identity import (  # noqa: F401
    LABEL_CLASS,
    LABEL_WORKLOAD,
    ModelIdentity,
    ModelIdentityError,
    model_identity,
)
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.admit import AllocationOptions
from vmplacer.core.topology.host import HostTopology

# Guest modes: how the search may treat a guest.
EXCLUSIVE = "exclusive"  # dedicated vCPUs, each owning its pCPU (isolate: its whole core)
PINNED = "pinned"  # every vCPU pinned to one pCPU, shareable (guests vmplacer did not place)
FLOATING = "floating"  # vCPUs float over pCPU sets (a shared pool, or unpinned)
FIXED = "fixed"  # never moved (out of scope, cooling down, paused, or asked not to)
MODES = (EXCLUSIVE, PINNED, FLOATING, FIXED)

# Labels the rebalancer reads (operators set them with the placement request's `labels`).
# LABEL_WORKLOAD (interference-model key shared by replicas, default: the guest name) and LABEL_CLASS:
# core/model/identity.py, the one derivation learning uses too.
LABEL_LOAD = "load"  # time share each vCPU asks for, 0..1 (default: measured, else 1)
LABEL_PRIORITY = "priority"
LABEL_FLOOR = "perf_floor"  # SLO-like floor: predicted performance never pushed below it
LABEL_REBALANCE = "rebalance"  # "off": never moved; "no-migrate": repins only
LABEL_DIRTY = "dirty_mib_s"  # memory dirty rate, for migration cost


class RebalanceInputError(ValueError):
    """A guest or host description the rebalancer cannot use; names the guest and the field."""


@dataclass(frozen=True)
class RebalanceSettings:
    """Knobs of one rebalancing run (configuration, passed down; never global)."""

    min_gain: float = 0.05  # hysteresis: a move must raise the objective by this much (VMs at full speed)
    # … or by this share of the full speed of the guests on the hosts it touches, when that is less:
    # on a host of four guests 0.05 is 1.25 % of their mean, more than a trial resolves (0: off);
    # 0.003 rather than 0.005: steps of 0.4 % of a host's mean are real and a trial checks them
    min_gain_share: float = 0.003
    # a migration must clear this, after paying its cost; low because a migration that rests on the
    # model's data is measured on both hosts and undone if they measure worse (docs/rebalance.md §2)
    min_migration_gain: float = 0.01
    cooldown_s: float = 600.0  # a guest moved less than this ago stays put
    max_actions: int = 8
    horizon_s: float = 3600.0  # time over which a move's gain is counted against its one-off cost
    migration_bandwidth_mib_s: float = 1000.0
    max_downtime_s: float = 0.3
    copy_slowdown: float = 0.1
    memory_move_mib_s: float = 2000.0  # moving memory between nodes of one host
    default_dirty_mib_s: float = 8.0
    allow_migration: bool = True
    latency_critical_weight: float = 2.0
    fairness: float = 0.25  # concavity of the per-VM utility: ties go to the fairer layout
    move_candidates: int = 16  # pieces per host whose single moves are evaluated
    swap_candidates: int = 6  # pieces per host whose swaps are evaluated
    migration_candidates: int = 8  # guests considered for migration per round
    destination_candidates: int = 3  # destination hosts tried per guest
    max_rounds: int = 200
    probe_below_confidence: float = 0.5  # add a probe when a move's confidence is lower
    probe_seconds: float = 5.0
    pin_floating_guests: bool = False  # also pin guests vmplacer did not place and that float
    exhaustive_limit: int = 20000  # layouts per host the exhaustive check may enumerate
    # MiB a plan's what-if layouts may hold: a host that needs more is left out, named (core/rebalance/budget)
    memory_budget_mib: int = 1024
    # deterministic seconds of search per host (core/rebalance/budget): past it the host keeps the
    # moves found so far, and the plan's notes name it
    host_budget_s: float = 10.0
    pessimism: float = 1.5  # standard deviations a layout's predicted advantage over the blind spread must clear
    guess_weight: float = 0.5  # share of a predicted interference change its data do not identify that counts
    exact_max_cpus: int = 16  # hosts with at most this many usable pCPUs get an exact solver's layout
    exact_time_s: float = 1.0  # solver budget per host (or group of small hosts solved together), deterministic s
    exact_budget_s: float = 3.0  # solver budget per plan, all hosts together (deterministic s: load-independent)
    trials: bool = True  # measure each host after its moves (Freeze'nSense) and undo what measures worse
    trial_seconds: float = 3.0  # profiling time of a trial's measurement
    # a tried layout stays only if measured better by this much per guest (0.003 rather than 0.005:
    # diagnosis 27 in docs/research/rebalance-diagnoses.md)
    trial_min_gain: float = 0.003
    trial_tolerance: float = 0.0  # planned moves are undone only if measured worse by more than this per guest
    # a trial measured within this of its bar (per guest) is measured once more and judged on both
    # measurements: one probe's error (about 0.003 per guest) decides such a call otherwise (0: off)
    trial_recheck: float = 0.006
    # where a host's last planned layout measured worse (the model is wrong there lately), its next planned
    # layout is kept only if measured better by this much per guest, not merely no worse (0: off; 0.002 kept
    # the planner's own optimum out of reach where it is within one probe's error: diagnosis 30 in
    # docs/research/rebalance-diagnoses.md)
    trial_refuted_bar: float = 0.001
    trial_memory_s: float = 86400.0  # a measured comparison of two layouts is trusted (not tried again) this long
    trial_max: int = 3  # layouts a host may try within trial_memory_s
    # the disruption budget (core/rebalance/disruption.py): trials per plan and the vCPUs they may repin,
    # those that promise most per repin first; the rest wait for later rounds
    max_trials: int = 20
    max_trial_repins: int = 400
    # a guest moved (repinned, its memory moved or migrated) this many times in the last hour stays put (0: no limit);
    # a move a trial undid counts twice: it was made and taken back
    max_moves_per_guest_hour: int = 6
    # profiling leaves a guest running once it was frozen this share of the last hour (0: no limit;
    # core/rebalance/frozen_share.py; every stored profile run obeys it, the protection loop has its own)
    max_frozen_share_per_guest_hour: float = 0.02
    # migrations one process runs at once, over every host and plan it applies (0: no limit); a host is in at most
    # one migration at a time anyway (app/apply/migration_slots.py)
    max_migrations_in_flight: int = 2
    # after k planned layouts of a host in a row measured worse, it waits backoff_s·(2^(k-1)−1) (0: off, the
    # default: trials, their memory and close calls already stop the churn it was made for, and it held back gains)
    backoff_s: float = 0.0
    exploration: float = 1.5  # a host with no other trial tries its exact layout with each β this many sd lower (0: off)
    # Several instances sharing a round (`vmplacer rebalance --all` on each): hosts claimed and
    # planned together (moves stay within a batch), and how long a finished round rests before
    # the same hosts are rebalanced again (0: a later run starts a new round at once).
    round_batch_hosts: int = 50
    round_rest_s: float = 0.0
    # hosts read, measured and profiled at once by one run (one worker per host, never two on the
    # same host): a round takes about its slowest hosts' time, not the sum of every host's
    parallel_hosts: int = 16

    def min_gain_for(self, guests: float) -> float:
        """The hysteresis of a move on hosts that run `guests` (their weights summed)."""
        if self.min_gain_share <= 0:
            return self.min_gain
        return min(self.min_gain, self.min_gain_share * max(guests, 0.0))

    def __post_init__(self) -> None:
        for name in ("min_gain", "min_gain_share", "min_migration_gain", "cooldown_s", "horizon_s", "copy_slowdown",
                     "default_dirty_mib_s", "fairness", "probe_seconds", "exact_time_s", "exact_budget_s",
                     "pessimism", "trial_seconds", "trial_min_gain", "trial_tolerance", "trial_recheck",
                     "trial_refuted_bar", "trial_memory_s", "backoff_s", "exploration", "round_rest_s",
                     "host_budget_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise RebalanceInputError(f"rebalance settings: field {name!r} must be a number >= 0, got {value!r}")
        for name in ("migration_bandwidth_mib_s", "memory_move_mib_s", "latency_critical_weight"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise RebalanceInputError(f"rebalance settings: field {name!r} must be a number > 0, got {value!r}")
        for name in ("max_actions", "move_candidates", "swap_candidates", "migration_candidates",
                     "destination_candidates", "max_rounds", "exhaustive_limit", "exact_max_cpus", "trial_max",
                     "memory_budget_mib", "max_trials", "max_trial_repins", "max_moves_per_guest_hour",
                     "max_migrations_in_flight"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 0):
                raise RebalanceInputError(f"rebalance settings: field {name!r} must be an integer >= 0, got {value!r}")
        for name in ("round_batch_hosts", "parallel_hosts"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise RebalanceInputError(f"rebalance settings: field {name!r} must be an integer >= 1, got {value!r}")
        share = self.max_frozen_share_per_guest_hour
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not (math.isfinite(share)
                                                                                    and 0 <= share <= 1):
            raise RebalanceInputError("rebalance settings: field 'max_frozen_share_per_guest_hour' must be a number "
                                      f"in [0, 1] (0: no limit), got {share!r}")
        if self.copy_slowdown > 1:
            raise RebalanceInputError(f"rebalance settings: field 'copy_slowdown' must be <= 1, got {self.copy_slowdown}")
        if not 0 <= self.guess_weight <= 1:
            raise RebalanceInputError("rebalance settings: field 'guess_weight' must be in [0, 1]")
        if not 0 <= self.probe_below_confidence <= 1:
            raise RebalanceInputError("rebalance settings: field 'probe_below_confidence' must be in [0, 1]")

    def to_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class GuestState:
    """One running guest as the search sees it."""

    name: str
    host: str
    placement: Placement
    mode: str = PINNED
    key: str = ""  # interference-model key
    workload_class: str = "unknown"
    load: float = 1.0
    weight: float = 1.0
    floor: float | None = None
    protected: bool = False
    thread_policy: str = "prefer"  # exclusive guests: prefer | isolate | require
    anti_affinity: tuple[str, ...] = ()
    spec: GuestSpec | None = None  # guests vmplacer placed: the placement engine re-places with it
    migratable: bool = True
    dirty_mib_s: float | None = None
    why_fixed: str = ""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise RebalanceInputError(f"guest {self.name}: field 'mode' must be one of {', '.join(MODES)}, "
                                      f"got {self.mode!r}")
        if self.placement.guest != self.name or self.placement.host != self.host:
            raise RebalanceInputError(f"guest {self.name}: field 'placement' describes {self.placement.guest} "
                                      f"on {self.placement.host}, not {self.name} on {self.host}")
        if not self.placement.vcpupin:
            raise RebalanceInputError(f"guest {self.name}: field 'placement.vcpupin' lists no vCPU")
        if not (0.0 < self.load <= 1.0):
            raise RebalanceInputError(f"guest {self.name}: field 'load' must be in (0, 1], got {self.load!r}")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise RebalanceInputError(f"guest {self.name}: field 'weight' must be > 0, got {self.weight!r}")
        if self.floor is not None and not 0.0 <= self.floor <= 1.0:
            raise RebalanceInputError(f"guest {self.name}: field 'floor' must be in [0, 1], got {self.floor!r}")
        object.__setattr__(self, "key", self.key or self.name)

    @property
    def movable(self) -> bool:
        return self.mode != FIXED

    @property
    def ideal(self) -> float:
        """What the guest gets alone on idle pCPUs: every vCPU its full load."""
        return self.placement.vcpus * self.load

    def fixed(self, why: str) -> GuestState:
        return replace(self, mode=FIXED, why_fixed=why)


@dataclass(frozen=True)
class HostState:
    name: str
    topology: HostTopology
    accepts_migrations: bool = True
    options: AllocationOptions = field(default_factory=AllocationOptions)  # overcommit, memory reserve


@dataclass(frozen=True)
class ClusterState:
    hosts: Mapping[str, HostState]
    guests: Mapping[str, GuestState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, guest in self.guests.items():
            if name != guest.name:
                raise RebalanceInputError(f"guest {guest.name}: listed under the name {name!r}")
            if guest.host not in self.hosts:
                raise RebalanceInputError(f"guest {guest.name}: field 'host' names {guest.host!r}, "
                                          f"which is not among the hosts ({', '.join(sorted(self.hosts))})")
            topology = self.hosts[guest.host].topology
            for vcpu, pins in guest.placement.vcpupin.items():
                unknown = sorted(set(pins) - set(topology.cpus))
                if unknown:
                    raise RebalanceInputError(f"guest {guest.name}: field 'vcpupin': vCPU {vcpu} is pinned to "
                                              f"pCPUs {unknown}, which host {guest.host} does not have")

    def on_host(self, host: str) -> list[GuestState]:
        return [g for g in self.guests.values() if g.host == host]


def _number(labels: Mapping[str, str], key: str, name: str, low: float, high: float) -> float | None:
    if key not in labels:
        return None
    try:
        value = float(labels[key])
    except ValueError:
        raise RebalanceInputError(f"guest {name}: label {key!r} must be a number, got {labels[key]!r}") from None
    if not (low <= value <= high):
        raise RebalanceInputError(f"guest {name}: label {key!r} must be between {low:g} and {high:g}, got {value:g}")
    return value


@dataclass(frozen=True)
class GuestLabels:
    """A guest's rebalancing labels, read and checked (its domain's over its spec's)."""

    identity: ModelIdentity
    load: float | None
    priority: float
    floor: float | None
    dirty_mib_s: float | None
    rebalance: str


def read_guest_labels(name: str, labels: Mapping[str, str] | None = None,
                      spec: GuestSpec | None = None) -> GuestLabels:
    """Every label the rebalancer reads, checked at once. One bad value refuses them all
    (RebalanceInputError naming guest, label and rule): the rebalancer then describes the
    guest from its spec alone, and learning keys it the same way, so both agree on its key."""
    try:
        identity = model_identity(name, labels, spec)
    except ModelIdentityError as exc:
        raise RebalanceInputError(str(exc)) from None
    merged = dict(spec.labels if spec else {}) | dict(labels or {})
    load = _number(merged, LABEL_LOAD, name, 0.0, 1.0)
    priority = _number(merged, LABEL_PRIORITY, name, -1000, 1000) or 0.0
    floor = _number(merged, LABEL_FLOOR, name, 0.0, 1.0)
    dirty = _number(merged, LABEL_DIRTY, name, 0.0, 1e6)
    rebalance = merged.get(LABEL_REBALANCE, "on")
    if rebalance not in ("on", "off", "no-migrate"):
        raise RebalanceInputError(f"guest {name}: label {LABEL_REBALANCE!r} must be on, off or no-migrate, "
                                  f"got {rebalance!r}")
    return GuestLabels(identity, load, priority, floor, dirty, rebalance)


def describe_guest(
    placement: Placement,
    *,
    labels: Mapping[str, str] | None = None,
    spec: GuestSpec | None = None,
    load: float | None = None,
    settings: RebalanceSettings | None = None,
) -> GuestState:
    """The rules a guest moves by, from what is known about it.

    Guests vmplacer placed (with a `spec`) keep the placement engine's rules:
    fully dedicated guests own their pCPUs and are repinned 1:1 (isolate: whole
    cores; require: only migrated, through the engine); shared and mixed
    guests float over a pool and only leave as a whole. Guests vmplacer did
    not place own nothing: pinned ones are repinned freely, floating ones are
    left floating unless `pin_floating_guests`. A latency-critical label
    makes any guest exclusive on whole cores. `load` (a measured demand)
    overrides the `load` label.
    """
    settings = settings or RebalanceSettings()
    name = placement.guest
    read = read_guest_labels(name, labels, spec)
    identity, floor, dirty, rebalance = read.identity, read.floor, read.dirty_mib_s, read.rebalance
    workload_class = identity.workload_class
    if load is None:
        load = read.load
    load = 1.0 if load is None else min(1.0, max(float(load), 0.01))
    priority = read.priority
    latency_critical = workload_class == "latency-critical"
    weight = (settings.latency_critical_weight if latency_critical else 1.0) * max(0.1, 1.0 + priority / 100.0)

    thread_policy = "prefer"
    single = all(len(p) == 1 for p in placement.vcpupin.values())
    if spec is not None:
        dedicated = spec.dedicated_vcpu_set
        thread_policy = spec.effective_thread_policy
        if dedicated and len(dedicated) == spec.vcpus:
            mode = EXCLUSIVE if single else FIXED
        else:
            mode = FLOATING
    elif latency_critical:
        mode, thread_policy = (EXCLUSIVE, "isolate") if single else (FLOATING, "prefer")
    else:
        mode = PINNED if single else FLOATING
    why = ""
    if mode == EXCLUSIVE and thread_policy == "require":
        mode, why = FIXED, "thread_policy require: sibling pairs move only by migration"
    if rebalance == "off":
        mode, why = FIXED, f"label {LABEL_REBALANCE}=off"
    if mode == FLOATING and spec is None and not settings.pin_floating_guests:
        # Someone chose to let it float; it still counts as load and may leave as a whole.
        why = "floats over several pCPUs and was not placed by vmplacer"
    owns = mode == EXCLUSIVE or (mode == FIXED and spec is not None and bool(spec.dedicated_vcpu_set))
    if (placement.exclusive_cpus or placement.dedicated) and not owns:
        # Only guests placed as dedicated own pCPUs; a foreign guest pinned 1:1 merely looks so.
        placement = replace(placement, exclusive_cpus=frozenset(), dedicated=False)
    return GuestState(
        name=name,
        host=placement.host,
        placement=placement,
        mode=mode,
        key=identity.key,
        workload_class=workload_class,
        load=load,
        weight=weight,
        floor=floor,
        protected=latency_critical or priority > 0 or floor is not None,
        thread_policy=thread_policy,
        # the spec's rule and what the domain declares (a guest with no record still carries its rule)
        anti_affinity=tuple(dict.fromkeys((*(spec.anti_affinity if spec else ()), *placement.anti_affinity))),
        spec=spec,
        migratable=rebalance == "on",
        dirty_mib_s=dirty,
        why_fixed=why,
    )
