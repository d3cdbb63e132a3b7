"""The executor: the only code that changes a host on a plan's behalf.

It sequences, journals, audits and reverts; what each action kind does lives
in that kind's class (`vmplacer/app/apply/actions/`). Each action goes through one
contract:

* precheck — is the world still what the planner saw? A guest whose pinning,
  memory nodes or host changed since planning is skipped with the reason (a
  plan is never applied blindly); a guest already in the target state counts
  as done (applying a plan twice is harmless);
* execute — live repin (vCPUs, then emulator threads), live memory-node
  change, live migration (bandwidth limit, timeout → the job is aborted and
  the guest keeps running on the source), a throttle or release (CPU
  bandwidth, live and persistent), or a probe; retriable host errors are
  retried after a delay, fatal ones are not. A move of a guest that moved
  `rebalance.disruption.max_moves_per_guest_hour` times in the last hour
  (other plans may have moved it since this one was made) is skipped with
  the reason instead (`move_budget.py`: continuations, whole trials). A
  migration (and a migration back) waits for a slot while
  `rebalance.disruption.max_migrations_in_flight` run in this process
  (`migration_slots.py`; a host is in one migration at most, by its lane);
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
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

from vmplacer.app.apply.actions import ActionFailed, ActionKind, Check, action_kinds
from vmplacer.app.apply.actions.probe import OnVerdict, ProbeResult, trial_hosts
from vmplacer.app.apply.migration_slots import PROCESS_SLOTS, MigrationLimitError, MigrationSlots, migration_limit
from vmplacer.app.apply.move_budget import BudgetSettingError, MoveBudget, budget_limit
from vmplacer.app.host_fanout import for_each_host
from vmplacer.core.placement.bandwidth import CpuBandwidth
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.lanes import action_lanes
from vmplacer.core.rebalance.plan import ROLLED_BACK_WITH_THE_PLAN, Action, CancelRequest, Plan, PlanError
from vmplacer.core.rebalance.trial import Measured
from vmplacer.ports import (
    ClaimConflict,
    Clock,
    Hypervisor,
    HypervisorError,
    PlacementUpdates,
    PlanStore,
    ThrottleLedger,
)

__all__ = ["ActionFailed", "Auditor", "Check", "Executor", "ExecutorError", "ExecutorSettings"]

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
    # rebalance.disruption.max_moves_per_guest_hour when the plan is applied (0: no limit);
    # None: the plan's own, as it was planned (`move_budget.budget_limit`)
    max_moves_per_guest_hour: int | None = None
    # rebalance.disruption.max_migrations_in_flight when the plan is applied (0: no limit); None: the plan's own
    max_migrations_in_flight: int | None = None

    def __post_init__(self) -> None:
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"executor: field 'on_failure' must be one of {', '.join(ON_FAILURE)}, "
                             f"got {self.on_failure!r}")
        if self.retries < 0 or self.retry_delay_s < 0 or self.migration_timeout_s <= 0:
            raise ValueError("executor: retries and retry_delay_s must be >= 0, migration_timeout_s > 0")
        limit = self.max_moves_per_guest_hour
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise ValueError(f"executor: field 'max_moves_per_guest_hour' must be an integer >= 0, got {limit!r}")
        flight = self.max_migrations_in_flight
        if flight is not None and (not isinstance(flight, int) or isinstance(flight, bool) or flight < 0):
            raise ValueError(f"executor: field 'max_migrations_in_flight' must be an integer >= 0, got {flight!r}")


class Auditor(Protocol):
    """Anything with the PlacementStore's `audit(...)` method."""

    def audit(self, *, action: str, outcome: str, host: str | None, guest: str | None,
              message: str = "", detail: dict[str, object] | None = None) -> None: ...


