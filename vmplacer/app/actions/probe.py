"""Probe: a short profiling run on a host; it changes nothing, so there is nothing to undo."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from vmplacer.app.actions.base import ActionKind, Check
from vmplacer.core.placement import Placement
from vmplacer.core.plan import Action, Plan
from vmplacer.ports import Hypervisor


class Probe(ActionKind):
    kinds = ("probe",)

    def __init__(self, hosts: Mapping[str, Hypervisor], *, probe: Callable[[str, float], str] | None):
        super().__init__(hosts)
        self.probe = probe

    def precheck(self, action: Action, plan: Plan | None = None) -> Check:
        if self.probe is None:
            return Check(False, "no profiler is available to probe with")
        return Check(True)

    def execute(self, action: Action) -> None:
        assert self.probe is not None
        self.probe(action.host, float(action.parameters.get("seconds", 5.0)))

    def verify(self, action: Action) -> str:
        return ""

    def revert(self, action: Action) -> None:
        return

    def done(self, action: Action) -> str:
        return "probed"

    def placement_before(self, action: Action) -> Placement | None:
        return None
