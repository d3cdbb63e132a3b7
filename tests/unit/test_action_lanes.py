"""Lanes: each host in exactly one lane, migrations and multi-host trials tie their hosts,
dependencies stay together, and every lane keeps plan order."""

from __future__ import annotations

from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.lanes import action_lanes
from vmplacer.core.rebalance.plan import Action


def act(index: int, host: str, *, target: str | None = None, depends: tuple[int, ...] = ()) -> Action:
    guest = f"g{index}"
    before = Placement(guest, host, {0: frozenset({0})})
    after = Placement(guest, target or host, {0: frozenset({1})})
    return Action(index=index, kind="migrate" if target else "repin", host=host, guest=guest,
                  target_host=target, depends_on=depends, before=before, after=after)


def test_hosts_apart_run_apart_and_each_lane_keeps_plan_order():
    actions = [act(0, "a"), act(1, "b"), act(2, "a"), act(3, "c"), act(4, "b")]
    assert action_lanes(actions) == [[0, 2], [1, 4], [3]]


def test_a_migration_ties_its_two_hosts_and_whatever_runs_on_them():
    actions = [act(0, "a"), act(1, "b"), act(2, "c"), act(3, "a", target="c"), act(4, "c")]
    assert action_lanes(actions) == [[0, 2, 3, 4], [1]]


def test_a_trial_measuring_several_hosts_and_a_dependency_tie_them_too():
    actions = [act(0, "a"), act(1, "b"), act(2, "c"), act(3, "d", depends=(2,)), act(4, "a")]
    lanes = action_lanes(actions, hosts_of={4: ["a", "b"]})
    assert lanes == [[0, 1, 4], [2, 3]]
    every = sorted(i for lane in lanes for i in lane)
    assert every == [0, 1, 2, 3, 4]


def test_a_kept_trial_undone_by_the_plans_roll_back_is_the_roll_backs_not_the_trials():
    from vmplacer.core.rebalance.plan import ROLLED_BACK_WITH_THE_PLAN, Plan

    trial = {"trial": {"kind": "confirm", "from_key": "x", "to_key": "t"}}
    moved = act(0, "a").moved_to("running").moved_to("succeeded").moved_to("rolled_back", ROLLED_BACK_WITH_THE_PLAN)
    probe = Action(index=1, kind="probe", host="a", depends_on=(0,), parameters=trial)
    kept_then_undone = probe.moved_to("running").moved_to("succeeded").moved_to("rolled_back",
                                                                                 ROLLED_BACK_WITH_THE_PLAN)
    failed = act(2, "b").moved_to("running").moved_to("failed", "pinning refused")
    plan = Plan(actions=(moved, kept_then_undone, failed), hosts=("a", "b"))
    assert plan.undone_by_trials() == set()
    assert plan.outcome() == "rolled_back"
    # a trial's own undo is the plan's outcome, not a failure
    measured_worse = probe.moved_to("running").moved_to("rolled_back", "measured 0.6 → 0.5: undone")
    undone_by_trial = act(0, "a").moved_to("running").moved_to("succeeded").moved_to("rolled_back", "undone: measured")
    assert Plan(actions=(undone_by_trial, measured_worse), hosts=("a",)).outcome() == "succeeded"
