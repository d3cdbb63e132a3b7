"""Live migration: the guest moves to another host (bandwidth limit, timeout → the job is
aborted and the guest keeps running on the source). The source is authoritative while the
guest still runs there."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from vmplacer.app.apply.actions.base import ActionFailed, ActionKind, Check, find, pins_equal, pins_text
from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.ports import Hypervisor, HypervisorError


class Migrate(ActionKind):
    kinds = ("migrate",)

    def __init__(self, hosts: Mapping[str, Hypervisor], *, bandwidth_mib_s: int | None, timeout_s: float):
        super().__init__(hosts)
        self.bandwidth_mib_s = bandwidth_mib_s  # None: libvirt's default (unlimited)
        self.timeout_s = timeout_s

    def done(self, action: Action) -> str:
        return f"running on {action.target_host}"

    def precheck(self, action: Action, plan: Plan | None = None) -> Check:
        assert action.guest is not None and action.before is not None and action.after is not None
        assert action.target_host is not None
        source, destination = self.hosts[action.host], self.hosts[action.target_host]
        there = find(destination, action.guest)
        here = find(source, action.guest)
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
        if here.placement is not None and not pins_equal(here.placement, action.before):
            return Check(False, f"drift: {action.guest} is pinned {pins_text(here.placement)}, the plan expected "
                                f"{pins_text(action.before)}")
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
        assert action.guest is not None and action.after is not None and action.target_host is not None
        self.hosts[action.host].migrate(action.guest, self.hosts[action.target_host],
                                        bandwidth_mib_s=self.bandwidth_mib_s, timeout_s=self.timeout_s)

    def verify(self, action: Action) -> str:
        assert action.guest is not None and action.after is not None and action.target_host is not None
        there = find(self.hosts[action.target_host], action.guest)
        here = find(self.hosts[action.host], action.guest)
        if there is None:
            return f"{action.guest} is not on {action.target_host}"
        if there.state != "running":
            return f"{action.guest} is {there.state} on {action.target_host}"
        if here is not None:
            return f"{action.guest} is still defined on {action.host} as well"
        return ""

    def revert(self, action: Action) -> None:
        """Migrate back when the guest runs only on the target."""
        assert action.guest is not None and action.before is not None and action.target_host is not None
        there = find(self.hosts[action.target_host], action.guest)
        here = find(self.hosts[action.host], action.guest)
        if here is None and there is not None and there.state == "running":
            self.hosts[action.target_host].migrate(action.guest, self.hosts[action.host],
                                                   bandwidth_mib_s=self.bandwidth_mib_s, timeout_s=self.timeout_s)

    def arrived(self, action: Action) -> bool:
        try:
            return not self.verify(action)
        except HypervisorError:
            return False  # cannot tell (a host unreachable): report the migration's own error

    def after_failure(self, action: Action) -> str:
        """Where the guest is after a failed migration, and what was cleaned up."""
        return f"{self._undo(action)}; {self._where(action)}"

    def placement_after(self, action: Action) -> Placement | None:
        if action.before is None or action.target_host is None:  # a valid migration names its target
            return action.after
        return replace(action.before, host=action.target_host)

    def _undo(self, action: Action) -> str:
        assert action.guest is not None and action.target_host is not None
        try:
            here = find(self.hosts[action.host], action.guest)
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
        here = find(self.hosts[action.host], action.guest)
        there = find(destination, action.guest)
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
                found = find(self.hosts[name], action.guest)
            except HypervisorError as exc:
                places.append(f"{name}: unreachable ({exc})")
                continue
            places.append(f"{name}: {found.state if found else 'absent'}")
        return "now " + ", ".join(places)
