"""The contract every plan action kind keeps, and what the kinds share.

An action kind says how its actions are checked against the live host
(`precheck`), applied (`execute`), read back (`verify`) and undone
(`revert`, idempotent: it reads the live state first). The executor only
sequences, journals, audits and reverts; what "done" means for a kind lives
in that kind's class, so a new kind is one new class, not a branch in four
places.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.ports import DomainGone, DomainInfo, Hypervisor, HypervisorError


@dataclass(frozen=True)
class Check:
    """A precheck's answer: go ahead, skip with a reason, or already done."""

    ok: bool
    reason: str = ""
    done: bool = False  # already in the target state


class ActionFailed(Exception):
    def __init__(self, message: str, retriable: bool = False):
        super().__init__(message)
        self.retriable = retriable


class ActionKind:
    """Base of the action kinds; `kinds` names the plan action kinds a class handles."""

    kinds: tuple[str, ...] = ()
    # Throttle ledger: outcomes of these actions are recorded with whom they protect;
    # `ledger_intent_first` records the intended bandwidth before the host is changed.
    throttle_ledger = False
    ledger_intent_first = False

    def __init__(self, hosts: Mapping[str, Hypervisor]):
        self.hosts = hosts

    def precheck(self, action: Action, plan: Plan | None = None) -> Check:
        raise NotImplementedError

    def execute(self, action: Action) -> None:
        raise NotImplementedError

    def verify(self, action: Action) -> str:
        """What is not as the action promised (empty: verified)."""
        raise NotImplementedError

    def revert(self, action: Action) -> None:
        """Put back `before` where it is not in place; safe to repeat."""
        raise NotImplementedError

    def done(self, action: Action) -> str:
        """The message of a succeeded action."""
        return "verified on the host"

    def rejected(self, action: Action) -> str | None:
        """Why the actions this one follows must be undone (a measured trial that went worse); None
        for every kind but a trial probe."""
        return None

    def arrived(self, action: Action) -> bool:
        """After a retriable error: did the change happen anyway (then no retry)?"""
        return False

    def after_failure(self, action: Action) -> str:
        """Undo a failed action's partial effect; says what became of it."""
        try:
            self.revert(action)
            return "its partial effect was reverted"
        except (HypervisorError, ActionFailed) as exc:
            return f"revert failed: {exc}"

    def placement_after(self, action: Action) -> Placement | None:
        """The placement row a succeeded action leaves (None: no row changes)."""
        return action.after

    def placement_before(self, action: Action) -> Placement | None:
        """The placement row an undone action puts back (None: no row changes)."""
        return action.before

    def change_text(self, action: Action, side: str) -> str | None:
        """The action's before/after for the audit log."""
        placement = action.before if side == "before" else action.after
        return pins_text(placement) if placement else None


def pins_equal(live: Placement, wanted: Placement) -> bool:
    """vCPU pins (those the wanted placement names) and, when named, the emulator pins."""
    for vcpu, cpus in wanted.vcpupin.items():
        if cpus and live.vcpupin.get(vcpu) != cpus:
            return False
    return not wanted.emulatorpin or live.emulatorpin == wanted.emulatorpin


def pins_text(placement: Placement) -> str:
    return placement.describe_pinning() or "(unpinned)"


def find(host: Hypervisor, name: str) -> DomainInfo | None:
    try:
        return host.domain(name)
    except DomainGone:
        return None


def running_placement(host: Hypervisor, action: Action) -> Placement | Check:
    """The live placement of the action's guest, or the Check that skips the action."""
    assert action.guest is not None
    try:
        info = host.domain(action.guest)
    except DomainGone:
        return Check(False, f"drift: {action.guest} is no longer on {action.host}")
    if info.state != "running":
        return Check(False, f"drift: {action.guest} is {info.state}, not running")
    if info.placement is None:
        return Check(False, f"cannot read the pinning of {action.guest}")
    return info.placement
