"""Throttle and release: a guest's CPU bandwidth (CFS quota) changed, live and persistent.
Their before/after are bandwidths, not placements; their outcomes go to the throttle ledger."""

from __future__ import annotations

from vmplacer.app.apply.actions.base import ActionKind, Check, find
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.ports import BandwidthControl


class Bandwidth(ActionKind):
    kinds: tuple[str, ...] = ("throttle", "release")
    throttle_ledger = True

    def precheck(self, action: Action, plan: Plan | None = None) -> Check:
        """The guest runs here and its bandwidth is what the planner read."""
        assert action.guest is not None
        before, after = action.bandwidth_before, action.bandwidth_after
        assert before is not None and after is not None
        host = self._host(action)
        if host is None:
            return Check(False, f"host {action.host} cannot change a guest's CPU bandwidth "
                                "(its adapter has no CFS quota control)")
        info = find(self.hosts[action.host], action.guest)
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

    def execute(self, action: Action) -> None:
        host = self._host(action)
        assert host is not None and action.guest is not None and action.bandwidth_after is not None
        host.set_cpu_bandwidth(action.guest, action.bandwidth_after)

    def verify(self, action: Action) -> str:
        host = self._host(action)
        assert host is not None and action.guest is not None and action.bandwidth_after is not None
        live = host.cpu_bandwidth(action.guest)
        if not live.same_limits(action.bandwidth_after):
            return f"CPU bandwidth read back as {live.describe()}, expected {action.bandwidth_after.describe()}"
        return ""

    def revert(self, action: Action) -> None:
        host = self._host(action)
        assert host is not None and action.guest is not None and action.bandwidth_before is not None
        if not host.cpu_bandwidth(action.guest).same_limits(action.bandwidth_before):
            host.set_cpu_bandwidth(action.guest, action.bandwidth_before)

    def done(self, action: Action) -> str:
        return "CPU bandwidth read back from the host"

    def placement_after(self, action: Action) -> Placement | None:
        return None

    def placement_before(self, action: Action) -> Placement | None:
        return None

    def change_text(self, action: Action, side: str) -> str | None:
        bandwidth = action.bandwidth_before if side == "before" else action.bandwidth_after
        return bandwidth.describe() if bandwidth is not None else None

    def _host(self, action: Action) -> BandwidthControl | None:
        host = self.hosts[action.host]
        if callable(getattr(host, "cpu_bandwidth", None)) and callable(getattr(host, "set_cpu_bandwidth", None)):
            return host  # type: ignore[return-value]
        return None


class Throttle(Bandwidth):
    """A throttle is in the ledger before the host changes: a process killed between the
    change and its record must not leave a throttle nobody knows the reason of."""

    kinds = ("throttle",)
    ledger_intent_first = True


class Release(Bandwidth):
    kinds = ("release",)
