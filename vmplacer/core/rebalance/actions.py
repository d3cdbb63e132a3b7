"""From a finished search to a Plan: the what-if state read for the planner, and the Plan built.

The planner (core/rebalance/planner.py) sequences the moves and trials the stages left; what
it needs to know of the what-if state — where each guest ends, how a guest is pinned on a host
as the placement engine writes it, which floating guests narrow, the model's confidence — it
reads through `DraftView`, the read-only view of the draft this module builds. Here too: the
predicted performance of each guest before and after, and the Plan record itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from vmplacer.core.placement.allocate import refresh_shared_pins
from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan, initial_state
from vmplacer.core.rebalance.layout import HostLayout, layout_confidences
from vmplacer.core.rebalance.draft import Draft, PlanInputs
from vmplacer.core.rebalance.offers import Pins
from vmplacer.core.rebalance.planner import PlannerInput, moved_in_order, plan_actions
from vmplacer.core.rebalance.whatif import current_placement, guest_confidence, perf_by_guest, relocated_cells
from vmplacer.core.rebalance.state import EXCLUSIVE, FLOATING


def _new_emulator(old: Placement, new_pins: Mapping[int, frozenset[int]], mode: str,
                  owned_by_others: frozenset[int]) -> frozenset[int]:
    """Emulator threads follow the vCPUs when they did (the engine's default), else stay."""
    old_cpus = old.pcpus
    new_cpus = frozenset().union(*new_pins.values()) if new_pins else frozenset()
    emulator = old.emulatorpin
    if emulator and (emulator == old_cpus or (mode == EXCLUSIVE and emulator <= old_cpus)):
        emulator = new_cpus
    if emulator & owned_by_others:
        emulator = (emulator - owned_by_others) or new_cpus
    return emulator


def _with_pins(draft: Draft, name: str, host: HostLayout, pins: Mapping[int, frozenset[int]],
               base: Placement) -> Placement:
    guest = draft.guests[name]
    emulator = _new_emulator(base, pins, guest.mode, host.owned_by_others(name))
    placement = replace(base, host=host.name, vcpupin=dict(sorted(pins.items())), emulatorpin=emulator)
    if guest.mode == EXCLUSIVE:
        cpus = frozenset().union(*pins.values())
        if guest.thread_policy == "isolate":
            cpus = frozenset().union(*(host.siblings[c] for c in cpus))
        placement = replace(placement, exclusive_cpus=cpus, dedicated=True)
    return placement


class DraftView:
    """The planner's read-only view of the draft (core/rebalance/planner.py `PlanView`)."""

    def __init__(self, draft: Draft, inputs: PlanInputs, confidence: Callable[[str, float], float]):
        self._draft, self._inputs, self._confidence = draft, inputs, confidence

    def original(self, guest: str) -> Placement:
        return self._inputs.original[guest].placement

    def current(self, guest: str) -> Placement:
        return current_placement(self._draft, guest)

    def final(self, guest: str) -> Placement:
        draft = self._draft
        original = self.original(guest)
        host = draft.hosts[draft.host_of[guest]]
        final = _with_pins(draft, guest, host, host.pins[guest], original)
        memory = draft.memory_nodes.get(guest)
        if memory is not None:
            final = replace(final, memory_nodes=memory, cells=relocated_cells(original, memory))
        engine = next((c.placement for m in draft.moves for c in m.changes
                       if c.guest == guest and c.placement is not None), None)
        if engine is not None and final.host == engine.host:
            final = replace(engine, vcpupin=dict(sorted(host.pins[guest].items())))
        return final

    def placed(self, guest: str, host: str, pins: Pins, base: Placement) -> Placement:
        return _with_pins(self._draft, guest, self._draft.hosts[host], pins, base)

    def host_of(self, guest: str) -> str:
        return self._draft.host_of[guest]

    def pins(self, guest: str) -> Pins:
        return self._draft.hosts[self._draft.host_of[guest]].pins[guest]

    def host_guests(self, host: str) -> Sequence[str]:
        return list(self._draft.hosts[host].guests)

    def weight(self, guest: str) -> float:
        return self._draft.guests[guest].weight

    def layout_guests(self, host: str) -> Sequence[str]:
        """The blind spread's guests (movable, pinned one vCPU to one pCPU), else every guest so pinned."""
        if host in self._draft.layout_guests:
            return self._draft.layout_guests[host]
        layout = self._draft.hosts[host]
        return sorted(g for g in layout.guests if layout.pins[g] and all(len(p) == 1 for p in layout.pins[g].values()))

    def confidence(self, guest: str) -> float:
        return self._confidence(guest, 0.0)

    def narrowed_floating(self, host: str) -> Sequence[tuple[str, Placement]]:
        draft = self._draft
        layout = draft.hosts[host]
        current = [self._current_for_refresh(n) for n in layout.guests]
        narrowed = []
        for before, after in zip(current, refresh_shared_pins(layout.topology, current)):
            if before == after or draft.guests[before.guest].mode != FLOATING:
                continue
            original = self.original(before.guest)
            narrowed.append((before.guest, replace(original, vcpupin=after.vcpupin, emulatorpin=after.emulatorpin)))
        return narrowed

    def _current_for_refresh(self, name: str) -> Placement:
        draft = self._draft
        guest = draft.guests[name]
        host = draft.hosts[draft.host_of[name]]
        placement = current_placement(draft, name)
        if guest.mode == EXCLUSIVE:
            return _with_pins(draft, name, host, host.pins[name], placement)
        return replace(placement, exclusive_cpus=frozenset(), dedicated=False)


def planner_input(draft: Draft, inputs: PlanInputs, model: InterferenceModel) -> PlannerInput:
    """What the planner is given of a finished search: the moves, the offered trials, the hosts a
    rule decided, and the view of the what-if state (confidences by `model`)."""
    if model is inputs.model:
        confidence = functools.partial(guest_confidence, draft, inputs)
    else:
        confidence = _confidences(draft, inputs, model).get
    return PlannerInput(
        moves=draft.moves, migrated=frozenset(draft.migrated), memory_moved=frozenset(draft.memory_moved),
        trials=draft.trials, group_trials=draft.group_trials, ruled=frozenset(draft.ruled),
        rests_on_data=not inputs.betas.empty, refuted=inputs.history.refuted, settings=inputs.settings,
        view=DraftView(draft, inputs, confidence))


def build_actions(draft: Draft, inputs: PlanInputs, model: InterferenceModel) -> tuple[list[Action], dict[str, dict[str, float]]]:
    """The plan's ordered actions (the planner's) and each affected guest's predicted performance
    before and after."""
    end_perf = perf_by_guest(draft)
    actions = plan_actions(planner_input(draft, inputs, model))
    moved = set(moved_in_order(draft.moves))
    affected = [n for n in draft.guests
                if n in moved or abs(inputs.start_perf.get(n, 0.0) - end_perf.get(n, 0.0)) > 1e-9]
    predicted = {name: {"before": inputs.start_perf.get(name, 0.0), "after": end_perf.get(name, 0.0)}
                 for name in sorted(affected)}
    return actions, predicted


def _confidences(draft: Draft, inputs: PlanInputs, model: InterferenceModel) -> dict[str, float]:
    """The model's confidence in each guest's prediction in the final layout."""
    result: dict[str, float] = {}
    for host in draft.hosts.values():
        result.update(layout_confidences(host, model, inputs.betas))
    return result


def plan_from_search(draft: Draft, inputs: PlanInputs, actions: list[Action], predicted: dict[str, dict[str, float]], *,
                     before: float, after: float, summary: str, notes: dict[str, Any],
                     now: float | None) -> Plan:
    """The Plan of a finished search: its actions, the objective before and after, and why."""
    return Plan(
        actions=tuple(actions),
        hosts=tuple(sorted(inputs.state.hosts)),
        state=initial_state(actions),
        objective_before=before,
        objective_after=after,
        predicted=predicted,
        summary=summary,
        settings={**inputs.settings.to_dict(), "notes": notes},
        created_at=now,
    )
