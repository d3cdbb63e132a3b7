"""Memory move: a running guest's memory nodes changed live (libvirt NUMA tuning)."""

from __future__ import annotations

from vmplacer.app.apply.actions.base import ActionKind, Check, running_placement
from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.rebalance.plan import Action, Plan


class SetMemoryNodes(ActionKind):
    kinds = ("set_memory_nodes",)

    def precheck(self, action: Action, plan: Plan | None = None) -> Check:
        assert action.guest is not None and action.before is not None and action.after is not None
        host = self.hosts[action.host]
        live = running_placement(host, action)
        if isinstance(live, Check):
            return live
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

    def execute(self, action: Action) -> None:
        assert action.guest is not None and action.after is not None
        self.hosts[action.host].set_memory_nodes(action.guest, action.after.memory_nodes)  # type: ignore[attr-defined]

    def verify(self, action: Action) -> str:
        assert action.guest is not None and action.after is not None
        live = self.hosts[action.host].domain(action.guest).placement
        if live is None:
            return f"cannot read back the pinning of {action.guest}"
        if live.memory_nodes != action.after.memory_nodes:
            return (f"memory nodes read back as {format_cpuset(live.memory_nodes) or '-'}, "
                    f"expected {format_cpuset(action.after.memory_nodes)}")
        return ""

    def revert(self, action: Action) -> None:
        assert action.guest is not None and action.before is not None
        host = self.hosts[action.host]
        live = host.domain(action.guest).placement
        if live is not None and live.memory_nodes != action.before.memory_nodes and action.before.memory_nodes:
            host.set_memory_nodes(action.guest, action.before.memory_nodes)  # type: ignore[attr-defined]
