"""Rebalancing, end to end: lease → profile → learn → observe → plan → apply → release.

`plan` observes the hosts and stores a proposed plan (a dry run: nothing
changes; a plan without actions is stored `empty`, final at once); `apply`
runs a stored plan; `cancel_plan` stops one (at once before it runs, between
actions while it runs); `run` does the whole loop while holding
a lease on every host it may touch, so two runs never act on one host (the
second finds the hosts busy, waits up to `wait_s`, then gives up). `run`,
`apply` and `cancel_plan` first close plans a stopped process left `running`
(no live lease on any of their hosts): they end `failed`, their running action
with an unknown outcome.

With `share`, `run` joins the round over its hosts that other instances may be
working on too (the RoundStore port) and runs the loop on one claimed batch of
hosts at a time, so each host is planned and applied once per round; hosts whose
holder stopped are taken over when their lease lapses.

Every outside service is injected: hosts (the Hypervisor port), stores
(plans, leases, placement rows, audit), and the optional steps — profile
(Freeze'nSense), learn (refit the interference model from the samples),
load the model, measure vCPU demand, probe. A step that is not available is
skipped with its reason in the report; without a learned model the policy
uses the linear predictor (time sharing only).
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vmplacer.app.apply.actions.probe import OnVerdict, trial_hosts
from vmplacer.app.apply.executor import Auditor, Executor, ExecutorError, ExecutorSettings
from vmplacer.app.host_fanout import for_each_host
from vmplacer.app.observe.host_snapshot import HostSnapshot, take_snapshot
from vmplacer.core.placement.guest import GuestSpec, GuestSpecError
from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.rebalance.layout_problem import LayoutSolver
from vmplacer.core.rebalance.plan import (
    PLAN_APPLIABLE_STATES,
    PLAN_CANCELLABLE_STATES,
    CancelRequest,
    Plan,
    not_appliable,
)
from vmplacer.core.placement.admit import AllocationOptions
from vmplacer.core.rebalance.policy import plan_rebalance
from vmplacer.core.rebalance.drain import plan_drain
from vmplacer.core.stage_times import StageTimes
from vmplacer.core.text import excerpt, plural
from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.rebalance.trial import Backoff, Measured, backoffs, refuted_hosts
from vmplacer.core.rebalance.state import (
    ClusterState,
    GuestState,
    HostState,
    RebalanceInputError,
    RebalanceSettings,
    describe_guest,
)
from vmplacer.ports import (
    Clock,
    Hypervisor,
    HypervisorError,
    LeaseStore,
    PlacementUpdates,
    PlanStore,
    RoundStore,
    ThrottleLedger,
)

log = logging.getLogger(__name__)

RUN_STATUSES = ("applied", "planned", "nothing-to-do", "busy", "failed", "cancelled")
# A shared round's status from its batches' statuses: the first of these that occurs.
ROUND_STATUS_ORDER = ("failed", "cancelled", "applied", "planned", "nothing-to-do")
ROUND_POLL_S = 1.0  # how often a run whose remaining hosts others hold looks again
# A profile step (and a trial's probe) is one profiler run of `profile_seconds` with t_sleep a
# tenth of it: about this many Freeze'nSense rounds, whatever the duration.
ROUNDS_PER_PROFILE = 10
HOUR_S = 3600.0  # the window of `rebalance.disruption.max_moves_per_guest_hour`


def round_key(host_names: Iterable[str], dry_run: bool) -> str:
    """What instances sharing a round agree on: the same hosts, and a dry run or not."""
    text = ("dry-run" if dry_run else "apply") + "\n" + "\n".join(sorted(set(host_names)))
    return hashlib.sha256(text.encode()).hexdigest()


class RebalanceError(RuntimeError):
    """A run or an apply that cannot proceed; `bad_input` marks the operator's mistakes."""

    def __init__(self, message: str, *, bad_input: bool = False):
        super().__init__(message)
        self.bad_input = bad_input


# The setting an operator lowers when planning runs out of memory: the config file's key of
# `RebalanceSettings.memory_budget_mib` (config_rebalance.config_key_of spells it; the app layer
# imports no config, and tests/functional/test_plan_refusals.py holds the two equal).
MEMORY_BUDGET_KEY = "rebalance.search.memory_budget_mib"
NAMED_AT_MOST = 5  # hosts or guests a one-line message names before "and N more"


def _named(names: Sequence[str], noun: str = "host") -> str:
    """'host h1', 'hosts h1, h2', 'hosts h1, ... h5 and 995 more': a bounded list for one line."""
    shown = ", ".join(names[:NAMED_AT_MOST])
    more = f" and {len(names) - NAMED_AT_MOST} more" if len(names) > NAMED_AT_MOST else ""
    return f"{noun if len(names) == 1 else noun + 's'} {shown}{more}"


@dataclass(frozen=True)
class HostRefusal:
    """A host the planner refused to plan (RebalanceInputError): its guests are left out with it.
    `guests` are those pinned to pCPUs the host's capabilities do not list, with those pCPUs;
    `capabilities` says where the host's pCPUs were read from."""

    host: str
    reason: str  # without the host's name
    capabilities: str
    guests: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def message(self) -> str:
        return f"host {self.host}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "error": self.message, "capabilities": self.capabilities,
                "guests": [{"guest": guest, "pcpus": list(pcpus)} for guest, pcpus in self.guests]}


