"""Protocols between the application layer and the outside world.

`app/` depends only on these; libvirt and the database are adapters injected by
`vmplacer/bootstrap/`, and the lab's simulator (`vmplacer/lab/`) implements them
too, so the same profiler, executor and rebalancer run against real hosts and
simulated ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from vmplacer.core.placement.bandwidth import CpuBandwidth
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, CancelRequest, Plan
from vmplacer.core.rebalance.trial import TrialOutcome
from vmplacer.core.topology.host import HostTopology


class HypervisorError(RuntimeError):
    """A host operation failed. `retriable` tells the executor whether to try again."""

    def __init__(self, message: str, *, host: str = "", domain: str = "", retriable: bool = False):
        super().__init__(message)
        self.host = host
        self.domain = domain
        self.retriable = retriable


class DomainGone(HypervisorError):
    """The domain disappeared (undefined, migrated away) while we worked on it."""


@dataclass(frozen=True)
class DomainInfo:
    name: str
    uuid: str
    state: str  # "running", "paused", "shutoff", ...
    pause_reason: str | None  # libvirt reason when paused ("user", "migration", ...)
    vcpus: int
    memory_kib: int
    placement: Placement | None = None
    labels: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Hypervisor(Protocol):
    """One host: what runs there and the few operations vmplacer performs."""

    name: str

    def topology(self) -> HostTopology: ...
    def domains(self) -> list[DomainInfo]: ...
    def domain(self, name: str) -> DomainInfo: ...
    def suspend(self, name: str) -> None: ...
    def resume(self, name: str) -> None: ...
    def pin_vcpu(self, name: str, vcpu: int, cpus: frozenset[int]) -> None: ...
    def pin_emulator(self, name: str, cpus: frozenset[int]) -> None: ...
    def migrate(self, name: str, destination: Hypervisor, *, bandwidth_mib_s: int | None = None,
                timeout_s: float | None = None) -> None: ...


@dataclass(frozen=True)
class Sample:
    """One measurement of a domain's performance over a window."""

    domain: str
    metric: str  # "ipc", "cpu", "probe"
    value: float
    window_s: float
    valid: bool = True
    reason: str = ""


@runtime_checkable
class Sampler(Protocol):
    """Measures domains' performance: start a window, then read it."""

    metric: str

    def begin(self, domains: list[str]) -> object: ...
    def end(self, token: object) -> dict[str, Sample]: ...


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


# ----- Freeze'nSense: freezing co-located domains, the freeze journal, profiles -------------


@dataclass(frozen=True)
class DomainStatus:
    """A domain's run state, read without parsing XML (cheap enough for every freeze)."""

    name: str
    uuid: str
    state: str  # "running", "paused", "shutoff", ...
    pause_reason: str | None = None  # "user" for libvirt suspend, else the libvirt reason

    @property
    def running(self) -> bool:
        return self.state == "running"


# The label key under which DomainFacts carries a domain's workload class.
WORKLOAD_CLASS_LABEL = "workload_class"


@dataclass(frozen=True)
class DomainFacts:
    """What the profiler needs to know about a domain besides its state."""

    pcpus: frozenset[int] | None  # pCPUs its vCPUs are pinned to; None when unpinned/unknown
    labels: dict[str, str] = field(default_factory=dict)  # operator labels + WORKLOAD_CLASS_LABEL


@runtime_checkable
class FreezableHost(Protocol):
    """The few host operations Freeze'nSense needs: list states, suspend, resume."""

    name: str

    def domain_states(self) -> dict[str, DomainStatus]: ...
    def suspend(self, name: str) -> None: ...
    def resume(self, name: str) -> None: ...
    def domain_facts(self, names: list[str]) -> dict[str, DomainFacts]: ...


@dataclass(frozen=True)
class FreezeEntry:
    """One freeze journal row: domains a vmplacer process suspended and must resume."""

    id: int
    host: str
    domains: tuple[tuple[str, str], ...]  # (name, uuid)
    owner: dict[str, object]  # identity of the freezing process (hostname, pid, start time)
    created_at: float  # epoch seconds
    deadline_at: float  # epoch seconds: the freezer's watchdog resumes everything by then


