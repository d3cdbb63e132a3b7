"""A rebalancing plan: ordered actions with their reasons, predicted gains and costs.

Plans are data. A policy builds one on a what-if copy of the cluster with no
side effects; it is stored, shown as a diff, approved and only then applied by
the executor, which records each action's outcome here. States:

    plan:   proposed → approved → running → succeeded | failed | rolled_back | cancelled
            proposed | approved → cancelled    (at once: pending actions are skipped)
            empty                              (born final: no action was worth taking)
    action: pending → running → succeeded | failed | skipped | rolled_back

A plan with no actions is stored `empty`, not `proposed`: a periodic run that
finds nothing to do leaves a final record, not one waiting for approval. A
running plan is cancelled by a request the executor reads between actions
(never in the middle of one); what already succeeded stays applied.

An action's `before` is the state the planner saw (the executor's precheck
compares the live state with it, so a plan applied after the world changed
skips what drifted instead of acting blindly); `after` is the state the
action must produce (the executor verifies it by reading the host back).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vmplacer.core.placement.bandwidth import BandwidthError, CpuBandwidth
from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.placement.guest_placement import Placement, placement_from_dict

PLAN_STATES = ("proposed", "approved", "running", "succeeded", "failed", "rolled_back", "empty", "cancelled")
PLAN_FINAL_STATES = ("succeeded", "failed", "rolled_back", "empty", "cancelled")
PLAN_APPLIABLE_STATES = ("proposed", "approved")
PLAN_CANCELLABLE_STATES = ("proposed", "approved", "running")
_PLAN_TRANSITIONS = {
    "proposed": ("approved", "cancelled"),
    "approved": ("running", "cancelled"),
    "running": ("succeeded", "failed", "rolled_back", "cancelled"),
}

ACTION_KINDS = ("repin", "set_memory_nodes", "migrate", "probe", "throttle", "release")
# Actions that change a guest's CPU bandwidth, not its placement: their before/after live in
# `parameters` ("bandwidth_before"/"bandwidth_after", CpuBandwidth dicts).
BANDWIDTH_KINDS = ("throttle", "release")
ACTION_STATES = ("pending", "running", "succeeded", "failed", "skipped", "rolled_back")
ACTION_FINAL_STATES = ("succeeded", "failed", "skipped", "rolled_back")
_ACTION_TRANSITIONS = {
    "pending": ("running", "skipped"),
    "running": ("succeeded", "failed", "skipped", "rolled_back"),
    "succeeded": ("rolled_back",),  # a later failure may undo it
    "failed": ("rolled_back",),  # a half-applied action that was undone
}


class PlanError(ValueError):
    """A plan or action that is malformed, or a state change the lifecycle forbids."""


def initial_state(actions: Iterable[object]) -> str:
    """The state a new plan is stored in: `empty` (final) when it has no action, else `proposed`."""
    return "proposed" if any(True for _ in actions) else "empty"


def not_appliable(plan_id: int | None, state: str) -> str:
    """Why a plan in `state` cannot be applied (one wording wherever plans are applied)."""
    if state == "empty":
        return f"plan {plan_id} is empty: nothing worth doing was found, there is nothing to apply"
    return f"plan {plan_id} is {state}: only a proposed or approved plan can be applied"


@dataclass(frozen=True)
class CancelRequest:
    """Someone asked to stop a running plan; the executor honours it before its next action.

    `at` is epoch seconds (given by the store; the core keeps no clock).
    """

    by: str
    reason: str = ""
    at: float | None = None

    @property
    def message(self) -> str:
        """What every action left undone says, e.g. "cancelled by ops@h: maintenance window"."""
        return f"cancelled by {self.by}" + (f": {self.reason}" if self.reason else "")

    def to_dict(self) -> dict[str, Any]:
        return {"by": self.by, "reason": self.reason, "at": self.at}


# the message of each action the executor undoes when another action of the plan failed (the
# plan's roll-back), as opposed to a trial's own undo
ROLLED_BACK_WITH_THE_PLAN = "undone: another action of the plan failed"


@dataclass(frozen=True)
class Action:
    """One change to one host: a repin, a memory-node change, a live migration, or a probe.

    `predicted_gain` is the change of the plan's objective (weighted
    performance, in units of one VM at full speed) this action brings;
    `cost` holds what it costs (migration time and downtime, perf-seconds
    lost); `confidence` in [0, 1] says how much of the gain rests on observed
    data rather than on time sharing alone or on priors.
    """

    index: int
    kind: str
    host: str  # where the action runs (a migration's source)
    guest: str | None = None
    target_host: str | None = None  # migrations only
    before: Placement | None = None
    after: Placement | None = None
    reason: str = ""
    predicted_gain: float = 0.0
    cost: Mapping[str, float] = field(default_factory=dict)
    confidence: float = 1.0
    depends_on: tuple[int, ...] = ()
    parameters: Mapping[str, Any] = field(default_factory=dict)
    state: str = "pending"
    message: str = ""

    def __post_init__(self) -> None:
        where = f"action {self.index}"
        if self.kind not in ACTION_KINDS:
            raise PlanError(f"{where}: field 'kind' must be one of {', '.join(ACTION_KINDS)}, got {self.kind!r}")
        if self.state not in ACTION_STATES:
            raise PlanError(f"{where}: field 'state' must be one of {', '.join(ACTION_STATES)}, got {self.state!r}")
        if self.kind in BANDWIDTH_KINDS:
            self._check_bandwidth(where)
        elif self.kind != "probe":
            if not self.guest:
                raise PlanError(f"{where} ({self.kind}): field 'guest' is required")
            if self.before is None or self.after is None:
                raise PlanError(f"{where} ({self.kind} of {self.guest}): fields 'before' and 'after' are required")
            if self.before.guest != self.guest or self.after.guest != self.guest:
                raise PlanError(f"{where} ({self.kind} of {self.guest}): 'before'/'after' describe another guest")
        if self.kind == "migrate":
            if not self.target_host or self.target_host == self.host:
                raise PlanError(f"{where} (migrate of {self.guest}): field 'target_host' must name another host")
        elif self.target_host is not None:
            raise PlanError(f"{where} ({self.kind}): field 'target_host' applies to migrations only")
        if self.index in self.depends_on:
            raise PlanError(f"{where}: field 'depends_on' names the action itself")
        if not 0.0 <= self.confidence <= 1.0:
            raise PlanError(f"{where}: field 'confidence' must be in [0, 1], got {self.confidence!r}")

    def _check_bandwidth(self, where: str) -> None:
        if not self.guest:
            raise PlanError(f"{where} ({self.kind}): field 'guest' is required")
        if self.before is not None or self.after is not None:
            raise PlanError(f"{where} ({self.kind} of {self.guest}): fields 'before'/'after' describe placements; "
                            "a bandwidth change keeps its own in 'parameters'")
        for key in ("bandwidth_before", "bandwidth_after"):
            raw = self.parameters.get(key)
            if not isinstance(raw, Mapping):
                raise PlanError(f"{where} ({self.kind} of {self.guest}): parameters.{key} is required")
            try:
                CpuBandwidth.from_dict(raw)
            except (BandwidthError, TypeError, ValueError) as exc:
                raise PlanError(f"{where} ({self.kind} of {self.guest}): parameters.{key}: {exc}") from None
        before, after = self.bandwidth_before, self.bandwidth_after
        assert before is not None and after is not None
        if self.kind == "throttle" and not after.share < before.share:
            raise PlanError(f"{where} (throttle of {self.guest}): the share must go down, "
                            f"{before.share:.2f} ⇒ {after.share:.2f}")
        if self.kind == "release" and not after.share > before.share:
            raise PlanError(f"{where} (release of {self.guest}): the share must go up, "
                            f"{before.share:.2f} ⇒ {after.share:.2f}")

    @property
    def bandwidth_before(self) -> CpuBandwidth | None:
        raw = self.parameters.get("bandwidth_before")
        return CpuBandwidth.from_dict(raw) if isinstance(raw, Mapping) else None

    @property
    def bandwidth_after(self) -> CpuBandwidth | None:
        raw = self.parameters.get("bandwidth_after")
        return CpuBandwidth.from_dict(raw) if isinstance(raw, Mapping) else None

    @property
    def final(self) -> bool:
        return self.state in ACTION_FINAL_STATES

    def moved_to(self, state: str, message: str = "") -> Action:
        """The same action in `state`; refuses moves the lifecycle does not allow."""
        if state == self.state:
            return replace(self, message=message or self.message)
        if state not in _ACTION_TRANSITIONS.get(self.state, ()):
            raise PlanError(f"action {self.index} ({self.kind} of {self.guest or self.host}): "
                            f"cannot go from {self.state} to {state}")
        return replace(self, state=state, message=message)

    def describe(self) -> str:
        """One line: what changes, e.g. "repin g1 on h1: 0→0 ⇒ 0→1"."""
        if self.kind == "probe":
            return f"probe {self.host}"
        if self.kind in BANDWIDTH_KINDS:
            before, after = self.bandwidth_before, self.bandwidth_after
            assert before is not None and after is not None
            return f"{self.kind} {self.guest} on {self.host}: {before.describe()} ⇒ {after.describe()}"
        assert self.before is not None and self.after is not None
        if self.kind == "migrate":
            return f"migrate {self.guest}: {self.host} ⇒ {self.target_host}"
        if self.kind == "set_memory_nodes":
            return (f"memory of {self.guest} on {self.host}: nodes {format_cpuset(self.before.memory_nodes) or '-'}"
                    f" ⇒ {format_cpuset(self.after.memory_nodes) or '-'}")
        return (f"repin {self.guest} on {self.host}: {self.before.describe_pinning() or '-'}"
                f" ⇒ {self.after.describe_pinning() or '-'}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "host": self.host,
            "guest": self.guest,
            "target_host": self.target_host,
            "before": self.before.to_dict() if self.before else None,
            "after": self.after.to_dict() if self.after else None,
            "reason": self.reason,
            "predicted_gain": round(self.predicted_gain, 6),
            "cost": {k: round(float(v), 6) for k, v in self.cost.items()},
            "confidence": round(self.confidence, 4),
            "depends_on": list(self.depends_on),
            "parameters": dict(self.parameters),
            "state": self.state,
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Action:
        try:
            return cls(
                index=int(data["index"]),
                kind=str(data["kind"]),
                host=str(data["host"]),
                guest=None if data.get("guest") is None else str(data["guest"]),
                target_host=None if data.get("target_host") is None else str(data["target_host"]),
                before=placement_from_dict(data["before"]) if data.get("before") else None,
                after=placement_from_dict(data["after"]) if data.get("after") else None,
                reason=str(data.get("reason", "")),
                predicted_gain=float(data.get("predicted_gain", 0.0)),
                cost={str(k): float(v) for k, v in dict(data.get("cost") or {}).items()},
                confidence=float(data.get("confidence", 1.0)),
                depends_on=tuple(int(i) for i in data.get("depends_on", ())),
                parameters=dict(data.get("parameters") or {}),
                state=str(data.get("state", "pending")),
                message=str(data.get("message", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PlanError):
                raise
            raise PlanError(f"action {data.get('index', '?')}: malformed ({exc})") from None


@dataclass(frozen=True)
class PinDiff:
    """Before/after of one guest touched by a plan (the readable diff)."""

    guest: str
    host_before: str
    host_after: str
    pins_before: str
    pins_after: str
    perf_before: float | None = None
    perf_after: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "guest": self.guest,
            "host_before": self.host_before,
            "host_after": self.host_after,
            "pins_before": self.pins_before,
            "pins_after": self.pins_after,
            "perf_before": None if self.perf_before is None else round(self.perf_before, 4),
            "perf_after": None if self.perf_after is None else round(self.perf_after, 4),
        }


@dataclass(frozen=True)
class Plan:
    """Ordered actions plus what the planner predicted for the cluster as a whole.

    `objective_before/after` are the policy's objective (weighted performance
    with its fairness term); `predicted` maps each touched guest to its
    predicted performance before and after. `created_at` is epoch seconds,
    given by the caller (the core keeps no clock).
    """

    actions: tuple[Action, ...]
    hosts: tuple[str, ...]
    state: str = "proposed"
    id: int | None = None
    objective_before: float = 0.0
    objective_after: float = 0.0
    predicted: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    summary: str = ""
    settings: Mapping[str, Any] = field(default_factory=dict)
    created_at: float | None = None
    message: str = ""
    cancel_request: CancelRequest | None = None  # a running plan someone asked to stop

    def __post_init__(self) -> None:
        if self.state not in PLAN_STATES:
            raise PlanError(f"plan {self.id}: field 'state' must be one of {', '.join(PLAN_STATES)}, got {self.state!r}")
        if self.state == "empty" and self.actions:
            raise PlanError(f"plan {self.id}: state 'empty' means no actions, but it has {len(self.actions)}")
        indexes = [a.index for a in self.actions]
        if indexes != list(range(len(indexes))):
            raise PlanError(f"plan {self.id}: actions must be numbered 0..{len(indexes) - 1} in order, got {indexes}")
        for action in self.actions:
            for dep in action.depends_on:
                if not 0 <= dep < len(self.actions):
                    raise PlanError(f"plan {self.id}: action {action.index} depends on action {dep}, "
                                    "which the plan does not have")
                if dep >= action.index:
                    raise PlanError(f"plan {self.id}: action {action.index} depends on a later action {dep} "
                                    "(actions are ordered: dependencies come first)")

    # ----- lifecycle -----------------------------------------------------------------
    @property
    def predicted_gain(self) -> float:
        return self.objective_after - self.objective_before

    @property
    def final(self) -> bool:
        return self.state in PLAN_FINAL_STATES

    def moved_to(self, state: str, message: str = "") -> Plan:
        if state == self.state:
            return self
        if state not in _PLAN_TRANSITIONS.get(self.state, ()):
            raise PlanError(f"plan {self.id}: cannot go from {self.state} to {state}")
        return replace(self, state=state, message=message or self.message)

    def cancelled(self, message: str) -> Plan:
        """A proposed or approved plan stopped before it ran: every pending action skipped with `message`."""
        if self.state not in ("proposed", "approved"):
            raise PlanError(f"plan {self.id}: only a proposed or approved plan is cancelled at once "
                            f"(it is {self.state})")
        plan = self.moved_to("cancelled", message)
        for action in plan.actions:
            if action.state == "pending":
                plan = plan.with_action(action.moved_to("skipped", message))
        return plan

    def with_action(self, action: Action) -> Plan:
        actions = list(self.actions)
        actions[action.index] = action
        return replace(self, actions=tuple(actions))

    def outcome(self) -> str:
        """The final state the actions' states imply (the executor's verdict)."""
        states = [a.state for a in self.actions]
        if any(s in ("pending", "running") for s in states):
            raise PlanError(f"plan {self.id}: actions still pending or running, no outcome yet")
        undone = self.undone_by_trials()
        states = [a.state for a in self.actions if a.index not in undone]
        if not states:
            return "succeeded"  # every move was tried, measured and undone: the plan did its job
        if "rolled_back" in states and "succeeded" not in states:
            return "rolled_back"  # whatever was done has been undone
        if "failed" in states or "rolled_back" in states:
            return "failed"
        return "succeeded"

    def undone_by_trials(self) -> set[int]:
        """Indexes of trial probes whose measurement undid their moves, and of those moves: an
        outcome of the plan, not a failure (core/rebalance/trial.py). A probe the plan's roll-back
        undid (its trial had kept the moves) is the roll-back's, not the trial's."""
        undone: set[int] = set()
        for action in self.actions:
            if (action.kind == "probe" and action.parameters.get("trial") and action.state == "rolled_back"
                    and action.message != ROLLED_BACK_WITH_THE_PLAN):
                undone.add(action.index)
                undone.update(d for d in action.depends_on if self.actions[d].state == "rolled_back")
        return undone

    # ----- the readable diff ---------------------------------------------------------------
    def diff(self) -> list[PinDiff]:
        """Per guest touched: host and pinning before the plan and after every action."""
        first: dict[str, Placement] = {}
        last: dict[str, Placement] = {}
        for action in self.actions:
            if action.guest is None or action.before is None or action.after is None:
                continue
            if action.parameters.get("tried") and action.state != "succeeded":
                continue  # a trial's moves count only once they are kept
            first.setdefault(action.guest, action.before)
            last[action.guest] = action.after
        rows = []
        for guest in first:
            before, after = first[guest], last[guest]
            predicted = self.predicted.get(guest, {})
            rows.append(PinDiff(
                guest=guest,
                host_before=before.host,
                host_after=after.host,
                pins_before=_pins_text(before),
                pins_after=_pins_text(after),
                perf_before=predicted.get("before"),
                perf_after=predicted.get("after"),
            ))
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "hosts": list(self.hosts),
            "created_at": self.created_at,
            "objective_before": round(self.objective_before, 6),
            "objective_after": round(self.objective_after, 6),
            "predicted_gain": round(self.predicted_gain, 6),
            "predicted": {g: {k: round(float(v), 6) for k, v in p.items()} for g, p in self.predicted.items()},
            "summary": self.summary,
            "message": self.message,
            "cancel_request": self.cancel_request.to_dict() if self.cancel_request else None,
            "settings": dict(self.settings),
            "actions": [a.to_dict() for a in self.actions],
            "diff": [d.to_dict() for d in self.diff()],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        try:
            return cls(
                actions=tuple(Action.from_dict(a) for a in data.get("actions", ())),
                hosts=tuple(str(h) for h in data.get("hosts", ())),
                state=str(data.get("state", "proposed")),
                id=None if data.get("id") is None else int(data["id"]),
                objective_before=float(data.get("objective_before", 0.0)),
                objective_after=float(data.get("objective_after", 0.0)),
                predicted={str(g): {str(k): float(v) for k, v in dict(p).items()}
                           for g, p in dict(data.get("predicted") or {}).items()},
                summary=str(data.get("summary", "")),
                settings=dict(data.get("settings") or {}),
                created_at=None if data.get("created_at") is None else float(data["created_at"]),
                message=str(data.get("message", "")),
                cancel_request=_cancel_request_of(data.get("cancel_request")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PlanError):
                raise
            raise PlanError(f"plan {data.get('id')}: malformed ({exc})") from None


def _cancel_request_of(data: Mapping[str, Any] | None) -> CancelRequest | None:
    if not data:
        return None
    return CancelRequest(by=str(data["by"]), reason=str(data.get("reason") or ""),
                         at=None if data.get("at") is None else float(data["at"]))


def _pins_text(placement: Placement) -> str:
    return placement.describe_pinning() or "(unpinned)"


def ordered_dependencies(actions: Iterable[Action]) -> dict[int, set[int]]:
    """Action index -> every action it depends on, directly or through others."""
    direct = {a.index: set(a.depends_on) for a in actions}
    closure: dict[int, set[int]] = {}
    for index in sorted(direct):
        found: set[int] = set()
        for dep in direct[index]:
            found.add(dep)
            found |= closure.get(dep, set())
        closure[index] = found
    return closure
