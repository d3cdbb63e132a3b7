"""The planner on its own: stage outputs (moves, typed trial offers) in, ordered actions out,
with no draft behind it — only a view of where the moves leave each guest."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance import planner
from vmplacer.core.rebalance.offers import HostTrial, Pins, TrialKind
from vmplacer.core.rebalance.planner import PlannerInput, plan_actions
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.rebalance.trial import hosts_key, layout_key
from vmplacer.core.rebalance.whatif import new_move


def pins(cpu: int) -> dict[int, frozenset[int]]:
    return {0: frozenset({cpu})}


class View:
    """Where the moves leave each guest, as plain data."""

    def __init__(self, start: dict[str, tuple[str, int]], end: dict[str, tuple[str, int]]):
        self.start = {g: Placement(guest=g, host=h, vcpupin=pins(c), memory_kib=1024) for g, (h, c) in start.items()}
        self.end = {g: replace(self.start[g], host=h, vcpupin=pins(c)) for g, (h, c) in end.items()}

    def original(self, guest: str) -> Placement:
        return self.start[guest]

    def current(self, guest: str) -> Placement:
        return self.end[guest]

    def final(self, guest: str) -> Placement:
        return self.end[guest]

    def placed(self, guest: str, host: str, pins: Pins, base: Placement) -> Placement:
        return replace(base, host=host, vcpupin=dict(pins))

    def host_of(self, guest: str) -> str:
        return self.end[guest].host

    def pins(self, guest: str) -> Pins:
        return self.end[guest].vcpupin

    def host_guests(self, host: str) -> list[str]:
        return sorted(g for g, p in self.end.items() if p.host == host)

    def weight(self, guest: str) -> float:
        return 1.0

    def layout_guests(self, host: str) -> list[str]:
        return self.host_guests(host)

    def confidence(self, guest: str) -> float:
        return 1.0

    def narrowed_floating(self, host: str) -> list[tuple[str, Placement]]:
        return []


START = {"a": ("h1", 3), "b": ("h1", 0), "c": ("h3", 0)}
END = {"a": ("h2", 1), "b": ("h1", 2), "c": ("h3", 0)}


def given(view: View, *, rests_on_data: bool = False, trials: dict[str, HostTrial] | None = None) -> PlannerInput:
    repin_b = new_move("move", [("b", "h1", pins(2))])
    repin_b.gain, repin_b.linear_gain, repin_b.reason = 0.05, 0.05, "b off a busy pCPU"
    migrate_a = new_move("migrate", [("a", "h2", pins(1))])
    migrate_a.gain, migrate_a.linear_gain, migrate_a.reason = 0.1, 0.1, "a to an idle host"
    return PlannerInput(moves=[repin_b, migrate_a], migrated=frozenset({"a"}), memory_moved=frozenset(),
                        trials=trials or {}, group_trials={}, ruled=frozenset(), rests_on_data=rests_on_data,
                        refuted=frozenset(), settings=RebalanceSettings(), view=view)


def test_migrations_come_first_then_the_repin_on_arrival_then_the_other_moves():
    actions = plan_actions(given(View(START, END)))
    assert [(a.kind, a.guest, a.host) for a in actions] == [
        ("migrate", "a", "h1"), ("repin", "a", "h2"), ("repin", "b", "h1")]
    migrate, arrive, repin = actions
    assert migrate.target_host == "h2" and migrate.predicted_gain == 0.1 and migrate.reason == "a to an idle host"
    assert arrive.depends_on == (0,) and arrive.after is not None and arrive.after.vcpupin == pins(1)
    assert repin.predicted_gain == 0.05 and repin.after is not None and repin.after.vcpupin == pins(2)


def test_an_offered_trial_is_tried_after_a_baseline_probe_and_measured():
    view = View(START, END)
    offer = HostTrial("h3", {"c": pins(1)}, TrialKind.SPREAD, "blind spread",
                      layout_key("h3", {"c": pins(0)}), layout_key("h3", {"c": pins(1)}), 0.02)
    actions = plan_actions(given(view, trials={"h3": offer}))
    assert actions[0].kind == "probe" and actions[0].host == "h3" and actions[0].parameters["baseline"]
    assert all(a.index == i for i, a in enumerate(actions))
    tried = [a for a in actions if a.parameters.get("tried")]
    assert [(a.guest, a.parameters["tried"]) for a in tried] == [("c", "spread")]
    assert tried[0].after is not None and tried[0].after.vcpupin == pins(1)
    probe = actions[-1]
    assert probe.kind == "probe" and probe.depends_on == (tried[0].index,)
    assert probe.parameters["trial"]["kind"] == "explore"
    assert (probe.parameters["trial"]["from_key"], probe.parameters["trial"]["to_key"]) == (offer.from_key,
                                                                                            offer.to_key)


def test_migrations_that_rest_on_data_are_measured_on_both_hosts_together():
    actions = plan_actions(given(View(START, END), rests_on_data=True))
    baselines = [a.host for a in actions if a.parameters.get("baseline")]
    assert baselines == ["h1", "h2"]
    (joint,) = [a for a in actions if a.parameters.get("trial", {}).get("kind") == "confirm"]
    assert joint.parameters["trial"]["hosts"] == ["h1", "h2"]
    moves = {a.index for a in actions if a.kind in ("migrate", "repin")}
    assert set(joint.depends_on) == moves
    expected_from = hosts_key(["h1", "h2"], {"a": ("h1", pins(3)), "b": ("h1", pins(0))})
    expected_to = hosts_key(["h1", "h2"], {"a": ("h2", pins(1)), "b": ("h1", pins(2))})
    assert (joint.parameters["trial"]["from_key"], joint.parameters["trial"]["to_key"]) == (expected_from,
                                                                                            expected_to)


def test_the_planner_reads_no_draft():
    tree = ast.parse(Path(planner.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"vmplacer.core.rebalance.draft", "vmplacer.core.rebalance.search",
                           "vmplacer.core.rebalance.layout"}, imported