@runtime_checkable
class FreezeJournal(Protocol):
    """Durable record of freezes in progress, written (committed) before any suspend."""

    def open(self, host: str, domains: list[tuple[str, str]], max_freeze_s: float,
             owner: dict[str, object]) -> int: ...
    def close(self, entry_id: int) -> None: ...
    def pending(self, host: str | None = None) -> list[FreezeEntry]: ...


@runtime_checkable
class FreezeGuard(Protocol):
    """A resumer outside the freezing process: it resumes an armed freeze's domains at the
    deadline, or at once if the freezing process dies, whatever killed it."""

    def identity(self) -> dict[str, object]: ...  # recorded in the journal row (who else may resume)
    def arm(self, entry_id: int, host: str, domains: list[tuple[str, str]], max_freeze_s: float) -> None: ...
    def disarm(self, entry_id: int) -> None: ...


@dataclass(frozen=True)
class Neighbour:
    """A co-located domain at sample time and how close its pCPUs are to the sampled VM's."""

    name: str
    distance: str  # a DistanceClass value, or "unknown" when either side is unpinned
    frozen: bool  # False: it kept running (excluded from freezing, or not ours to freeze)


@dataclass(frozen=True)
class ProfileSample:
    """One stored Freeze'nSense measurement: ζ (shared), ζb (neighbours frozen) or ζp (all but one frozen)."""

    guest: str
    # "zeta" | "zeta_b" | "zeta_p" (a pair probe: one neighbour running) | "frozen" (a freeze that gave no
    # sample, stored only to count the guests' frozen time: core/rebalance/frozen_share.py)
    kind: str
    metric: str
    value: float
    window_s: float
    t_m_ms: float
    at: float  # epoch seconds
    neighbours: tuple[Neighbour, ...] = ()
    freeze_ms: float | None = None  # ζb only: first suspend issued -> last resume returned


@runtime_checkable
class ProfileStore(Protocol):
    """Where profiling runs and their samples go (the database in production)."""

    def start_run(self, host: str, metric: str, parameters: dict[str, object]) -> int: ...
    def add_samples(self, run_id: int, samples: list[ProfileSample]) -> None: ...
    def finish_run(self, run_id: int, results: dict[str, object], status: str = "finished") -> None: ...


# ----- placements -----------------------------------------------------------------------------


class ClaimConflict(RuntimeError):
    """Another writer claimed some of the same pCPUs first; re-plan and retry."""


@dataclass(frozen=True)
class RecordedPlacement:
    """A placement row as reconciling needs it: what was recorded and how long ago it last changed."""

    guest: str
    host: str
    state: str  # planned | defined | running
    domain_uuid: str | None
    placement: Placement
    age_s: float  # seconds since the row last changed (never negative)


@runtime_checkable
class PlacementStore(Protocol):
    """Where vmplacer records the placements it made and the pCPUs they own exclusively."""

    def occupied(self, host: str) -> list[Placement]: ...
    def occupied_and_refusals(self, host: str) -> tuple[list[Placement], dict[str, tuple[str, ...]]]:
        """`occupied` in one read with the refusals of the guests recorded there: guest -> the
        guests its spec refuses to share a node with (anti-affinity binds both ways)."""
        ...
    def record(self, host: str, uri: str, placement: Placement, spec: dict[str, object]) -> None:
        """Raises ClaimConflict when an exclusive pCPU is already claimed."""
        ...
    def set_state(self, guest: str, state: str, domain_uuid: str | None = None, *,
                  audit: dict[str, object] | None = None) -> None:
        """`audit`: keyword arguments of `audit()`, recorded together with the state."""
        ...
    def forget(self, guest: str) -> None: ...
    def update_pins(self, placements: list[Placement]) -> list[str]:
        """Recorded placements follow pins changed on the host (guests never recorded are
        skipped); returns the guests updated."""
        ...
    def get(self, guest: str) -> dict[str, object] | None: ...
    def audit(self, *, action: str, outcome: str, host: str | None, guest: str | None,
              message: str = "", detail: dict[str, object] | None = None) -> None: ...
    def records(self, host: str) -> list[RecordedPlacement]:
        """The placements recorded on `host` that still hold resources, oldest first."""
        ...


# ----- background jobs (REST API) ----------------------------------------------------------------