class Executor:
    def __init__(
        self,
        hosts: Mapping[str, Hypervisor],
        *,
        clock: Clock,
        plans: PlanStore | None = None,
        audit: Auditor | None = None,
        placements: PlacementUpdates | None = None,
        probe: Callable[[str, float], ProbeResult] | None = None,
        keep_lease: Callable[[], bool] | None = None,
        settings: ExecutorSettings | None = None,
        throttles: ThrottleLedger | None = None,
        measurements: MutableMapping[str, Measured] | None = None,
        on_trial: OnVerdict | None = None,
        lanes: int = 1,
        wall: Callable[[], float] | None = None,
        migration_slots: MigrationSlots | None = None,
    ):
        """`lanes`: how many lanes of the plan (actions sharing no host, `core/rebalance/lanes`)
        run at once; 1 runs the plan's actions one after another. More needs hosts, stores and
        the probe callable safe to call from several threads (one thread per lane). `wall`:
        epoch seconds on the plan store's clock (the hour of the move budget), `time.time` unless
        given; `clock` is for sleeping and may be monotonic. `migration_slots`: the pool that
        bounds migrations in flight, the process's own unless given."""
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {lanes}")
        self.lanes = lanes
        self._records_lock = threading.Lock()  # the placement rows (`_deferred`) lanes share
        self.hosts = dict(hosts)
        self.clock = clock
        self.plans = plans
        self.auditor = audit
        self.placements = placements
        self.probe = probe
        self.keep_lease = keep_lease or (lambda: True)
        self.settings = settings or ExecutorSettings()
        self.throttles = throttles
        self.wall = wall or time.time
        self._budget = MoveBudget(None, 0, self.wall, stored=False)
        self.migration_slots = migration_slots or PROCESS_SLOTS
        self._migration_limit = 0
        self._deferred: list[Placement] = []
        self.kinds: dict[str, ActionKind] = action_kinds(
            self.hosts, probe=probe, migration_bandwidth_mib_s=self.settings.migration_bandwidth_mib_s,
            migration_timeout_s=self.settings.migration_timeout_s, measurements=measurements, on_verdict=on_trial)

    # ----- the plan ---------------------------------------------------------------------------
    def run(self, plan: Plan) -> Plan:
        """Run an approved plan; returns it in its final state (also stored, when stored)."""
        if plan.state != "approved":
            raise ExecutorError(f"plan {plan.id}: only an approved plan runs (it is {plan.state})")
        named = {a.host for a in plan.actions} | {a.target_host for a in plan.actions if a.target_host}
        missing = sorted(named - set(self.hosts))
        if missing:
            raise ExecutorError(f"plan {plan.id}: hosts {', '.join(missing)} are not configured")
        try:
            limit = budget_limit(plan, self.settings.max_moves_per_guest_hour)
            self._migration_limit = migration_limit(plan, self.settings.max_migrations_in_flight)
        except (BudgetSettingError, MigrationLimitError) as exc:
            raise ExecutorError(str(exc)) from None
        self._budget = MoveBudget(self.plans, limit, self.wall, stored=self.plans is not None and plan.id is not None)
        if self.plans is not None and plan.id is not None:
            if not self.plans.transition(plan.id, "approved", "running"):
                raise ExecutorError(f"plan {plan.id}: no longer approved (another run took it)")
        plan = plan.moved_to("running")
        self._deferred = []
        lanes = action_lanes(plan.actions, {a.index: trial_hosts(a) for a in plan.actions if a.kind == "probe"})
        if self.lanes == 1 or len(lanes) == 1:
            plan, cancel, failed = self._run_lane(plan, [a.index for a in plan.actions], None)
        else:
            plan, cancel, failed = self._run_lanes(plan, lanes)
        if cancel is not None:
            plan = self._skip_rest(plan, cancel.message)
        elif failed:
            plan = self._roll_back(plan)
        plan = self._skip_rest(plan, "the plan stopped before this action")
        self._flush_deferred(plan, final=True)
        broken = self._isolation_after(plan)
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
        if broken:
            message += "; isolation broken after the plan: " + "; ".join(broken)
        if self.plans is not None and plan.id is not None:
            self.plans.transition(plan.id, "running", outcome, message)
        self._audit("rebalance-plan", "ok" if outcome == "succeeded" else outcome, None, None,
                    f"plan {plan.id}: {outcome} ({message})", {"plan_id": plan.id})
        return plan.moved_to(outcome, message)

    def _run_lane(self, plan: Plan, indexes: list[int], stop: threading.Event | None
                  ) -> tuple[Plan, CancelRequest | None, bool]:
        """Run these actions in order: (the plan after them, a cancel request that stopped them,
        whether one failed and the plan is to be rolled back). `stop`: another lane stopped
        the plan; this one starts no further action."""
        for index in indexes:
            if stop is not None and stop.is_set():
                break
            if not plan.actions[index].final:
                cancel = self._cancel_request(plan)
                if cancel is not None:
                    return plan, cancel, False
            plan = self._run_action(plan, index)
            if plan.actions[index].state == "failed" and self.settings.on_failure == "rollback":
                return plan, None, True
        return plan, None, False

    def _run_lanes(self, plan: Plan, lanes: list[list[int]]) -> tuple[Plan, CancelRequest | None, bool]:
        """The lanes at once, `self.lanes` at a time: each runs on its own copy of the plan (it
        changes only its own actions, and its reverts undo only those), merged when all are
        done. A cancel or a failure to roll back for stops every lane before its next action;
        the rest of the plan is then skipped or rolled back as one."""
        stop = threading.Event()
        names = [f"lane {n}" for n in range(len(lanes))]
        by_name = dict(zip(names, lanes))

        def run(name: str) -> tuple[Plan, CancelRequest | None, bool]:
            result = self._run_lane(plan, by_name[name], stop)
            if result[1] is not None or result[2]:
                stop.set()
            return result

        merged, cancel, failed = plan, None, False
        for outcome in for_each_host(names, run, limit=self.lanes):
            if outcome.error is not None:
                raise outcome.error
            assert outcome.result is not None
            done, lane_cancel, lane_failed = outcome.result
            for index in by_name[outcome.host]:
                merged = merged.with_action(done.actions[index])
            cancel = cancel or lane_cancel
            failed = failed or lane_failed
        return merged, cancel, failed

    def _isolation_after(self, plan: Plan) -> list[str]:
        """The isolation invariant on every host the plan changed, read back from libvirt once the
        plan is over (between actions it may hold: a floater narrows after the guest that takes
        its pCPUs), for the plan's guests as users or owners; each violation audited."""
        from vmplacer.core.placement.isolation import isolation_violations

        changed = [a for a in plan.actions if a.state == "succeeded" and a.kind in ("repin", "migrate", "set_memory_nodes")]
        guests = {a.guest for a in changed}
        found: list[str] = []
        for name in sorted({a.target_host or a.host for a in changed}):
            host = self.hosts[name]
            try:
                layout = [d.placement for d in host.domains() if d.placement is not None]
                topology = host.topology()
                # emulator threads on reserved pCPUs are the host's emulator_cpus at work, which
                # this code does not know: only reconcile and `serve` judge those
                violations = isolation_violations(topology, layout, emulator_cpus=topology.reserved)
            except HypervisorError as exc:
                log.warning("isolation check after plan %s: host %s: %s", plan.id, name, exc)
                continue
            for violation in violations:
                if violation.guest in guests or violation.owner in guests:
                    found.append(violation.describe())
                    self._audit("isolation", "failed", name, violation.guest, violation.describe(),
                                {"plan_id": plan.id, **violation.to_dict()})
        return found

    def _cancel_request(self, plan: Plan) -> CancelRequest | None:
        """A request to stop this plan, read from the plan store (None without a stored plan)."""
        if self.plans is None or plan.id is None:
            return None
        try:
            return self.plans.cancel_requested(plan.id)
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
        kind = self.kinds[action.kind]
        try:
            check = kind.precheck(action, plan)
        except HypervisorError as exc:
            check = Check(False, f"cannot read the host: {exc}")
        if not check.ok:
            return self._finish(plan, action.moved_to("skipped", check.reason))
        if check.done:
            action = action.moved_to("running")
            return self._finish(plan, action.moved_to("succeeded", "already in the target state"), record=True)
        refused = self._budget.refusals(plan, action)
        if refused:  # the guest's moves this hour are spent (a trial's: none of its moves starts)
            for other in sorted(refused):
                plan = self._finish(plan, plan.actions[other].moved_to("skipped", refused[other]))
            return plan
        failure = ""
        with self._slot(action) as waited:  # a migration's clean-up after a failure holds its slot too
            if waited:  # other migrations ran meanwhile: the lease and the host are checked again
                if not self.keep_lease():
                    return self._finish(plan, action.moved_to(
                        "skipped", "the host lease was lost while waiting for a migration slot: stopping"))
                try:
                    check = kind.precheck(action, plan)
                except HypervisorError as exc:
                    check = Check(False, f"cannot read the host: {exc}")
                if not check.ok:
                    return self._finish(plan, action.moved_to("skipped", check.reason))
            action = action.moved_to("running")
            self._store(plan, action, started=True)
            if kind.ledger_intent_first:
                # Intent first (like the freeze journal): a process killed between libvirt's change and
                # the record must not leave a change nobody knows the reason of.
                self._note_throttle(plan, action, action.bandwidth_after)
            try:
                self._with_retries(kind, action)
                problem = kind.verify(action)
                if problem:
                    raise ActionFailed(f"verify: {problem}")
            except (ActionFailed, HypervisorError) as exc:
                failure = f"{exc}; {kind.after_failure(action)}"
        if failure:
            return self._finish(plan, action.moved_to("failed", failure))
        rejected = kind.rejected(action)
        if rejected:
            return self._undo_trial(plan, action, rejected)
        return self._finish(plan, action.moved_to("succeeded", kind.done(action)), record=True)

    def _undo_trial(self, plan: Plan, probe: Action, why: str) -> Plan:
        """A trial measured worse: undo the moves the probe follows (newest first); the probe
        ends rolled back, so whatever builds on it is skipped."""
        for index in sorted(probe.depends_on, reverse=True):
            plan = self._revert(plan, plan.actions[index], f"undone: {why}")
        return self._finish(plan, probe.moved_to("rolled_back", why))

    def _revert(self, plan: Plan, action: Action, message: str) -> Plan:
        """Undo one succeeded action (others are left as they are), keeping its placement row true;
        a revert that fails is audited and the action stays as it was."""
        if action.state != "succeeded":
            return plan
        kind = self.kinds[action.kind]
        try:
            with self._slot(action):  # undoing is always allowed: it waits for a slot, no more
                kind.revert(action)
        except (HypervisorError, ActionFailed) as exc:
            self._audit("rebalance-revert", "failed", action.host, action.guest,
                        f"{action.describe()}: could not revert: {exc}", self._detail(plan, action))
            return plan
        undone = action.moved_to("rolled_back", message)
        if action.kind == "migrate" and action.state == "succeeded":
            self._throttle_moved(plan, action, action.target_host, action.host)
        before = kind.placement_before(undone)
        if before is not None:
            self._record(plan, [before])
        return self._finish(plan, undone)

    def _finish(self, plan: Plan, action: Action, record: bool = False) -> Plan:
        kind = self.kinds[action.kind]
        if record and action.state == "succeeded" and action.after is not None:
            after = kind.placement_after(action)
            if after is not None:
                self._record(plan, [after])
        if kind.throttle_ledger and action.state in ("succeeded", "rolled_back", "failed"):
            self._note_throttle(plan, action)
        if action.kind == "migrate" and action.state == "succeeded":
            self._throttle_moved(plan, action, action.host, action.target_host)
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
            plan = self._revert(plan, action, ROLLED_BACK_WITH_THE_PLAN)
        return self._skip_rest(plan, "the plan was rolled back")

    # ----- helpers ------------------------------------------------------------------------------------
    def _slot(self, action: Action) -> AbstractContextManager[bool]:
        """A migration's slot among those in flight in this process (True: it had to wait for
        one); nothing for other actions."""
        if action.kind != "migrate":
            return nullcontext(False)
        return self.migration_slots.held(self._migration_limit)

    def _with_retries(self, kind: ActionKind, action: Action) -> None:
        attempt = 0
        while True:
            try:
                kind.execute(action)
                return
            except HypervisorError as exc:
                if not exc.retriable or attempt >= self.settings.retries:
                    raise
                if kind.arrived(action):
                    return  # the call failed but the change did happen
                attempt += 1
                log.warning("%s: retriable error (%s), attempt %d of %d in %.1f s", action.describe(), exc,
                            attempt + 1, self.settings.retries + 1, self.settings.retry_delay_s)
                self.clock.sleep(self.settings.retry_delay_s)

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

    def _throttle_moved(self, plan: Plan, action: Action, source: str | None, target: str | None) -> None:
        """A throttled guest that migrated keeps its limit (it is part of the domain): so does its record."""
        moved = getattr(self.throttles, "moved", None)
        if moved is None or action.guest is None or source is None or target is None:
            return
        try:
            moved(action.guest, source, target)
        except Exception as exc:  # noqa: BLE001 - the guest moved already; say the record is behind
            log.error("plan %s: throttle record of %s not moved to %s: %s", plan.id, action.guest, target, exc)
            self._audit("throttle-record", "failed", target, action.guest,
                        f"{action.describe()}: throttle record not moved ({exc}); `vmplacer reconcile` reports it",
                        self._detail(plan, action))

    def _record(self, plan: Plan, placements: list[Placement]) -> None:
        if self.placements is None:
            return
        with self._records_lock:
            self._record_held(self.placements, placements)

    def _record_held(self, store: PlacementUpdates, placements: list[Placement]) -> None:
        # one row per guest: its latest placement (a migration's arrival, then its repin there)
        batch = list({p.guest: p for p in self._deferred + placements}.values())
        try:
            store.apply(batch)
            self._deferred = []
        except ClaimConflict:
            self._deferred = batch  # a guest this plan moves later still holds a claim

    def _flush_deferred(self, plan: Plan, final: bool) -> None:
        with self._records_lock:
            self._flush_held(plan)

    def _flush_held(self, plan: Plan) -> None:
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
        kind = self.kinds[action.kind]
        return {
            "plan_id": plan.id,
            "action": action.index,
            "kind": action.kind,
            "target_host": action.target_host,
            "before": kind.change_text(action, "before"),
            "after": kind.change_text(action, "after"),
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
