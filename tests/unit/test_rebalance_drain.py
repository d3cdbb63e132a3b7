"""Draining a host for maintenance: every guest that may and can leave is migrated away."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.rebalance.policy import ClusterState, RebalanceInputError, describe_guest
from vmplacer.core.rebalance.drain import plan_drain
from vmplacer.core.topology.host import uniform_topology
from tests.unit.test_rebalance_policy import LINEAR, cluster, final_pins, pinned


def three_hosts():
    return {name: uniform_topology(nodes=1, cores_per_node=2, name=name) for name in ("h1", "h2", "h3")}


def test_every_guest_leaves_the_drained_host_and_nothing_moves_onto_it():
    state = cluster(three_hosts(), [pinned("a", "h1", [0]), pinned("b", "h1", [1]), pinned("c", "h2", [0])])
    plan = plan_drain(state, LINEAR, "h1", now=0.0)
    pins = final_pins(plan, state)
    assert {pins["a"][0], pins["b"][0]} <= {"h2", "h3"}
    assert pins["c"][0] == "h2"
    migrations = [a for a in plan.actions if a.kind == "migrate"]
    assert sorted(a.guest for a in migrations) == ["a", "b"]
    assert all(a.host == "h1" and a.target_host != "h1" and a.reason.startswith("drain h1: ") for a in migrations)
    assert not any((a.target_host or a.host) == "h1" and a.kind != "migrate" for a in plan.actions)
    assert plan.state == "proposed"
    assert plan.settings["notes"]["drain"] == "h1" and plan.settings["notes"]["stuck"] == []
    assert "the host will be empty" in plan.summary


def test_the_emptiest_destination_takes_the_guest_even_without_gain():
    """A drain is not judged by gain: an idle guest on an idle host still leaves."""
    state = cluster(three_hosts(), [pinned("a", "h1", [0]), pinned("x", "h2", [0]), pinned("y", "h2", [1])])
    plan = plan_drain(state, LINEAR, "h1", now=0.0)
    assert final_pins(plan, state)["a"][0] == "h3", "h3 is idle; h2's pCPUs are both taken"


def test_guests_labelled_to_stay_are_named_and_the_rest_still_leave():
    state = cluster(three_hosts(), [pinned("a", "h1", [0]), pinned("b", "h1", [1]), pinned("c", "h1", [1])],
                    labels={"a": {"rebalance": "off"}, "b": {"rebalance": "no-migrate"}})
    plan = plan_drain(state, LINEAR, "h1", now=0.0)
    assert [a.guest for a in plan.actions if a.kind == "migrate"] == ["c"]
    stuck = plan.settings["notes"]["stuck"]
    assert any(s.startswith("a: label rebalance=off") for s in stuck), stuck
    assert any(s.startswith("b: label rebalance=no-migrate") for s in stuck), stuck
    assert "2 guests stay" in plan.summary


def test_hosts_in_maintenance_take_nothing():
    topologies = three_hosts()
    state = cluster(topologies, [pinned("a", "h1", [0])])
    closed = {n: replace(h, accepts_migrations=False) if n != "h1" else h for n, h in state.hosts.items()}
    plan = plan_drain(ClusterState(closed, state.guests), LINEAR, "h1", now=0.0)
    assert plan.actions == () and plan.state == "empty"
    assert plan.settings["notes"]["stuck"] == ["a: no other host accepts migrations"]
    only_h3 = {**closed, "h3": replace(closed["h3"], accepts_migrations=True)}
    plan = plan_drain(ClusterState(only_h3, state.guests), LINEAR, "h1", now=0.0)
    assert [(a.guest, a.target_host) for a in plan.actions if a.kind == "migrate"] == [("a", "h3")]


def test_a_guest_whose_migration_never_converges_stays_with_the_reason():
    state = cluster(three_hosts(), [pinned("a", "h1", [0]), pinned("b", "h1", [1])],
                    labels={"a": {"dirty_mib_s": "5000"}})
    plan = plan_drain(state, LINEAR, "h1", now=0.0)
    assert [a.guest for a in plan.actions if a.kind == "migrate"] == ["b"]
    (stuck,) = plan.settings["notes"]["stuck"]
    assert stuck.startswith("a: fits on no other host") and "never converges" in stuck


def test_dedicated_guests_are_placed_by_the_engine_and_keep_anti_affinity():
    spec = GuestSpec(name="db", vcpus=2, memory_mib=512, cpu_policy="dedicated", anti_affinity=("db2",))
    spec2 = GuestSpec(name="db2", vcpus=1, memory_mib=512, cpu_policy="dedicated")
    topologies = three_hosts()
    db = replace(pinned("db", "h1", [0, 1]), exclusive_cpus=frozenset({0, 1}), dedicated=True)
    db2 = replace(pinned("db2", "h2", [0]), exclusive_cpus=frozenset({0}), dedicated=True)
    hosts = {n: cluster({n: t}, []).hosts[n] for n, t in topologies.items()}
    guests = {"db": describe_guest(db, spec=spec), "db2": describe_guest(db2, spec=spec2)}
    plan = plan_drain(ClusterState(hosts, guests), LINEAR, "h1", now=0.0)
    (migration,) = [a for a in plan.actions if a.kind == "migrate"]
    assert migration.target_host == "h3", "anti-affinity keeps db away from db2's host"
    assert final_pins(plan, ClusterState(hosts, guests))["db"][1] in ({0: frozenset({0}), 1: frozenset({1})},
                                                                       {0: frozenset({1}), 1: frozenset({0})})


def test_unknown_host_is_an_input_error():
    state = cluster(three_hosts(), [pinned("a", "h1", [0])])
    with pytest.raises(RebalanceInputError, match="'h9' to drain is not in the cluster state"):
        plan_drain(state, LINEAR, "h9")


def test_a_scope_drains_part_of_the_host():
    state = cluster(three_hosts(), [pinned("a", "h1", [0]), pinned("b", "h1", [1])])
    plan = plan_drain(state, LINEAR, "h1", now=0.0, scope=["b"])
    assert [a.guest for a in plan.actions if a.kind == "migrate"] == ["b"]
    assert plan.settings["notes"]["stuck"] == ["a: outside the scope of this drain"]


def test_anti_affinity_is_per_node_on_the_destination():
    """A peer on node 0 of the only destination leaves node 1 to the guest that refuses it."""
    from vmplacer.core.rebalance.policy import HostState

    topologies = {"h1": uniform_topology(nodes=1, cores_per_node=2, name="h1"),
                  "h2": uniform_topology(nodes=2, cores_per_node=2, name="h2")}
    node1 = sorted(topologies["h2"].cpus_in_node(1))
    spec = GuestSpec(name="a", vcpus=1, memory_mib=512, cpu_policy="dedicated", anti_affinity=("p",))
    a = replace(pinned("a", "h1", [0]), exclusive_cpus=frozenset({0}), dedicated=True)
    peer = pinned("p", "h2", [sorted(topologies["h2"].cpus_in_node(0))[0]])
    hosts = {n: HostState(n, t) for n, t in topologies.items()}
    state = ClusterState(hosts, {"a": describe_guest(a, spec=spec), "p": describe_guest(peer)})
    plan = plan_drain(state, LINEAR, "h1", now=0.0)
    (migration,) = [x for x in plan.actions if x.kind == "migrate"]
    assert migration.target_host == "h2"
    assert set(final_pins(plan, state)["a"][1][0]) <= set(node1)
    one_node = {**hosts, "h2": HostState("h2", uniform_topology(nodes=1, cores_per_node=2, name="h2"))}
    peer0 = pinned("p", "h2", [0])
    plan = plan_drain(ClusterState(one_node, {"a": describe_guest(a, spec=spec), "p": describe_guest(peer0)}),
                      LINEAR, "h1", now=0.0)
    assert plan.actions == () and plan.settings["notes"]["stuck"][0].startswith("a: fits on no other host")


def test_a_drain_is_never_put_to_a_measurement_that_could_bring_a_guest_back():
    from vmplacer.core.topology.host import DistanceClass
    from tests.unit.test_rebalance_policy import learned_model

    model = learned_model({("noisy", "victim", DistanceClass.SAME_LLC): 0.3}, ["noisy", "victim"])
    state = cluster(three_hosts(), [pinned("a", "h1", [0]), pinned("b", "h2", [0])],
                    labels={"a": {"workload": "noisy"}, "b": {"workload": "victim"}})
    plan = plan_drain(state, model, "h1", now=0.0)
    assert [a.guest for a in plan.actions if a.kind == "migrate"] == ["a"]
    assert not any(a.parameters.get("trial") for a in plan.actions), [a.describe() for a in plan.actions]
