"""Exploration across small hosts solved together: a layout the model's prior fears across hosts
(each guest beside one it was never seen with) is never planned, and no single host's trial can
reach it; the hosts' joint optimistic layout becomes their trial, migrations included, measured
on both hosts at once and undone (migrated back) if they measure worse."""

from __future__ import annotations

import random
from dataclasses import replace

from vmplacer.core.rebalance.draft import RunHistory
from vmplacer.core.rebalance.offers import HostTrial, TrialKind
from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
from vmplacer.core.model.interference import Exposure, InterferenceModel, Observation
from vmplacer.core.rebalance.policy import RebalanceSettings, plan_rebalance
from vmplacer.core.rebalance.explore import offer_optimistic_groups
from vmplacer.core.rebalance.draft import Draft, PlanInputs
from vmplacer.core.rebalance.search import start_search
from vmplacer.core.topology.host import DistanceClass, uniform_topology

from tests.unit.test_rebalance_policy import cluster, pinned

LLC = DistanceClass.SAME_LLC


def pairs_model() -> InterferenceModel:
    """a and b cost each other 0.3 on one host, as do c and d, each pair seen 100 times; a was
    never seen beside c or d, nor b: the prior is all the model has about those pairs."""
    rng = random.Random(0)
    observations = [Observation(key, 0.7 + rng.gauss(0.0, 0.02), 1.0, (Exposure(other, LLC, 1.0),))
                    for _ in range(100) for key, other in (("a", "b"), ("b", "a"), ("c", "d"), ("d", "c"))]
    return InterferenceModel().fit(observations)


def two_hosts():
    """Two hosts of two cores: a and b on h1, c and d on h2."""
    def topo(name):
        return uniform_topology(nodes=1, cores_per_node=2, threads_per_core=1, name=name)

    return cluster({"h1": topo("h1"), "h2": topo("h2")},
                   [pinned("a", "h1", [0]), pinned("b", "h1", [1]), pinned("c", "h2", [0]), pinned("d", "h2", [1])])


def plan(**settings):
    return plan_rebalance(two_hosts(), pairs_model(), RebalanceSettings(**settings), now=0.0,
                          solver=CpSatLayoutSolver())


def explore_probes(p):
    return [a for a in p.actions if a.kind == "probe" and (a.parameters.get("trial") or {}).get("kind") == "explore"]


def test_small_hosts_try_together_the_layout_the_prior_fears_across_them():
    p = plan()
    assert not [a for a in p.actions if a.kind != "probe" and not a.parameters.get("tried")], \
        "the model itself does not plan the exchange: the pairs it needs were never seen"
    tried = [a for a in p.actions if a.parameters.get("tried") == "optimistic"]
    migrations = [a for a in tried if a.kind == "migrate"]
    assert migrations and {(a.host, a.target_host) for a in migrations} <= {("h1", "h2"), ("h2", "h1")}
    for migration in migrations:  # each pinned on arrival, after it
        arrival = next(a for a in tried if a.kind == "repin" and a.guest == migration.guest)
        assert arrival.host == migration.target_host and arrival.depends_on == (migration.index,)
    (probe,) = explore_probes(p)
    trial = probe.parameters["trial"]
    assert trial["hosts"] == ["h1", "h2"] and set(trial["weights"]) == {"a", "b", "c", "d"}, \
        "the guests that move are judged on both sides"
    assert set(probe.depends_on) == {a.index for a in tried}, "undone, every move of the trial goes back"
    baselines = [a for a in p.actions if a.parameters.get("baseline")]
    assert sorted(a.host for a in baselines) == ["h1", "h2"]
    assert max(a.index for a in baselines) < min(a.index for a in tried), "both hosts are measured first"
    final = {a.guest: a.after.host for a in tried}
    hosts = {"a": "h1", "b": "h1", "c": "h2", "d": "h2", **final}
    assert hosts["a"] != hosts["b"] and hosts["c"] != hosts["d"], f"the costly pairs are split: {hosts}"
    (offered,) = p.settings["notes"]["trials"]
    assert offered["host"] == "h1+h2" and offered["what"] == "optimistic"
    assert (offered["from_key"], offered["to_key"]) == (trial["from_key"], trial["to_key"])


def search(history: RunHistory = RunHistory(), **settings) -> tuple[Draft, PlanInputs]:
    return start_search(two_hosts(), pairs_model(), RebalanceSettings(**settings), 0.0, {}, None, CpSatLayoutSolver(),
                        history=history)


def offered(planning: tuple[Draft, PlanInputs]) -> bool:
    draft, inputs = planning
    offer_optimistic_groups(draft, inputs)
    return bool(draft.group_trials)


def test_no_joint_trial_when_switched_off_capped_measured_protected_or_the_plan_moves_there():
    assert offered(search())
    assert not offered(search(exploration=0.0))
    assert not offered(search(trials=False))
    assert not offered(search(allow_migration=False))
    for host in ("h1", "h2"):
        capped = search(RunHistory.of(tried={host: RebalanceSettings().trial_max}))
        assert not offered(capped), f"{host} has tried enough lately"
    first, inputs = search()
    offer_optimistic_groups(first, inputs)
    (trial,) = first.group_trials.values()
    for measured in ({(trial.from_key, trial.to_key)}, {(trial.to_key, trial.from_key)}):
        again = search(RunHistory.of(measured=measured))
        assert not offered(again), "a joint layout measured either way lately is not tried again"
    protected, inputs = search()
    protected.guests["c"] = replace(protected.guests["c"], protected=True)
    assert not offered((protected, inputs))
    busy, inputs = search()
    busy.touched.add("a")  # the plan moves a guest of h1: its moves are confirmed, not mixed with a trial
    assert not offered((busy, inputs))
    own, inputs = search()
    own.trials["h2"] = HostTrial("h2", {}, TrialKind.SPREAD, "blind spread", "x", "y", 0.0)
    assert not offered((own, inputs))


def test_a_host_in_a_joint_trial_gets_no_trial_of_its_own_and_memory_keys_name_the_hosts():
    p = plan()
    (probe,) = explore_probes(p)
    assert probe.host == "h1", "a joint trial counts against the first host's trial budget"
    assert all(a.parameters.get("tried") == "optimistic" for a in p.actions if a.parameters.get("tried"))
    measured = {(probe.parameters["trial"]["from_key"], probe.parameters["trial"]["to_key"])}
    again = plan_rebalance(two_hosts(), pairs_model(), RebalanceSettings(), now=0.0, solver=CpSatLayoutSolver(),
                           measured=measured)
    assert not [a for a in again.actions if a.kind == "migrate"], "the hosts stay where they measured better"