class PlanInputRefused(RebalanceError):
    """No host of a plan could be planned because the planner refused what was read of them
    (a guest pinned to pCPUs its host's capabilities do not list): the caller's or the hosts'
    input, not a failure of the world. Nothing is stored."""

    def __init__(self, refused: Mapping[str, HostRefusal], unreadable: Mapping[str, str] | None = None,
                 drain: str | None = None):
        self.refused = dict(refused)
        self.unreadable = dict(unreadable or {})
        reasons = [r.message for r in list(self.refused.values())[:NAMED_AT_MOST]]
        if len(self.refused) > NAMED_AT_MOST:
            reasons.append(f"and {len(self.refused) - NAMED_AT_MOST} more hosts refused")
        if drain is not None:
            head = f"host {drain} to drain cannot be planned"
        else:
            head = "nothing was planned"
        text = f"{head}: {'; '.join(reasons)}"
        if self.unreadable:
            text += f" (not read: {', '.join(sorted(self.unreadable))})"
        super().__init__(text, bad_input=True)


class PlanningOutOfMemory(RebalanceError):
    """The planner ran out of memory (MemoryError) planning `hosts`: nothing is stored. Not the
    caller's input: the process's memory and the plan's budget (`setting`) decide it."""

    def __init__(self, hosts: Sequence[str]):
        self.hosts = list(hosts)
        self.setting = MEMORY_BUDGET_KEY
        super().__init__(
            f"planning ran out of memory for {_named(self.hosts)}; nothing was stored. Lower {self.setting} "
            "(MiB a plan's layouts may hold: hosts that need more are then left out, named) below what this "
            "process can use, or plan fewer hosts at once")


def capabilities_source(host: Any) -> str:
    """Where a host's pCPUs are read from, as messages name it: the adapter says (a configured
    capabilities file, or libvirt's capabilities of its URI); a host that does not, its URI."""
    source = getattr(host, "capabilities_source", None)
    if isinstance(source, str) and source:
        return source
    uri = getattr(host, "uri", None)
    return f"libvirt capabilities of {uri}" if isinstance(uri, str) and uri else "the host's capabilities"


class PlanNotFound(RebalanceError):
    """No stored plan has this id."""

    def __init__(self, plan_id: int):
        super().__init__(f"plan {plan_id} does not exist", bad_input=True)
        self.plan_id = plan_id


class PlanStateError(RebalanceError):
    """The plan's state does not allow what was asked (apply a finished plan, cancel a final one)."""

    def __init__(self, message: str, *, plan_id: int, state: str):
        super().__init__(message, bad_input=True)
        self.plan_id = plan_id
        self.state = state


@dataclass(frozen=True)
class CancelOutcome:
    """`cancelled` (proposed/approved: stopped at once) or `cancel-requested` (running: the
    executor stops before its next action; `plan` is the state when the request was stored)."""

    status: str
    plan: Plan


@dataclass(frozen=True)
class TrialMemory:
    """What the trials of the last `trial_memory_s` tell the policy: (winner, loser) layout keys
    compared by measurement (`better`), how many layouts each host tried (`tried`), the hosts in back-off because their planned layouts kept
    measuring worse (core/trial.backoffs), and the hosts whose last planned layout measured worse
    (core/trial.refuted_hosts)."""

    better: set[tuple[str, str]]
    tried: dict[str, int]
    held: dict[str, Backoff]
    refuted: set[str]


def cancel_plan(plans: PlanStore, plan_id: int, *, by: str, reason: str = "",
                audit: Auditor | None = None) -> CancelOutcome:
    """Cancel a stored plan: proposed or approved ones at once (pending actions skipped), a
    running one by a request its executor honours between actions. Final plans are refused."""
    request = CancelRequest(by=by, reason=reason)
    plan = plans.get(plan_id)
    if isinstance(plan, Plan) and plan.state == "running" and plan_id in plans.close_orphaned(by):
        closed = plans.get(plan_id)
        message = closed.message if isinstance(closed, Plan) else "interrupted"
        raise PlanStateError(f"plan {plan_id} is failed: it was running, but the process applying it had stopped, "
                             f"so it was closed now; it is final, there is nothing to cancel — {message}",
                             plan_id=plan_id, state="failed")
    for _ in range(5):  # the plan may move on (approved → running) between reading and writing it
        plan = plans.get(plan_id)
        if plan is None:
            raise PlanNotFound(plan_id)
        assert isinstance(plan, Plan)
        if plan.state not in PLAN_CANCELLABLE_STATES:
            raise PlanStateError(f"plan {plan_id} is {plan.state}: it is final, there is nothing to cancel "
                                 "(only a proposed, approved or running plan can be cancelled)",
                                 plan_id=plan_id, state=plan.state)
        if plan.state == "running":
            if plans.request_cancel(plan_id, by, reason):
                _audit_cancel(audit, plan, "requested", request,
                              f"plan {plan_id}: cancel requested by {by}; it stops before its next action")
                return CancelOutcome("cancel-requested", plans.get(plan_id) or plan)
        elif plans.cancel(plan_id, plan.state, request.message):
            _audit_cancel(audit, plan, "ok", request, f"plan {plan_id}: {request.message} (was {plan.state})")
            stored = plans.get(plan_id) or plan.cancelled(request.message)
            return CancelOutcome("cancelled", stored)
    raise RebalanceError(f"plan {plan_id} keeps changing state; try the cancel again")


def _audit_cancel(audit: Auditor | None, plan: Plan, outcome: str, request: CancelRequest, message: str) -> None:
    if audit is None:
        return
    try:
        audit.audit(action="rebalance-cancel", outcome=outcome, host=None, guest=None, message=message,
                    detail={"plan_id": plan.id, "by": request.by, "reason": request.reason,
                            "from_state": plan.state})
    except Exception as exc:  # noqa: BLE001 - the cancel is stored; a lost audit line must not undo it
        log.error("audit log write failed (rebalance-cancel of plan %s): %s", plan.id, exc)


