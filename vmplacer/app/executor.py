"""The executor: the only code that changes a host on a plan's behalf.

Each action goes through one contract:

* precheck — is the world still what the planner saw? A guest whose pinning,
  memory nodes or host changed since planning is skipped with the reason (a
  plan is never applied blindly); a guest already in the target state counts
  as done (applying a plan twice is harmless);
* execute — live repin (vCPUs, then emulator threads), live memory-node
  change, live migration (bandwidth limit, timeout → the job is aborted and
  the guest keeps running on the source), a throttle or release (CPU
  bandwidth, live and persistent), or a probe; retriable host errors are
  retried after a delay, fatal ones are not;
* verify — read the host back (live domain XML, or the scheduler
  parameters for a throttle) and compare with the action's `after`;
* revert — idempotent: puts back whatever of `before` is not in place (it
  reads the live state first, so running it twice, or after a partial
  execute, is safe).

A failed verify reverts the action. An action whose dependency did not
succeed is skipped. Between actions (never during one) the executor asks the
plan store whether someone requested a cancel: if so, the remaining actions
are skipped with who asked and why, and the plan ends `cancelled` — what
already succeeded stays applied (a cancel is not a rollback). With `on_failure="rollback"` one failure reverts every
action done so far. Every outcome is written to the plan store before the
next action starts, to the audit log, and — for guests vmplacer recorded —
to their placement rows (one transaction per action with the exclusive-pCPU
claims; a claim still held by a guest this plan moves later waits until that
guest has moved) — and, for throttles, to the throttle ledger with whom each
throttle protects, so no throttle outlives its reason unnoticed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from vmplacer.core.bandwidth import CpuBandwidth
from vmplacer.core.cpuset import format_cpuset
from vmplacer.core.placement import Placement
from vmplacer.core.plan import BANDWIDTH_KINDS, Action, CancelRequest, Plan, PlanError
from vmplacer.ports import (
    BandwidthControl,
    ClaimConflict,
    Clock,
    DomainGone,
    DomainInfo,
    Hypervisor,
    HypervisorError,
    PlacementUpdates,
    PlanStore,
    ThrottleLedger,
)

log = logging.getLogger(__name__)

ON_FAILURE = ("continue", "rollback")


class ExecutorError(RuntimeError):
    """The plan cannot be run at all (wrong state, already running elsewhere, unknown host)."""


@dataclass(frozen=True)
class ExecutorSettings:
    retries: int = 2  # extra attempts after a retriable error
    retry_delay_s: float = 1.0
    migration_timeout_s: float = 300.0
    migration_bandwidth_mib_s: int | None = None  # None: libvirt's default (unlimited)
    on_failure: str = "continue"  # or "rollback": undo every action done so far

    def __post_init__(self) -> None:
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"executor: field 'on_failure' must be one of {', '.join(ON_FAILURE)}, "
                             f"got {self.on_failure!r}")
        if self.retries < 0 or self.retry_delay_s < 0 or self.migration_timeout_s <= 0:
            raise ValueError("executor: retries and retry_delay_s must be >= 0, migration_timeout_s > 0")


class Auditor:
    """Anything with the PlacementStore's `audit(...)` method."""

    def audit(self, *, action: str, outcome: str, host: str | None, guest: str | None,
              message: str = "", detail: dict[str, object] | None = None) -> None: ...


@dataclass(frozen=True)
class Check:
    ok: bool
    reason: str = ""
    done: bool = False  # already in the target state


class ActionFailed(Exception):
    def __init__(self, message: str, retriable: bool = False):
        super().__init__(message)
        self.retriable = retriable


def _pins_equal(live: Placement, wanted: Placement) -> bool:
    """vCPU pins (those the wanted placement names) and, when named, the emulator pins."""
    for vcpu, cpus in wanted.vcpupin.items():
        if cpus and live.vcpupin.get(vcpu) != cpus:
            return False
    return not wanted.emulatorpin or live.emulatorpin == wanted.emulatorpin


