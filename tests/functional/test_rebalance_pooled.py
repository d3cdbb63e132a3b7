"""Guests a plan floated over a pool, on simulated hosts with a real database (SQLite and
PostgreSQL): the next plan may pin them 1:1 again, unless someone changed their pinning since."""

from __future__ import annotations

import time

import pytest

from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlacementUpdates, SqlPlanStore
from vmplacer.lab.simulator import SimCluster
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.topology.host import uniform_topology


@pytest.fixture
def sim():
    """Three busy guests on pCPU 0 of a 4-pCPU host."""
    cluster = SimCluster(seed=1, noise=0.0)
    cluster.add_host("h1", uniform_topology(nodes=1, cores_per_node=4, name="h1"))
    for name in "abc":
        cluster.hosts["h1"].define_domain(name, workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    return cluster


def rebalancer(sim, db) -> Rebalancer:
    return Rebalancer(
        RebalancePorts(hosts=dict(sim.hosts), plans=SqlPlanStore(db), leases=SqlLeaseStore(db), clock=sim.clock,
                       wall=time.time, placements=SqlPlacementUpdates(db, {"h1": "sim://h1"}),
                       audit=SqlPlacementStore(db)),
        holder="run", settings=RebalanceSettings(cooldown_s=0.0, trials=False),
    )


def at(guest: str, cpus: set[int]) -> Placement:
    return Placement(guest, "h1", {0: frozenset(cpus)}, memory_kib=256 * 1024)


def pool_plan(db) -> Plan:
    """a, b and c float over pCPUs 0-1 (what an earlier plan chose when pCPUs 2-3 were taken)."""
    actions = tuple(Action(i, "repin", "h1", g, before=at(g, {0}), after=at(g, {0, 1}), reason="pool")
                    for i, g in enumerate("abc"))
    return SqlPlanStore(db).save(Plan(actions=actions, hosts=("h1",)))


def pins(sim, guest: str) -> frozenset[int]:
    return sim.hosts["h1"].domain(guest).placement.vcpupin[0]


def test_the_store_knows_where_its_latest_moves_left_each_guest(sim, db):
    run = rebalancer(sim, db)
    assert SqlPlanStore(db).last_placements(["a", "b", "c"]) == {}
    done = run.apply(pool_plan(db).id)
    assert [a.state for a in done.actions] == ["succeeded"] * 3
    last = SqlPlanStore(db).last_placements(["a", "b", "zz"])
    assert set(last) == {"a", "b"}
    assert last["a"].vcpupin == {0: frozenset({0, 1})} and last["a"].host == "h1"
    # a later move of a replaces the earlier one; one that failed does not count
    later = SqlPlanStore(db).save(Plan(actions=(
        Action(0, "repin", "h1", "a", before=at("a", {0, 1}), after=at("a", {3}), reason="pin"),), hosts=("h1",)))
    run.apply(later.id)
    assert SqlPlanStore(db).last_placements(["a"])["a"].vcpupin == {0: frozenset({3})}


def test_guests_a_plan_floated_are_pinned_again_but_not_one_someone_repinned_since(sim, db):
    run = rebalancer(sim, db)
    run.apply(pool_plan(db).id)
    # someone else widens c's pool by hand: c's pinning is no longer vmplacer's
    sim.hosts["h1"].pin_vcpu("c", 0, frozenset({0, 1, 2}))
    observed = run.observe(["h1"])
    assert run.pooled_by_plans(observed.state) == {"a", "b"}

    plan = run.make_plan(["h1"])
    after = {a.guest: a.after.vcpupin[0] for a in plan.actions if a.after is not None}
    assert set(after) == {"a", "b"}, plan.summary
    assert all(len(cpus) == 1 for cpus in after.values()) and after["a"] != after["b"]
    run.apply(plan.id)
    assert len(pins(sim, "a")) == 1 and len(pins(sim, "b")) == 1
    assert pins(sim, "c") == frozenset({0, 1, 2})
