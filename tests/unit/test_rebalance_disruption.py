"""The plan's disruption budget: trials per plan and the vCPUs they repin, those that promise most
per repin first; the others wait for later rounds, named."""

from __future__ import annotations

import random

import pytest

from tests.unit.test_rebalance_pessimism import GUESTS, learned, settings
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.disruption import trial_costs
from vmplacer.core.rebalance.policy import PIPELINE, ClusterState, HostState, describe_guest, plan_rebalance
from vmplacer.core.rebalance.search import run_stages, start_search
from vmplacer.core.topology.host import uniform_topology

MODEL = learned(sibling_rounds=5)


def fleet(hosts: int = 12, seed: int = 0) -> ClusterState:
    """Four-guest hosts, two in three spread (the model's doubtful layout becomes their trial), the
    others at random pCPUs."""
    rng = random.Random(seed)
    states, guests = {}, {}
    for h in range(hosts):
        name = f"h{h}"
        states[name] = HostState(name, uniform_topology(nodes=1, cores_per_node=4, threads_per_core=2, name=name))
        cpus = [0, 1, 2, 3] if h % 3 else rng.sample(range(8), 4)
        for cpu, key in zip(cpus, GUESTS):
            guest = f"{name}-{key}"
            guests[guest] = describe_guest(Placement(guest=guest, host=name, vcpupin={0: frozenset({cpu})},
                                                     memory_kib=1024), labels={"workload": key})
    return ClusterState(states, guests)


def plan_with(**budget):
    return plan_rebalance(fleet(), MODEL, settings(max_actions=100, allow_migration=False, **budget), now=0.0)


def trial_hosts(plan) -> set[str]:
    return {a.host for a in plan.actions
            if a.kind == "probe" and a.parameters.get("trial", {}).get("kind") == "explore"}


def trial_repins(plan) -> int:
    """vCPUs the plan's trial repins change (repins whose reason is a trial)."""
    return sum(sum(1 for v, cpus in a.after.vcpupin.items() if a.before.vcpupin.get(v) != cpus)
               for a in plan.actions if a.kind == "repin" and a.reason.startswith("trial of"))


def moves(plan) -> list[tuple]:
    """The plan's own moves (not its trials), as (guest, pins after)."""
    return [(a.guest, sorted((v, sorted(c)) for v, c in a.after.vcpupin.items())) for a in plan.actions
            if a.kind == "repin" and not a.reason.startswith("trial of")]


def offered_costs():
    """Every trial the stages offer before the budget is spent, costed."""
    draft, inputs = start_search(fleet(), MODEL, settings(max_actions=100, allow_migration=False), 0.0, {}, None)
    draft = run_stages(draft, inputs, [stage for stage in PIPELINE if stage.name != "disruption"])
    return trial_costs(draft)


def test_the_trials_that_promise_most_per_repin_are_kept_and_the_rest_named():
    offered = offered_costs()
    assert len(offered) >= 6 and len({c.promise for c in offered}) > 1
    unbounded = plan_with()
    assert trial_hosts(unbounded) == {c.label for c in offered}
    plan = plan_with(max_trials=3)
    best = sorted(offered, key=lambda c: (-c.promise, c.disruption, c.label))
    assert trial_hosts(plan) == {c.label for c in best[:3]}
    notes = plan.settings["notes"]
    assert notes["disruption"]["trials"] == 3 and notes["disruption"]["trials_waiting"] == len(offered) - 3
    waiting = {entry["trial"]: entry for entry in notes["over_budget"]}
    assert set(waiting) == {c.label for c in best[3:]}
    assert all(entry["why"] == "max_trials 3 per plan reached" and entry["repins"] > 0 for entry in waiting.values())
    assert f"{len(offered) - 3} trials left for later rounds by the disruption budget" in plan.summary
    assert moves(plan) == moves(unbounded)  # the budget holds trials back, never the plan's own moves


@pytest.mark.parametrize("seed", range(6))
def test_budgets_hold_on_random_budgets(seed):
    rng = random.Random(seed)
    max_trials, max_repins = rng.randint(0, 8), rng.randint(0, 20)
    offered = len(offered_costs())
    plan = plan_with(max_trials=max_trials, max_trial_repins=max_repins)
    spent = plan.settings["notes"]["disruption"]
    assert len(trial_hosts(plan)) == spent["trials"] <= max_trials
    assert trial_repins(plan) == spent["trial_repins"] <= max_repins
    assert spent["trials"] + spent["trials_waiting"] == offered


def test_expected_improvement_is_what_a_doubtful_trial_gains_on_average():
    from vmplacer.core.rebalance.disruption import expected_improvement

    assert expected_improvement(0.0, 1.0) == pytest.approx(0.3989422804, rel=1e-9)  # 1/√(2π)
    assert expected_improvement(0.2, 0.0) == 0.2 and expected_improvement(-0.2, 0.0) == 0.0
    assert expected_improvement(5.0, 0.1) == pytest.approx(5.0, rel=1e-9)
    # more doubt, more promise; a layout predicted worse still promises something while in doubt
    assert 0.0 < expected_improvement(-0.1, 0.05) < expected_improvement(-0.1, 0.2) < expected_improvement(0.1, 0.2)
