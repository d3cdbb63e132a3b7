"""Repin: a running guest's vCPUs (then its emulator threads) moved to other pCPUs, live."""

from __future__ import annotations

from vmplacer.app.apply.actions.base import ActionKind, Check, pins_equal, pins_text, running_placement
from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.ports import Hypervisor


class Repin(ActionKind):
    kinds = ("repin",)

    def precheck(self, action: Action, plan: Plan | None = None) -> Check:
        assert action.guest is not None and action.before is not None and action.after is not None
        live = running_placement(self.hosts[action.host], action)
        if isinstance(live, Check):
            return live
        if pins_equal(live, action.after) and live.exclusive_cpus == action.after.exclusive_cpus:
            return Check(True, done=True)
        if not pins_equal(live, action.before):
            return Check(False, f"drift: {action.guest} is pinned {pins_text(live)}, the plan expected "
                                f"{pins_text(action.before)}")
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

    def execute(self, action: Action) -> None:
        assert action.guest is not None and action.after is not None
        apply_pins(self.hosts[action.host], action.guest, action.after)

    def verify(self, action: Action) -> str:
        assert action.guest is not None and action.after is not None
        live = self.hosts[action.host].domain(action.guest).placement
        if live is None:
            return f"cannot read back the pinning of {action.guest}"
        if not pins_equal(live, action.after):
            return f"pinning read back as {pins_text(live)}, expected {pins_text(action.after)}"
        return ""

    def revert(self, action: Action) -> None:
        assert action.guest is not None and action.before is not None
        apply_pins(self.hosts[action.host], action.guest, action.before)


def apply_pins(host: Hypervisor, guest: str, wanted: Placement) -> None:
    """Pin what differs from `wanted`: vCPUs first, then the emulator threads, then what the
    guest owns exclusively (the domain's metadata, where a host keeps it: every later read of
    the host takes what a guest owns from there)."""
    live = host.domain(guest).placement
    for vcpu, cpus in sorted(wanted.vcpupin.items()):
        if cpus and (live is None or live.vcpupin.get(vcpu) != cpus):
            host.pin_vcpu(guest, vcpu, cpus)
    if wanted.emulatorpin and (live is None or live.emulatorpin != wanted.emulatorpin
                               or any(cpus != wanted.emulatorpin for cpus in live.iothreadpin.values())):
        host.pin_emulator(guest, wanted.emulatorpin)  # and the IOThreads, which float with it
    own = getattr(host, "set_exclusive_cpus", None)
    if own is not None and (live is None or live.exclusive_cpus != wanted.exclusive_cpus):
        own(guest, wanted.exclusive_cpus)