@dataclass(frozen=True)
class JobRecord:
    """A background job as stored: what it does, on which hosts, and how far it got."""

    id: str
    kind: str
    hosts: tuple[str, ...]
    status: str  # queued | running | succeeded | failed | cancelled
    progress: float  # 0..1
    message: str
    parameters: dict[str, object]
    result: dict[str, object] | None = None
    error: dict[str, object] | None = None
    created_by: str = ""
    owner: str | None = None  # the vmplacer instance running it
    created_at: float = 0.0  # epoch seconds
    started_at: float | None = None
    finished_at: float | None = None
    heartbeat_at: float | None = None

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")


@runtime_checkable
class JobStore(Protocol):
    """Durable job rows shared by every vmplacer instance on one database."""

    def create(self, kind: str, hosts: list[str], parameters: dict[str, object],
               created_by: str) -> JobRecord: ...
    def get(self, job_id: str) -> JobRecord | None: ...
    def queued(self, limit: int) -> list[JobRecord]: ...
    def claim(self, job_id: str, owner: str) -> bool:
        """queued -> running for `owner`; False when another instance claimed it first."""
        ...
    def progress(self, job_id: str, owner: str, fraction: float, message: str) -> None: ...
    def finish(self, job_id: str, owner: str, status: str, result: dict[str, object] | None,
               error: dict[str, object] | None) -> bool: ...
    def heartbeat(self, owner: str, job_ids: list[str]) -> None: ...
    def request_stop(self, job_id: str, by: str) -> JobRecord | None:
        """Record that an unfinished job should stop (for jobs that run until told)."""
        ...
    def cancel(self, job_id: str, by: str) -> JobRecord | None:
        """A queued job ends `cancelled` at once; a running one is asked to stop (`request_stop`)."""
        ...
    def reap(self, stale_s: float) -> list[str]:
        """Fail running jobs whose runner stopped sending heartbeats; their ids."""
        ...


# ----- rebalancing: plans, leases, placement rows, live memory moves -------------------------------


@runtime_checkable
class PlanStore(Protocol):
    """Where plans and the outcome of each action are kept (the database in production)."""

    def save(self, plan: Plan, created_by: str = "") -> Plan: ...  # the plan with its id
    def get(self, plan_id: int) -> Plan | None: ...
    def transition(self, plan_id: int, from_state: str, to_state: str, message: str = "") -> bool:
        """Move a plan on only if it is still in `from_state` (one of two racing callers wins)."""
        ...
    def record_action(self, plan_id: int, action: Action, *, started: bool = False,
                      finished: bool = False) -> None: ...
    def last_moved(self, guests: list[str] | None = None, since: float | None = None) -> dict[str, float]:
        """Guest -> epoch seconds its latest move finished (only moves finished since `since`)."""
        ...
    def moves_since(self, guests: list[str] | None, since: float) -> dict[str, int]:
        """Guest -> its moves finished since `since` (epoch seconds), an undone one counting twice."""
        ...
    def trial_outcomes(self, since: float) -> list[TrialOutcome]: ...  # of trial probes finished since
    def trial_counts(self, since: float) -> dict[tuple[str, str, str], int]:
        """(host, trial kind, kept|undone) -> trial probes finished since `since` (epoch seconds)."""
        ...
    def last_placements(self, guests: list[str]) -> dict[str, Placement]:
        """Guest -> the Placement its latest successful repin or migration left it in."""
        ...
    def cancel(self, plan_id: int, from_state: str, message: str) -> bool:
        """Cancel a proposed or approved plan still in `from_state`: the plan becomes `cancelled`
        and its pending actions `skipped` with `message`, in one step; False if it moved on."""
        ...
    def request_cancel(self, plan_id: int, by: str, reason: str = "") -> bool:
        """Ask a running plan to stop before its next action; False if it is not running.
        A second request keeps the first one's author and reason."""
        ...
    def cancel_requested(self, plan_id: int) -> CancelRequest | None:
        """The pending CancelRequest of a running plan, or None (the executor asks between actions)."""
        ...
    def close_orphaned(self, by: str = "vmplacer", *, dry_run: bool = False) -> list[int]:
        """End `running` plans whose executor stopped (no live lease on any of their hosts) as
        `failed`: pending actions skipped, a running one failed with its outcome unknown.
        Returns the ids closed (with `dry_run`: the ids it would close, nothing written)."""
        ...


@runtime_checkable
class LeaseStore(Protocol):
    """Per-host leases: a run acts on a host only while it holds the host's lease."""

    def acquire(self, hosts: list[str], holder: str, ttl_s: float) -> bool:
        """Every host or none; False when another holder has a live lease on any."""
        ...
    def renew(self, hosts: list[str], holder: str, ttl_s: float) -> bool: ...
    def release(self, hosts: list[str], holder: str) -> None: ...