@dataclass(frozen=True)
class RunOptions:
    hosts: tuple[str, ...] | None = None  # None: every host
    dry_run: bool = False
    max_actions: int | None = None
    scope: tuple[str, ...] = ("*",)  # glob patterns of guests that may move (others still count as load)
    profile_seconds: float = 0.0  # 0: no profiling step
    lease_ttl_s: float = 900.0
    wait_s: float = 0.0  # how long to wait for busy hosts
    drain: str | None = None  # a host to empty (maintenance) instead of a rebalance
    # Share the hosts with other instances in a round (needs a round store; never for a drain):
    # claim `batch_hosts` hosts at a time, plan and apply them, until every host of the round is done.
    share: bool = False
    batch_hosts: int = 50
    round_rest_s: float = 0.0  # a round of the same hosts that finished this recently is not redone


@dataclass
class Step:
    name: str
    status: str  # ok | skipped | failed
    seconds: float
    message: str = ""
    # when the step began, seconds after the first of the steps run alongside it (hosts profiled
    # at once: an operator sees they overlapped); None for a step run on its own
    offset_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "status": self.status, "seconds": round(self.seconds, 3),
                                "message": self.message}
        if self.offset_s is not None:
            data["offset_s"] = round(self.offset_s, 3)
        return data


@dataclass
class RoundShare:
    """This instance's part of a shared round: the batches it claimed, planned and applied."""

    id: int
    hosts: int  # in the whole round
    opened: bool  # this instance opened the round (the others joined it)
    # {hosts, marked (the hosts it marked done: not those whose lease lapsed and was taken over),
    #  plan_id, status, plan_cpu_s}
    batches: list[dict[str, Any]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # hosts still pending when this instance stopped

    @property
    def done_here(self) -> list[str]:
        return sorted(h for b in self.batches for h in b["marked"])

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "hosts": self.hosts, "opened": self.opened, "done_here": self.done_here,
                "plan_cpu_s": round(sum(b["plan_cpu_s"] for b in self.batches), 4),
                "batches": [{k: v for k, v in b.items() if k != "marked"} for b in self.batches],
                "left": list(self.left)}


@dataclass
class RunReport:
    status: str
    plan: Plan | None = None
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    round: RoundShare | None = None  # set when the run shared its hosts with other instances
    plan_cpu_s: float = 0.0  # CPU time this process spent planning (what sharing divides)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "status": self.status,
            "plan": self.plan.to_dict() if self.plan else None,
            "steps": [s.to_dict() for s in self.steps],
            "notes": list(self.notes),
        }
        if self.round is not None:
            data["round"] = self.round.to_dict()
        return data


@dataclass
class Observation:
    state: ClusterState
    notes: list[str]
    unreachable: list[str]
    errors: dict[str, str] = field(default_factory=dict)  # host -> why it could not be read
    refused: dict[str, HostRefusal] = field(default_factory=dict)  # host -> why the planner refused it


@dataclass(frozen=True)
class RebalancePorts:
    """What a rebalancer reads and drives, wired by the composition root: the hypervisors, the
    stores, the clocks, and the steps around planning (model, learning, profiling, probes). A
    step left None is not available: the run says so instead of doing it."""

    hosts: Mapping[str, Hypervisor]
    plans: PlanStore
    leases: LeaseStore
    clock: Clock
    wall: Callable[[], float] = time.time
    placements: PlacementUpdates | None = None
    audit: Auditor | None = None
    specs: Callable[[str], Mapping[str, Any] | None] | None = None
    load_model: Callable[[], InterferenceModel] | None = None
    learn: Callable[[], str] | None = None
    profile: Callable[[str, float, Sequence[str]], str | Measured] | None = None
    demand: Callable[[str, list[str]], dict[str, float]] | None = None
    probe: Callable[[str, float], str | Measured] | None = None
    allocation: Callable[[str], AllocationOptions] | None = None
    in_maintenance: Callable[[], Iterable[str]] | None = None
    solver: LayoutSolver | None = None  # exact layouts of small hosts (None: the local search alone)
    throttles: ThrottleLedger | None = None  # where throttle/release actions record what they leave in force
    on_trial: OnVerdict | None = None  # told of each trial verdict while a plan is applied (the API counts them)
    rounds: RoundStore | None = None  # rounds shared with other instances (None: every run plans all its hosts)
    # every port above may be called from several threads at once, one thread per host (the
    # composition root's libvirt and SQL adapters may; the lab's simulator, one clock and one random
    # stream, may not): then a run reads and profiles up to `parallel_hosts` hosts at once
    thread_safe: bool = False