def _pins_text(placement: Placement) -> str:
    return placement.describe_pinning() or "(unpinned)"


class Executor:
    def __init__(
        self,
        hosts: Mapping[str, Hypervisor],
        *,
        clock: Clock,
        plans: PlanStore | None = None,
        audit: Auditor | None = None,
        placements: PlacementUpdates | None = None,
        probe: Callable[[str, float], str] | None = None,
        keep_lease: Callable[[], bool] | None = None,
        settings: ExecutorSettings | None = None,
        throttles: ThrottleLedger | None = None,
    ):
        self.hosts = dict(hosts)
        self.clock = clock
        self.plans = plans
        self.auditor = audit
        self.placements = placements
        self.probe = probe
        self.keep_lease = keep_lease or (lambda: True)
        self.settings = settings or ExecutorSettings()
        self.throttles = throttles
        self._deferred: list[Placement] = []

    # ----- the plan ---------------------------------------------------------------------------
    def run(self, plan: Plan) -> Plan:
        """Run an approved plan; returns it in its final state (also stored, when stored)."""
        if plan.state != "approved":
            raise ExecutorError(f"plan {plan.id}: only an approved plan runs (it is {plan.state})")
        named = {a.host for a in plan.actions} | {a.target_host for a in plan.actions if a.target_host}
        missing = sorted(named - set(self.hosts))
        if missing:
            raise ExecutorError(f"plan {plan.id}: hosts {', '.join(missing)} are not configured")
        if self.plans is not None and plan.id is not None:
            if not self.plans.transition(plan.id, "approved", "running"):
                raise ExecutorError(f"plan {plan.id}: no longer approved (another run took it)")
        plan = plan.moved_to("running")
        self._deferred = []
        cancel: CancelRequest | None = None
        for action in plan.actions:
            if not action.final:
                cancel = self._cancel_request(plan)
                if cancel is not None:
                    plan = self._skip_rest(plan, cancel.message)
                    break
            plan = self._run_action(plan, action.index)
            if plan.actions[action.index].state == "failed" and self.settings.on_failure == "rollback":
                plan = self._roll_back(plan)
                break
        plan = self._skip_rest(plan, "the plan stopped before this action")
        self._flush_deferred(plan, final=True)
        outcome = "cancelled" if cancel is not None else plan.outcome()
        counts = {s: sum(1 for a in plan.actions if a.state == s) for s in ("succeeded", "failed", "skipped",
                                                                             "rolled_back")}
        message = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no actions"
        if cancel is not None:
            message = f"{cancel.message} ({message}; done actions stay applied)"
        else:
            late = self._cancel_request(plan)
            if late is not None:
                message += f"; the cancel request ({late.message}) came after the last action had started"
        if self.plans is not None and plan.id is not None:
            self.plans.transition(plan.id, "running", outcome, message)
        self._audit("rebalance-plan", "ok" if outcome == "succeeded" else outcome, None, None,
                    f"plan {plan.id}: {outcome} ({message})", {"plan_id": plan.id})
        return plan.moved_to(outcome, message)

    def _cancel_request(self, plan: Plan) -> CancelRequest | None:
        """A request to stop this plan, read from the plan store (None without a stored plan)."""
        if self.plans is None or plan.id is None:
            return None
        try:
            return self.plans.cancel_requested(plan.id)  # type: ignore[return-value]
        except Exception as exc:  # noqa: BLE001 - an unreadable request must not stop the plan halfway
            log.error("plan %s: could not read a cancel request: %s", plan.id, exc)
            return None

    def _run_action(self, plan: Plan, index: int) -> Plan:
        action = plan.actions[index]
        if action.final:
            return plan
        if not self.keep_lease():
            return self._finish(plan, action.moved_to("skipped", "the host lease was lost: stopping"))
        for dep in action.depends_on:
            state = plan.actions[dep].state
            if state != "succeeded":
                return self._finish(plan, action.moved_to(
                    "skipped", f"depends on action {dep} ({plan.actions[dep].kind}), which {state}"))
        try:
            check = self.precheck(action, plan)
        except HypervisorError as exc:
            check = Check(False, f"cannot read the host: {exc}")
        if not check.ok:
            return self._finish(plan, action.moved_to("skipped", check.reason))
        if check.done:
            action = action.moved_to("running")
            return self._finish(plan, action.moved_to("succeeded", "already in the target state"), record=True)
        action = action.moved_to("running")
        self._store(plan, action, started=True)
        if action.kind == "throttle":
            # Intent first (like the freeze journal): a process killed between libvirt's change and
            # the record must not leave a throttle nobody knows the reason of.
            self._note_throttle(plan, action, action.bandwidth_after)
        try:
            self._with_retries(action, lambda: self.execute(action))
            problem = self.verify(action)
            if problem:
                raise ActionFailed(f"verify: {problem}")
        except (ActionFailed, HypervisorError) as exc:
            undo = self._revert_quietly(action)
            message = f"{exc}; {undo}"
            if action.kind == "migrate":
                message += "; " + self._where(action)
            return self._finish(plan, action.moved_to("failed", message))
        return self._finish(plan, action.moved_to("succeeded", self._done_message(action)), record=True)

    def _finish(self, plan: Plan, action: Action, record: bool = False) -> Plan:
        if record and action.state == "succeeded" and action.after is not None:
            self._record_placement(plan, action)
        if action.kind in BANDWIDTH_KINDS and action.state in ("succeeded", "rolled_back", "failed"):
            self._note_throttle(plan, action)
        self._store(plan, action, finished=True)
        outcome = {"succeeded": "ok", "skipped": "skipped", "failed": "failed",
                   "rolled_back": "rolled_back"}[action.state]
        self._audit(f"rebalance-{action.kind.replace('_', '-')}", outcome, action.host, action.guest,
                    f"{action.describe()}: {action.message}" if action.message else action.describe(),
                    self._detail(plan, action))
        log.info("plan %s action %d %s: %s (%s)", plan.id, action.index, action.describe(), action.state,
                 action.message)
        return plan.with_action(action)

    def _skip_rest(self, plan: Plan, reason: str) -> Plan:
        for action in plan.actions:
            if not action.final:
                plan = self._finish(plan, action.moved_to("skipped", reason))
        return plan

    def _roll_back(self, plan: Plan) -> Plan:
        for action in reversed(plan.actions):
            if action.state != "succeeded":
                continue
            try:
                self.revert(action)
            except (HypervisorError, ActionFailed) as exc:
                self._audit("rebalance-revert", "failed", action.host, action.guest,
                            f"{action.describe()}: could not revert: {exc}", self._detail(plan, action))
                continue
            undone = action.moved_to("rolled_back", "undone: another action of the plan failed")
            if undone.before is not None and undone.kind != "probe":
                self._record(plan, [undone.before])
            plan = self._finish(plan, undone)
        return self._skip_rest(plan, "the plan was rolled back")

    # ----- the action contract ------------------------------------------------------------------
    def precheck(self, action: Action, plan: Plan | None = None) -> Check:
        if action.kind == "probe":
            if self.probe is None:
                return Check(False, "no profiler is available to probe with")
            return Check(True)
        if action.kind in BANDWIDTH_KINDS:
            return self._precheck_bandwidth(action)
        assert action.guest is not None and action.before is not None and action.after is not None
        if action.kind == "migrate":
            return self._precheck_migrate(action)
        host = self.hosts[action.host]
        try:
            info = host.domain(action.guest)
        except DomainGone:
            return Check(False, f"drift: {action.guest} is no longer on {action.host}")
        if info.state != "running":
            return Check(False, f"drift: {action.guest} is {info.state}, not running")
        live = info.placement
        if live is None:
            return Check(False, f"cannot read the pinning of {action.guest}")
        if action.kind == "set_memory_nodes":
            if live.memory_nodes == action.after.memory_nodes:
                return Check(True, done=True)
            if live.memory_nodes != action.before.memory_nodes:
                return Check(False, f"drift: memory nodes of {action.guest} are "
                                    f"{format_cpuset(live.memory_nodes) or '-'}, planned from "
                                    f"{format_cpuset(action.before.memory_nodes) or '-'}")
            if not callable(getattr(host, "set_memory_nodes", None)):
                return Check(False, f"host {action.host} cannot move a running guest's memory "
                                    "(its adapter has no live NUMA tuning)")
            return Check(True)
        if _pins_equal(live, action.after):
            return Check(True, done=True)
        if not _pins_equal(live, action.before):
            return Check(False, f"drift: {action.guest} is pinned {_pins_text(live)}, the plan expected "
                                f"{_pins_text(action.before)}")
        conflict = self._exclusive_conflict(action, plan)
        if conflict:
            return Check(False, conflict)
        return Check(True)

    def _exclusive_conflict(self, action: Action, plan: Plan | None) -> str:
        """A guest outside the plan now runs on pCPUs this action makes exclusive."""
        assert action.after is not None
        wanted = action.after.exclusive_cpus
        if not wanted:
            return ""
        moving = {a.guest for a in plan.actions} if plan is not None else set()
        for other in self.hosts[action.host].domains():
            if other.name == action.guest or other.name in moving or other.placement is None:
                continue
            clash = {c for pins in other.placement.vcpupin.values() if len(pins) == 1 for c in pins} & wanted
            if clash:
                return f"drift: {other.name} now runs on pCPUs {format_cpuset(clash)}, which {action.guest} would own"
        return ""

    def _bandwidth_host(self, action: Action) -> BandwidthControl | None:
        host = self.hosts[action.host]
        if callable(getattr(host, "cpu_bandwidth", None)) and callable(getattr(host, "set_cpu_bandwidth", None)):
            return host  # type: ignore[return-value]
        return None

    def _precheck_bandwidth(self, action: Action) -> Check:
        """Throttle/release: the guest runs here and its bandwidth is what the planner read."""
        assert action.guest is not None
        before, after = action.bandwidth_before, action.bandwidth_after
        assert before is not None and after is not None
        host = self._bandwidth_host(action)
        if host is None:
            return Check(False, f"host {action.host} cannot change a guest's CPU bandwidth "
                                "(its adapter has no CFS quota control)")
        info = _find(self.hosts[action.host], action.guest)
        if info is None:
            return Check(False, f"drift: {action.guest} is no longer on {action.host}")
        if info.state != "running":
            return Check(False, f"drift: {action.guest} is {info.state}, not running")
        live = host.cpu_bandwidth(action.guest)
        if live.same_limits(after):
            return Check(True, done=True)
        if not live.same_limits(before):
            return Check(False, f"drift: {action.guest} has CPU bandwidth {live.describe()}, the plan expected "
                                f"{before.describe()}")
        return Check(True)

    def _precheck_migrate(self, action: Action) -> Check:
        assert action.guest is not None and action.before is not None and action.target_host is not None
        source, destination = self.hosts[action.host], self.hosts[action.target_host]
        there = _find(destination, action.guest)
        here = _find(source, action.guest)
        if there is not None and here is None:
            if there.state == "running":
                return Check(True, done=True)
            return Check(False, f"drift: {action.guest} is on {action.target_host} but {there.state}")
        if here is None:
            return Check(False, f"drift: {action.guest} is on neither {action.host} nor {action.target_host}")
        if there is not None:
            return Check(False, f"a domain named {action.guest} already exists on {action.target_host}")
        if here.state != "running":
            return Check(False, f"drift: {action.guest} is {here.state}, not running")
        if here.placement is not None and not _pins_equal(here.placement, action.before):
            return Check(False, f"drift: {action.guest} is pinned {_pins_text(here.placement)}, the plan expected "
                                f"{_pins_text(action.before)}")
        topology = destination.topology()
        missing = sorted(action.before.pcpus - topology.online_cpus)
        if missing:
            return Check(False, f"{action.target_host} has no pCPUs {format_cpuset(missing)} that "
                                f"{action.guest} is pinned to (repin it first)")
        free = sum(node.free_kib for node in topology.nodes.values())
        if free and here.memory_kib > free:
            return Check(False, f"{action.target_host} has {free // 1024} MiB free, {action.guest} needs "
                                f"{here.memory_kib // 1024} MiB")
        return Check(True)

    def execute(self, action: Action) -> None:
        if action.kind == "probe":
            assert self.probe is not None
            seconds = float(action.parameters.get("seconds", 5.0))
            self.probe(action.host, seconds)
            return
        if action.kind in BANDWIDTH_KINDS:
            host = self._bandwidth_host(action)
            assert host is not None and action.guest is not None and action.bandwidth_after is not None
            host.set_cpu_bandwidth(action.guest, action.bandwidth_after)
            return
        assert action.guest is not None and action.after is not None
        if action.kind == "migrate":
            assert action.target_host is not None
            self.hosts[action.host].migrate(
                action.guest, self.hosts[action.target_host],
                bandwidth_mib_s=self.settings.migration_bandwidth_mib_s,
                timeout_s=self.settings.migration_timeout_s,
            )
            return
        host = self.hosts[action.host]
        if action.kind == "set_memory_nodes":
            host.set_memory_nodes(action.guest, action.after.memory_nodes)  # type: ignore[attr-defined]
            return
        self._apply_pins(host, action.guest, action.after)

    @staticmethod
    def _apply_pins(host: Hypervisor, guest: str, wanted: Placement) -> None:
        live = host.domain(guest).placement
        for vcpu, cpus in sorted(wanted.vcpupin.items()):
            if cpus and (live is None or live.vcpupin.get(vcpu) != cpus):
                host.pin_vcpu(guest, vcpu, cpus)
        if wanted.emulatorpin and (live is None or live.emulatorpin != wanted.emulatorpin):
            host.pin_emulator(guest, wanted.emulatorpin)

    def verify(self, action: Action) -> str:
        """What is not as the action promised (empty: verified)."""
        if action.kind == "probe":
            return ""
        if action.kind in BANDWIDTH_KINDS:
            host = self._bandwidth_host(action)
            assert host is not None and action.guest is not None and action.bandwidth_after is not None
            live = host.cpu_bandwidth(action.guest)
            if not live.same_limits(action.bandwidth_after):
                return f"CPU bandwidth read back as {live.describe()}, expected {action.bandwidth_after.describe()}"
            return ""
        assert action.guest is not None and action.after is not None
        if action.kind == "migrate":
            assert action.target_host is not None
            there = _find(self.hosts[action.target_host], action.guest)
            here = _find(self.hosts[action.host], action.guest)
            if there is None:
                return f"{action.guest} is not on {action.target_host}"
            if there.state != "running":
                return f"{action.guest} is {there.state} on {action.target_host}"
            if here is not None:
                return f"{action.guest} is still defined on {action.host} as well"
            return ""
        info = self.hosts[action.host].domain(action.guest)
        live = info.placement
        if live is None:
            return f"cannot read back the pinning of {action.guest}"
        if action.kind == "set_memory_nodes":
            if live.memory_nodes != action.after.memory_nodes:
                return (f"memory nodes read back as {format_cpuset(live.memory_nodes) or '-'}, "
                        f"expected {format_cpuset(action.after.memory_nodes)}")
            return ""
        if not _pins_equal(live, action.after):
            return f"pinning read back as {_pins_text(live)}, expected {_pins_text(action.after)}"
        return ""

    def revert(self, action: Action) -> None:
        """Put back `before` where it is not in place; safe to repeat."""
        if action.kind == "probe":
            return
        if action.kind in BANDWIDTH_KINDS:
            host = self._bandwidth_host(action)
            assert host is not None and action.guest is not None and action.bandwidth_before is not None
            if not host.cpu_bandwidth(action.guest).same_limits(action.bandwidth_before):
                host.set_cpu_bandwidth(action.guest, action.bandwidth_before)
            return
        assert action.guest is not None and action.before is not None
        if action.kind == "migrate":
            assert action.target_host is not None
            there = _find(self.hosts[action.target_host], action.guest)
            here = _find(self.hosts[action.host], action.guest)
            if here is None and there is not None and there.state == "running":
                self.hosts[action.target_host].migrate(
                    action.guest, self.hosts[action.host],
                    bandwidth_mib_s=self.settings.migration_bandwidth_mib_s,
                    timeout_s=self.settings.migration_timeout_s)
            return
        host = self.hosts[action.host]
        if action.kind == "set_memory_nodes":
            live = host.domain(action.guest).placement
            if live is not None and live.memory_nodes != action.before.memory_nodes and action.before.memory_nodes:
                host.set_memory_nodes(action.guest, action.before.memory_nodes)  # type: ignore[attr-defined]
            return
        self._apply_pins(host, action.guest, action.before)

    # ----- helpers ------------------------------------------------------------------------------------
    def _with_retries(self, action: Action, step: Callable[[], None]) -> None:
        attempt = 0
        while True:
            try:
                step()
                return
            except HypervisorError as exc:
                if not exc.retriable or attempt >= self.settings.retries:
                    raise
                if action.kind == "migrate" and self._arrived(action):
                    return  # the call failed but the guest did arrive
                attempt += 1
                log.warning("%s: retriable error (%s), attempt %d of %d in %.1f s", action.describe(), exc,
                            attempt + 1, self.settings.retries + 1, self.settings.retry_delay_s)
                self.clock.sleep(self.settings.retry_delay_s)

    def _arrived(self, action: Action) -> bool:
        try:
            return not self.verify(action)
        except HypervisorError:
            return False  # cannot tell (a host unreachable): report the migration's own error

    def _revert_quietly(self, action: Action) -> str:
        if action.kind == "migrate":
            return self._after_failed_migration(action)
        try:
            self.revert(action)
            return "its partial effect was reverted"
        except (HypervisorError, ActionFailed) as exc:
            return f"revert failed: {exc}"

    def _after_failed_migration(self, action: Action) -> str:
        """Where the guest is after a failed migration; the source is authoritative while it runs there."""
        assert action.guest is not None and action.target_host is not None
        try:
            here = _find(self.hosts[action.host], action.guest)
        except HypervisorError as exc:
            return f"the source cannot be read ({exc})"
        if here is not None and here.state == "running":
            try:
                cleaned = self._clean_failed_migration(action)
            except HypervisorError as exc:
                cleaned = f"{action.target_host} unreachable, not checked for a leftover copy ({exc})"
            return "the guest stays on the source" + (f"; {cleaned}" if cleaned else "")
        try:
            self.revert(action)
            return "migrated back to the source"
        except (HypervisorError, ActionFailed) as exc:
            return f"the guest is not running on the source and could not be brought back: {exc}"

    def _clean_failed_migration(self, action: Action) -> str:
        """A failed incoming copy on the destination, next to the guest still running on the
        source, is a leftover of the failed job: remove it (same UUID only)."""
        assert action.guest is not None and action.target_host is not None
        destination = self.hosts[action.target_host]
        here = _find(self.hosts[action.host], action.guest)
        there = _find(destination, action.guest)
        if here is None or there is None or here.state != "running" or there.state == "running":
            return ""
        if here.uuid != there.uuid:
            return ""
        removed = []
        for step in ("destroy", "undefine"):
            fn = getattr(destination, step, None)
            if callable(fn):
                try:
                    fn(action.guest)
                    removed.append(step)
                except HypervisorError:
                    pass
        return f"removed the half-migrated copy on {action.target_host} ({', '.join(removed) or 'could not'})"

    def _where(self, action: Action) -> str:
        assert action.guest is not None and action.target_host is not None
        places = []
        for name in (action.host, action.target_host):
            try:
                found = _find(self.hosts[name], action.guest)
            except HypervisorError as exc:
                places.append(f"{name}: unreachable ({exc})")
                continue
            places.append(f"{name}: {found.state if found else 'absent'}")
        return "now " + ", ".join(places)

    def _done_message(self, action: Action) -> str:
        if action.kind == "migrate":
            return f"running on {action.target_host}"
        if action.kind == "probe":
            return "probed"
        if action.kind in BANDWIDTH_KINDS:
            return "CPU bandwidth read back from the host"
        return "verified on the host"

    def _record_placement(self, plan: Plan, action: Action) -> None:
        assert action.after is not None
        after = action.after
        if action.kind == "migrate":
            after = replace(action.before, host=action.target_host) if action.before else after
        self._record(plan, [after])

    def _note_throttle(self, plan: Plan, action: Action, left: CpuBandwidth | None = None) -> None:
        """Keep the throttle ledger true: the bandwidth this action left (or is about to leave) the
        guest with, and why."""
        if self.throttles is None:
            return
        assert action.guest is not None
        if left is None:
            left = action.bandwidth_after if action.state == "succeeded" else action.bandwidth_before
        original = action.parameters.get("bandwidth_original") or action.parameters["bandwidth_before"]
        assert left is not None
        try:
            self.throttles.note(action.host, action.guest, left, CpuBandwidth.from_dict(original),
                                protects=str(action.parameters.get("protects") or ""), reason=action.reason,
                                plan_id=plan.id)
        except Exception as exc:  # noqa: BLE001 - the host is changed already; say the record is behind
            log.error("plan %s: throttle of %s not recorded: %s", plan.id, action.guest, exc)
            self._audit("throttle-record", "failed", action.host, action.guest,
                        f"{action.describe()}: not recorded ({exc}); `vmplacer reconcile` reports it",
                        self._detail(plan, action))

    def _record(self, plan: Plan, placements: list[Placement]) -> None:
        if self.placements is None:
            return
        batch = self._deferred + placements
        try:
            self.placements.apply(batch)
            self._deferred = []
        except ClaimConflict:
            self._deferred = batch  # a guest this plan moves later still holds a claim

    def _flush_deferred(self, plan: Plan, final: bool) -> None:
        if not self._deferred or self.placements is None:
            return
        try:
            self.placements.apply(self._deferred)
        except ClaimConflict as exc:
            self._audit("rebalance-record", "failed", None, None,
                        f"plan {plan.id}: placement rows not updated: {exc}", {"plan_id": plan.id})
        self._deferred = []

    def _store(self, plan: Plan, action: Action, started: bool = False, finished: bool = False) -> None:
        if self.plans is not None and plan.id is not None:
            try:
                self.plans.record_action(plan.id, action, started=started, finished=finished)
            except PlanError as exc:
                log.error("plan %s: could not record action %d: %s", plan.id, action.index, exc)

    def _detail(self, plan: Plan, action: Action) -> dict[str, Any]:
        return {
            "plan_id": plan.id,
            "action": action.index,
            "kind": action.kind,
            "target_host": action.target_host,
            "before": _change_text(action, "before"),
            "after": _change_text(action, "after"),
            "reason": action.reason,
            "predicted_gain": round(action.predicted_gain, 6),
            "state": action.state,
        }

    def _audit(self, name: str, outcome: str, host: str | None, guest: str | None, message: str,
               detail: dict[str, Any]) -> None:
        if self.auditor is None:
            return
        try:
            self.auditor.audit(action=name, outcome=outcome, host=host, guest=guest, message=message,
                               detail=detail)
        except Exception as exc:  # noqa: BLE001 - the audit log must never stop the executor
            log.error("audit log write failed (%s): %s", name, exc)


def _change_text(action: Action, side: str) -> str | None:
    """An action's before/after for the audit log: pinning, or CPU bandwidth for throttles."""
    if action.kind in BANDWIDTH_KINDS:
        bandwidth = action.bandwidth_before if side == "before" else action.bandwidth_after
        return bandwidth.describe() if bandwidth is not None else None
    placement = action.before if side == "before" else action.after
    return _pins_text(placement) if placement else None


def _find(host: Hypervisor, name: str) -> DomainInfo | None:
    try:
        return host.domain(name)
    except DomainGone:
        return None