@dataclass(frozen=True)
class RoundTicket:
    """The round an instance joined: `opened` by it, or already `finished` (rested: nothing to do)."""

    id: int
    key: str
    opened: bool
    finished: bool


@dataclass(frozen=True)
class RoundProgress:
    """A round's hosts not done yet, which of them another holder leases live (host -> holder),
    and which of those are leased outside the round (not by the instance that claimed them)."""

    pending: tuple[str, ...]
    busy: dict[str, str]
    foreign: tuple[str, ...] = ()


class RoundStore(Protocol):
    """Rebalance rounds shared by several instances: each host done once per round."""

    def join(self, key: str, hosts: Sequence[str], holder: str, *, dry_run: bool,
             rest_s: float = 0.0) -> RoundTicket: ...
    def claim(self, round_id: int, holder: str, limit: int, ttl_s: float) -> list[str]:
        """Pending hosts whose lease was free, expired or ours, now leased to `holder`."""
        ...
    def mark_done(self, round_id: int, hosts: Sequence[str], holder: str, plan_id: int | None,
                  outcome: str) -> list[str]: ...
    def progress(self, round_id: int, holder: str) -> RoundProgress: ...


@runtime_checkable
class PlacementUpdates(Protocol):
    """Recorded placements follow repins and migrations (guests never recorded are skipped)."""

    def apply(self, placements: list[Placement]) -> list[str]:
        """Raises ClaimConflict when a new exclusive pCPU is claimed by someone else."""
        ...


@runtime_checkable
class BandwidthControl(Protocol):
    """A host that can cap a running guest's CPU time (CFS quota), live and persistently."""

    def cpu_bandwidth(self, name: str) -> CpuBandwidth: ...
    def set_cpu_bandwidth(self, name: str, bandwidth: CpuBandwidth) -> None: ...


@dataclass(frozen=True)
class ThrottleRecord:
    """A throttle vmplacer set and has not released: on which guest, to what, and for whom.

    `original` is the guest's bandwidth before vmplacer first throttled it (what a release
    returns to); `protects` the protected guest it serves — the throttle's reason.
    """

    host: str
    guest: str
    bandwidth: CpuBandwidth
    original: CpuBandwidth
    protects: str
    reason: str = ""
    plan_id: int | None = None
    age_s: float = 0.0  # seconds since it last changed


@runtime_checkable
class ThrottleLedger(Protocol):
    """The durable record of throttles in force (the database in production); throttles outlive
    the process that set them, so their reasons must too."""

    def current(self, host: str | None = None) -> list[ThrottleRecord]: ...
    def note(self, host: str, guest: str, bandwidth: CpuBandwidth, original: CpuBandwidth, *, protects: str,
             reason: str = "", plan_id: int | None = None) -> None:
        """Record `guest` at `bandwidth`; an unthrottled bandwidth removes the record."""
        ...
    def moved(self, guest: str, source: str, target: str) -> None:
        """`guest` now runs on `target`: its throttle (CPU bandwidth is part of the domain and
        migrates with it) is recorded there."""
        ...


@runtime_checkable
class MemoryTuning(Protocol):
    """A host that can move a running guest's memory to other NUMA nodes."""

    def set_memory_nodes(self, name: str, nodes: frozenset[int]) -> None: ...


class SystemClock:
    """The real monotonic clock (the simulator has its own)."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


# ----- API tokens and plan applies: what the stores and the front ends both speak ----------------


class TokenError(ValueError):
    """Bad token name or scope, or a name already in use; the message says which."""


def hash_token(token: str) -> str:
    """A token's stored (and cached) form: its SHA-256; the token itself is never kept."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TokenInfo:
    name: str
    scope: str
    created_at: float
    last_used_at: float | None
    id: int | None = None  # the row's id: names are reused after a revoke, ids are not

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "scope": self.scope, "created_at": self.created_at,
                "last_used_at": self.last_used_at}


class ApplyRefused(Exception):
    """The plan cannot be applied now; `reason` says why, `job` names a competing job."""

    def __init__(self, reason: str, *, state: str | None = None, job: str | None = None):
        super().__init__(reason)
        self.state = state
        self.job = job