class Rebalancer:
    def __init__(
        self,
        ports: RebalancePorts,
        *,
        holder: str = "rebalance",
        settings: RebalanceSettings | None = None,
        executor_settings: ExecutorSettings | None = None,
        unavailable: Mapping[str, str] | None = None,
    ):
        self.ports = ports
        self.hosts = dict(ports.hosts)
        self.rounds = ports.rounds
        # Each host's latest measurement (this run's profile, then its kept trials): what trials compare.
        self.measurements: dict[str, Measured] = {}
        self.throttles = ports.throttles
        self.solver = ports.solver
        self.in_maintenance = ports.in_maintenance or (lambda: ())
        self.allocation = ports.allocation or (lambda _host: AllocationOptions())
        self.plans = ports.plans
        self.leases = ports.leases
        self.clock = ports.clock
        self.wall = ports.wall
        self.holder = holder
        self.settings = settings or RebalanceSettings()
        self.executor_settings = executor_settings or ExecutorSettings()
        self.placements = ports.placements
        self.auditor = ports.audit
        self.specs = ports.specs
        self.load_model = ports.load_model
        self.learn = ports.learn
        self.profile = ports.profile
        self.demand = ports.demand
        self.probe = ports.probe
        self.unavailable = dict(unavailable or {})  # step -> why it is not available
        self.on_trial = ports.on_trial

    # ----- observe ------------------------------------------------------------------------------
    def observe(self, host_names: Iterable[str]) -> Observation:
        """Hosts, their running guests and the rules each guest moves by: each host's snapshot
        (app/observe/host_snapshot.py), with a description of each running guest on top."""
        hosts: dict[str, HostState] = {}
        guests: dict[str, GuestState] = {}
        notes: list[str] = []
        unreachable: list[str] = []
        errors: dict[str, str] = {}
        refused: dict[str, HostRefusal] = {}
        closed = set(self.in_maintenance())
        names = list(dict.fromkeys(host_names))
        reads = for_each_host(names, self._read_host, limit=self._parallel(len(names)))
        for name, outcome in zip(names, reads):
            if isinstance(outcome.error, HypervisorError):
                unreachable.append(name)
                errors[name] = str(outcome.error)
                notes.append(f"host {name} left out: {outcome.error}")
                continue
            if outcome.error is not None:
                raise outcome.error
            assert outcome.result is not None
            snapshot, loads, demand_error = outcome.result
            topology, domains = snapshot.topology, snapshot.domains or ()
            hosts[name] = HostState(name, topology, accepts_migrations=name not in closed,
                                    options=self.allocation(name))
            if name in closed:
                notes.append(f"host {name} is in maintenance: no guest moves onto it")
            running = [d for d in domains if d.state == "running"]
            if demand_error is not None:
                notes.append(f"host {name}: vCPU demand not measured ({demand_error}); labels or 1.0 used")
            here: dict[str, GuestState] = {}
            for domain in running:
                if domain.placement is None:
                    notes.append(f"guest {domain.name} on {name}: pinning unreadable, left out")
                    continue
                # a guest also running on an earlier host is described here only to check it (notes once)
                here[domain.name] = self._describe(domain, name, loads.get(domain.name),
                                                   notes if domain.name not in guests else [])
            refusal = self._refusal(name, hosts[name], here)
            if refusal is not None:  # the planner would refuse the whole cluster: this host is left out
                del hosts[name]
                refused[name] = refusal
                notes.append(f"host {name} left out: {refusal.reason}")
                continue
            for guest_name, guest in here.items():
                if guest_name in guests:
                    notes.append(f"guest {guest_name} is running on both {guests[guest_name].host} and {name}: "
                                 "left where it is")
                    guests[guest_name] = guests[guest_name].fixed("runs on two hosts")
                    continue
                guests[guest_name] = guest
        return Observation(ClusterState(hosts, guests), notes, unreachable, errors, refused)

    def _read_host(self, name: str) -> tuple[HostSnapshot, dict[str, float], HypervisorError | None]:
        """One host's snapshot and its running guests' vCPU demand (a measuring window of its
        own): what `observe` waits for on each host, so hosts are read at once."""
        snapshot = take_snapshot(self.hosts[name], listing=True)
        running = [d.name for d in snapshot.domains or () if d.state == "running"]
        if self.demand is None or not running:
            return snapshot, {}, None
        try:
            return snapshot, self.demand(name, running), None
        except HypervisorError as exc:
            return snapshot, {}, exc

    def _parallel(self, hosts: int) -> int:
        """Hosts worked on at once: the setting where every port may be called from several
        threads (`RebalancePorts.thread_safe`), else one after another."""
        return max(1, min(self.settings.parallel_hosts, hosts)) if self.ports.thread_safe else 1

    def _refusal(self, name: str, host: HostState, guests: Mapping[str, GuestState]) -> HostRefusal | None:
        """Why the planner refuses this host's part of the cluster (RebalanceInputError: a guest
        pinned to pCPUs the host's capabilities do not list), or None. The planner's own check
        decides; the refusal adds what its message lacks: every such guest, and where the host's
        pCPUs were read from."""
        try:
            ClusterState({name: host}, guests)
        except RebalanceInputError as exc:
            source = capabilities_source(self.hosts.get(name))
            listed = set(host.topology.cpus)
            found = []
            for guest in guests.values():
                unknown = sorted({cpu for pins in guest.placement.vcpupin.values() for cpu in pins} - listed)
                if unknown:
                    found.append((guest.name, tuple(unknown)))
            if not found:  # refused for another reason: the planner's words, quoted
                return HostRefusal(name, f"refused by the planner: {excerpt(str(exc), 300)}", source)
            where = f"(read from {source}: pCPUs {format_cpuset(listed) or 'none'})"
            if len(found) == 1:
                only, cpus = found[0]
                reason = (f"guest {excerpt(only, 64)} is pinned to pCPUs {format_cpuset(cpus)}, "
                          f"which the host's capabilities do not list {where}")
            else:
                pinned = ", ".join(f"{excerpt(guest, 64)} (pCPUs {format_cpuset(cpus)})"
                                   for guest, cpus in found[:NAMED_AT_MOST])
                if len(found) > NAMED_AT_MOST:
                    pinned += f" and {len(found) - NAMED_AT_MOST} more"
                reason = f"guests {pinned} are pinned to pCPUs the host's capabilities do not list {where}"
            return HostRefusal(name, reason, source, tuple(found))
        return None

    def _describe(self, domain: Any, host: str, load: float | None, notes: list[str]) -> GuestState:
        placement = domain.placement
        spec = None
        if self.specs is not None:
            raw = self.specs(domain.name)
            if raw:
                try:
                    spec = GuestSpec.from_mapping(dict(raw))
                except GuestSpecError as exc:
                    notes.append(f"guest {domain.name}: recorded spec unusable ({exc}); treated as foreign")
        try:
            return describe_guest(placement, labels=domain.labels, spec=spec, load=load, settings=self.settings)
        except RebalanceInputError as exc:
            notes.append(f"{exc}; the guest is left where it is")
            return describe_guest(placement, spec=spec, load=load, settings=self.settings).fixed(str(exc))

    # ----- plan -----------------------------------------------------------------------------------------
    def model(self, notes: list[str]) -> InterferenceModel:
        if self.load_model is None:
            why = self.unavailable.get("model", "no learned model is available")
            notes.append(f"interference model: {why}; the linear predictor (time sharing only) is used")
            return InterferenceModel()
        try:
            return self.load_model()
        except Exception as exc:  # noqa: BLE001 - a broken model must not stop rebalancing by time shares
            notes.append(f"interference model could not be loaded ({exc}); the linear predictor is used")
            return InterferenceModel()

    def make_plan(self, host_names: Sequence[str], *, max_actions: int | None = None,
                  scope: Sequence[str] = ("*",), notes: list[str] | None = None, drain: str | None = None,
                  need_a_host: bool = False) -> Plan:
        """Observe, plan and store a proposed plan, or an empty one (final) when no move is worth
        making; nothing on the hosts changes. With `drain`, the plan migrates the guests of
        that host away (maintenance) instead of rebalancing.

        A host that cannot be read is left out and named in the plan (`settings.unreadable`,
        and its summary): "nothing to do" then covers only the hosts read. With `need_a_host`,
        a run that could read none raises HypervisorError (retriable) and stores nothing.

        A host the planner refuses (a guest pinned to pCPUs its capabilities do not list) is
        left out the same way, named with the guests, the pCPUs and where its pCPUs were read
        from (`settings.refused`): one bad domain never fails a fleet's plan. When no host is
        left to plan because of such refusals, or the host to drain is refused,
        PlanInputRefused (bad input) is raised and nothing is stored. A planner that runs out
        of memory raises PlanningOutOfMemory, naming the hosts and the budget setting; nothing
        is stored."""
        notes = notes if notes is not None else []
        self._check_hosts(host_names)
        if drain is not None and drain not in host_names:
            raise RebalanceError(f"host {drain} to drain is not among the hosts of this run "
                                 f"({', '.join(host_names)})", bad_input=True)
        out_of_memory = False
        try:
            observed = self.observe(host_names)
        except MemoryError:  # raised below, once the frames holding what filled memory are gone
            out_of_memory = True
        if out_of_memory:
            raise PlanningOutOfMemory(host_names)
        notes.extend(observed.notes)
        if need_a_host and host_names and len(observed.errors) == len(set(host_names)):
            raise HypervisorError("no host could be read: " + "; ".join(observed.errors.values()),
                                  host=", ".join(observed.errors), retriable=True)
        if drain is not None and drain in observed.unreachable:
            raise RebalanceError(f"host {drain} to drain does not answer: "
                                 + next((n for n in observed.notes if n.startswith(f"host {drain} ")), ""))
        if drain is not None and drain in observed.refused:
            raise PlanInputRefused({drain: observed.refused[drain]}, drain=drain)
        if observed.refused and not observed.state.hosts:
            raise PlanInputRefused(observed.refused, observed.errors)
        model = self.model(notes)
        settings = self.settings if max_actions is None else replace(self.settings, max_actions=max_actions)
        refusal = ""
        try:
            plan = self._plan_observed(observed.state, model, settings, scope, drain)
        except MemoryError:
            out_of_memory = True
        except RebalanceInputError as exc:  # what the planner refuses beyond the hosts left out above
            refusal = f"the rebalance planner refused its input: {excerpt(str(exc), 300)}"
        if out_of_memory:
            raise PlanningOutOfMemory(sorted(observed.state.hosts))
        if refusal:
            raise RebalanceError(refusal, bad_input=True)
        unreadable = [{"host": host, "error": error} for host, error in observed.errors.items()]
        refused = [r.to_dict() for r in observed.refused.values()]
        summary = plan.summary
        if unreadable:
            summary += f" (not read, left out: {', '.join(observed.errors)})"
        if refused:
            summary += f" (refused, left out: {', '.join(observed.refused)})"
        plan = replace(plan, summary=summary, settings={
            **plan.settings, "observe_notes": list(observed.notes), "scope": list(scope),
            "model_observations": model.observations, "unreadable": unreadable, "refused": refused})
        return self.plans.save(plan, created_by=self.holder)

    def _plan_observed(self, state: ClusterState, model: InterferenceModel, settings: RebalanceSettings,
                       scope: Sequence[str], drain: str | None) -> Plan:
        """The planner's plan of the observed cluster (a drain's with `drain`), not stored yet."""
        movable = [g for g in state.guests if any(fnmatch.fnmatchcase(g, p) for p in scope)]
        if drain is not None:
            return plan_drain(state, model, drain, settings, now=self.wall(), scope=movable)
        now = self.wall()  # only moves within the cool-down hold a guest back
        last_moved = self.plans.last_moved(list(state.guests), since=now - settings.cooldown_s)
        moves = self.plans.moves_since(list(state.guests), now - HOUR_S) if settings.max_moves_per_guest_hour else {}
        memory = self._trial_memory(settings)
        times = StageTimes(time.perf_counter)
        plan = plan_rebalance(state, model, settings, now=now, last_moved=last_moved,
                              scope=movable, solver=self.solver, measured=memory.better, tried=memory.tried,
                              pooled=self.pooled_by_plans(state), held=memory.held,
                              refuted=memory.refuted, times=times, moves_last_hour=moves)
        log.info("rebalance planned over %d hosts in %.2f s (%s)", len(state.hosts),
                 sum(times.seconds.values()),
                 ", ".join(f"{stage} {seconds:.2f} s" for stage, seconds in times.rounded(2).items()))
        return plan

    def pooled_by_plans(self, state: ClusterState) -> set[str]:
        """Floating guests that float where one of vmplacer's own plans floated them, unchanged
        since: the policy may pin them again (a guest someone else let float stays floating)."""
        floating = [g.name for g in state.guests.values()
                    if g.spec is None and any(len(p) > 1 for p in g.placement.vcpupin.values())]
        if not floating:
            return set()
        last = self.plans.last_placements(floating)
        return {name for name in floating if name in last and last[name].host == state.guests[name].host
                and dict(last[name].vcpupin) == dict(state.guests[name].placement.vcpupin)}

    def measured_better(self, settings: RebalanceSettings) -> set[tuple[str, str]]:
        """(winner, loser) layout keys from the trials of the last `trial_memory_s`: a kept explore
        trial beat the layout before it, an undone one lost to it, an undone confirm trial lost to
        the layout it left. The policy follows these instead of trying the same pair again."""
        return self._trial_memory(settings).better

    def held_hosts(self, settings: RebalanceSettings) -> dict[str, Backoff]:
        """Hosts in back-off now: their last planned layouts measured worse, one after another, so
        their layout is only tried, not planned (core/trial.backoffs)."""
        return self._trial_memory(settings).held

    def _trial_memory(self, settings: RebalanceSettings) -> TrialMemory:
        """What the trials of the last `trial_memory_s` tell the policy (TrialMemory)."""
        if not settings.trials:
            return TrialMemory(set(), {}, {}, set())
        better: set[tuple[str, str]] = set()
        tried: dict[str, int] = {}
        now = self.wall()
        outcomes = self.plans.trial_outcomes(now - settings.trial_memory_s)
        for outcome in outcomes:
            if outcome.kind == "explore":
                better.add((outcome.to_key, outcome.from_key) if outcome.kept else (outcome.from_key, outcome.to_key))
                for host in outcome.budget_hosts:
                    tried[host] = tried.get(host, 0) + 1
            elif not outcome.kept:
                better.add((outcome.from_key, outcome.to_key))
        return TrialMemory(better, tried, backoffs(outcomes, now, settings.backoff_s, settings.trial_memory_s),
                           refuted_hosts(outcomes))

    def _check_hosts(self, host_names: Sequence[str]) -> None:
        unknown = sorted(set(host_names) - set(self.hosts))
        if unknown:
            raise RebalanceError(f"unknown host(s) {', '.join(unknown)} (configured: {', '.join(sorted(self.hosts))})",
                                 bad_input=True)

    # ----- plans a stopped process left running --------------------------------------------------------
    def close_orphaned(self) -> list[str]:
        """Close the plans a stopped process left `running` (no live lease on any of their hosts);
        one note per plan closed. A failure to check is a note too: it must not stop the work."""
        try:
            closed = self.plans.close_orphaned(self.holder)
        except Exception as exc:  # noqa: BLE001 - the run itself reports a database that is down
            log.error("could not check for plans left running by a stopped process: %s", exc)
            return [f"plans left running by a stopped process were not checked: {exc}"]
        notes = []
        for plan_id in closed:
            plan = self.plans.get(plan_id)
            message = plan.message if isinstance(plan, Plan) else "interrupted"
            log.warning("plan %s closed as failed: %s", plan_id, message)
            notes.append(f"plan {plan_id} closed as failed: {message}")
        return notes

    # ----- apply ---------------------------------------------------------------------------------------
    def apply(self, plan_id: int, *, lease_ttl_s: float = 900.0, wait_s: float = 0.0,
              audit: Auditor | None = None) -> Plan:
        """Approve (if proposed) and run a stored plan, holding leases on the hosts it touches
        (plans a stopped process left running are closed first: logged and audited). `audit`
        records the run's actions as whoever asked for it (default: this rebalancer's auditor)."""
        self.close_orphaned()
        self.measurements.clear()  # measured before this apply, by `_measure_before_trials`
        plan = self.plans.get(plan_id)
        if plan is None:
            raise PlanNotFound(plan_id)
        if plan.state not in PLAN_APPLIABLE_STATES:
            raise PlanStateError(not_appliable(plan_id, plan.state), plan_id=plan_id, state=plan.state)
        hosts = sorted({a.host for a in plan.actions} | {a.target_host for a in plan.actions if a.target_host})
        self._check_hosts(hosts)
        # a caller that holds the hosts' lease already (the protect job, between its plans) keeps it:
        # releasing it here would open a window for another run to take the hosts
        held_already = bool(hosts) and self.leases.renew(hosts, self.holder, lease_ttl_s)
        if not held_already and not self._acquire(hosts, lease_ttl_s, wait_s):
            raise RebalanceError(f"hosts {', '.join(hosts)} are busy: another run holds their lease")
        try:
            return self._apply_held(plan, hosts, lease_ttl_s, audit or self.auditor)
        finally:
            if not held_already:
                self.leases.release(hosts, self.holder)

    def _apply_held(self, plan: Plan, hosts: list[str], lease_ttl_s: float, auditor: Auditor | None) -> Plan:
        self._measure_before_trials(plan)
        assert plan.id is not None
        plan_id = plan.id
        if plan.state == "proposed":
            if not self.plans.transition(plan_id, "proposed", "approved", "approved by " + self.holder):
                return self._cancelled_meanwhile(plan_id, f"plan {plan_id} changed state while being approved")
            plan = plan.moved_to("approved")

        def keep_lease() -> bool:
            # A lease that lapsed (an action longer than the TTL, a stalled process) may have let
            # another process close the plan as interrupted: then stop, even if the lease renews.
            if not self.leases.renew(hosts, self.holder, lease_ttl_s):
                return False
            stored = self.plans.get(plan_id)
            return not isinstance(stored, Plan) or stored.state == "running"

        executor = Executor(
            self.hosts, clock=self.clock, plans=self.plans, audit=auditor, placements=self.placements,
            probe=self.probe, keep_lease=keep_lease, settings=self.executor_settings, throttles=self.throttles,
            measurements=self.measurements, on_trial=self.on_trial, lanes=self._parallel(len(hosts)),
            wall=self.wall,  # the per-guest move budget counts moves on the clock the store records them by
        )
        try:
            done = executor.run(plan)
        except ExecutorError as exc:
            return self._cancelled_meanwhile(plan_id, str(exc))
        stored = self.plans.get(plan_id)
        if isinstance(stored, Plan) and stored.state != done.state:
            return stored  # closed as interrupted while our lease had lapsed: the stored record stands
        return done

    def _measure_before_trials(self, plan: Plan) -> None:
        """A trial compares the host after its moves with the host before them: hosts with a trial
        and no measurement from this run (a stored plan applied later) are measured now."""
        if self.probe is None:
            return
        trials = [a for a in plan.actions if a.kind == "probe" and a.parameters.get("trial")]
        probe = self.probe
        due = [h for h in sorted({h for a in trials for h in trial_hosts(a)}) if h not in self.measurements]

        def measure(host: str) -> str | Measured:
            return probe(host, min(float(a.parameters.get("seconds", 5.0)) for a in trials if host in trial_hosts(a)))

        for outcome in for_each_host(due, measure, limit=self._parallel(len(due))):  # hosts measured at once
            if outcome.error is not None:  # without it the trials keep only what is sure
                log.warning("measuring %s before its trial failed: %s", outcome.host, outcome.error)
            elif isinstance(outcome.result, Measured):
                self.measurements[outcome.host] = outcome.result

    def _cancelled_meanwhile(self, plan_id: int, problem: str) -> Plan:
        """The plan someone cancelled between our reading it and starting it; otherwise `problem`."""
        stored = self.plans.get(plan_id)
        if isinstance(stored, Plan) and stored.state == "cancelled":
            return stored
        raise RebalanceError(problem)

    # ----- the whole loop -----------------------------------------------------------------------------
    def run(self, options: RunOptions) -> RunReport:
        host_names = list(options.hosts) if options.hosts else sorted(self.hosts)
        self._check_hosts(host_names)
        if options.share and options.drain is None and self.rounds is not None:
            return self._run_round(host_names, options)
        report = RunReport(status="failed")
        report.notes.extend(self.close_orphaned())  # before our own leases, which would hide them
        if not self._acquire(host_names, options.lease_ttl_s, options.wait_s):
            report.status = "busy"
            report.notes.append(f"hosts {', '.join(host_names)}: another run holds a lease; nothing done")
            return report
        try:
            return self._run_held(report, host_names, options)
        finally:
            self.leases.release(host_names, self.holder)

    def _run_held(self, report: RunReport, host_names: list[str], options: RunOptions) -> RunReport:
        """Profile, learn, plan and apply `host_names`, whose leases this run holds."""
        self.measurements.clear()
        self._profile_step(report, host_names, options)
        self._learn_step(report)
        started, cpu_started = self.clock.now(), time.process_time()
        plan = self.make_plan(host_names, max_actions=options.max_actions, scope=options.scope,
                              notes=report.notes, drain=options.drain)
        report.plan_cpu_s += time.process_time() - cpu_started
        report.steps.append(Step("plan", "ok", self.clock.now() - started, plan.summary))
        report.plan = plan
        moves = [a for a in plan.actions if a.kind != "probe"]
        if not moves:
            report.status = "nothing-to-do"
            return report
        if options.dry_run:
            report.status = "planned"
            return report
        self.leases.renew(host_names, self.holder, options.lease_ttl_s)
        started = self.clock.now()
        plan = self._apply_held(plan, host_names, options.lease_ttl_s, self.auditor)
        report.steps.append(Step("apply", {"succeeded": "ok", "cancelled": "skipped"}.get(plan.state, "failed"),
                                 self.clock.now() - started, f"plan {plan.id} {plan.state}: {plan.message}"))
        report.plan = plan
        report.status = {"succeeded": "applied", "cancelled": "cancelled"}.get(plan.state, "failed")
        return report

    # ----- a round shared with other instances ---------------------------------------------------------
    def _run_round(self, host_names: list[str], options: RunOptions) -> RunReport:
        """Join (or open) the round over `host_names`, then claim batches of its hosts until every
        one is done: hosts other instances lease are theirs; when only those remain, wait until
        they are done or their lease lapses (a stopped instance), and take them over."""
        assert self.rounds is not None
        report = RunReport(status="nothing-to-do")
        report.notes.extend(self.close_orphaned())
        ticket = self.rounds.join(round_key(host_names, options.dry_run), host_names, self.holder,
                                  dry_run=options.dry_run, rest_s=options.round_rest_s)
        share = RoundShare(ticket.id, len(host_names), ticket.opened)
        report.round = share
        if ticket.finished:
            report.notes.append(f"round {ticket.id} over these {plural(len(host_names), 'host')} finished less than "
                                f"{options.round_rest_s:g} s ago: nothing to do until it has rested")
            return report
        # An instance of the round that stopped lets its lease lapse within one TTL: wait that long
        # for its hosts. Hosts held outside the round (an API job, a --no-share run) are waited for
        # only `wait_s`, as a single run waits for busy hosts.
        patience = options.lease_ttl_s + options.wait_s
        last_pending: tuple[str, ...] | None = None
        since = self.clock.now()
        statuses: list[str] = []
        while True:
            batch = self.rounds.claim(ticket.id, self.holder, max(1, options.batch_hosts), options.lease_ttl_s)
            if batch:
                statuses.append(self._round_batch(report, ticket.id, batch, options))
                since = self.clock.now()
                continue
            progress = self.rounds.progress(ticket.id, self.holder)
            if not progress.pending:
                break
            if progress.pending != last_pending:
                last_pending, since = progress.pending, self.clock.now()
            outside_only = bool(progress.busy) and set(progress.busy) == set(progress.foreign)
            limit = options.wait_s if outside_only else patience
            if self.clock.now() - since >= limit:
                share.left = list(progress.pending)
                holders = sorted(set(progress.busy.values()))
                where = "outside this round" if outside_only else "without progress"
                report.notes.append(
                    f"round {ticket.id}: {plural(len(progress.pending), 'host')} still held by "
                    f"{', '.join(holders) or 'another run'} after {limit:g} s {where}; the round stays "
                    "open and the next run joins it")
                break
            self.clock.sleep(ROUND_POLL_S)
            # a stopped instance's plan left running is closed before its hosts are taken over
            report.notes.extend(self.close_orphaned())
        done_elsewhere = len(host_names) - len(share.done_here) - len(share.left)
        report.notes.append(f"round {ticket.id}: this run did {plural(len(share.done_here), 'host')} of "
                            f"{len(host_names)} in {plural(len(share.batches), 'batch', 'batches')}; "
                            f"{done_elsewhere} done by other runs")
        report.status = next((s for s in ROUND_STATUS_ORDER if s in statuses), "nothing-to-do")
        return report

    def _round_batch(self, report: RunReport, round_id: int, batch: list[str], options: RunOptions) -> str:
        """Plan and apply one claimed batch, mark it done in the round, release its leases."""
        assert self.rounds is not None
        part = RunReport(status="failed")
        try:
            self._run_held(part, batch, options)
        except PlanInputRefused:  # every host of the batch refused: left out of the round, as in a plan
            part.status = "nothing-to-do"  # (make_plan noted each, "host H left out: why")
        except (RebalanceError, HypervisorError) as exc:
            part.status = "failed"
            part.notes.append(f"hosts {', '.join(batch)}: {exc}")
        finally:
            plan_id = part.plan.id if part.plan is not None else None
            try:
                marked = self.rounds.mark_done(round_id, batch, self.holder, plan_id, part.status)
            finally:
                self.leases.release(batch, self.holder)
        report.steps.extend(part.steps)
        report.notes.extend(part.notes)
        report.plan_cpu_s += part.plan_cpu_s
        if part.plan is not None and (report.plan is None or part.plan.actions or not report.plan.actions):
            report.plan = part.plan
        lost = sorted(set(batch) - set(marked))
        if lost:
            report.notes.append(f"round {round_id}: lease of {', '.join(lost)} lapsed during the batch; "
                                "another run took them over")
        assert report.round is not None
        report.round.batches.append({"hosts": list(batch), "marked": marked, "plan_id": plan_id,
                                     "status": part.status, "plan_cpu_s": round(part.plan_cpu_s, 4)})
        return part.status

    def _profile_step(self, report: RunReport, host_names: list[str], options: RunOptions) -> None:
        if options.drain is not None:
            report.steps.append(Step("profile", "skipped", 0.0, f"draining {options.drain}: every guest "
                                     "leaves whatever it measures"))
            return
        if options.profile_seconds <= 0:
            report.steps.append(Step("profile", "skipped", 0.0, "no profiling time asked for"))
            return
        if self.profile is None:
            why = self.unavailable.get("profile", "no profiler is available")
            report.steps.append(Step("profile", "skipped", 0.0, why))
            log.warning("profile step skipped: %s", why)
            return
        profile = self.profile

        def one(host: str) -> tuple[Step, Measured | None]:
            started = self.clock.now()
            try:
                result = profile(host, options.profile_seconds, options.scope)
            except Exception as exc:  # noqa: BLE001 - a failed profile leaves the old model in place
                log.warning("profiling %s failed: %s", host, exc)
                return Step(f"profile {host}", "failed", self.clock.now() - started, str(exc),
                            started - began), None
            measured = result if isinstance(result, Measured) else None
            message = result.message if isinstance(result, Measured) else result
            return Step(f"profile {host}", "ok", self.clock.now() - started, message, started - began), measured

        began = self.clock.now()
        outcomes = for_each_host(host_names, one, limit=self._parallel(len(host_names)),
                                 heartbeat=lambda: self.leases.renew(host_names, self.holder, options.lease_ttl_s),
                                 heartbeat_s=max(1.0, options.lease_ttl_s / 4))
        for outcome in outcomes:
            if outcome.error is not None:  # `one` catches what a profile raises: this is the step's own fault
                raise outcome.error
            assert outcome.result is not None
            step, measured = outcome.result
            report.steps.append(step)
            if measured is not None:
                self.measurements[outcome.host] = measured

    def _learn_step(self, report: RunReport) -> None:
        if self.learn is None:
            why = self.unavailable.get("learn", "no learning step is available")
            report.steps.append(Step("learn", "skipped", 0.0, why))
            return
        started = self.clock.now()
        try:
            message = self.learn()
            report.steps.append(Step("learn", "ok", self.clock.now() - started, str(message or "")))
        except Exception as exc:  # noqa: BLE001 - the previous model stays usable
            report.steps.append(Step("learn", "failed", self.clock.now() - started, str(exc)))
            log.warning("learning failed: %s", exc)

    def _acquire(self, hosts: Sequence[str], ttl_s: float, wait_s: float) -> bool:
        deadline = self.clock.now() + max(wait_s, 0.0)
        while True:
            if self.leases.acquire(list(hosts), self.holder, ttl_s):
                return True
            if self.clock.now() >= deadline:
                return False
            self.clock.sleep(min(1.0, max(0.0, deadline - self.clock.now())) or 0.1)
