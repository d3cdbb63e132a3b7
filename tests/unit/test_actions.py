"""Plan action kinds: one class per kind, each keeping precheck → execute → verify → revert
on its own, against simulated hosts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vmplacer.lab.simulator import SimCluster
from vmplacer.app.apply.actions import Check, action_kinds
from vmplacer.core.placement.bandwidth import CpuBandwidth, throttled_to
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import ACTION_KINDS, Action
from vmplacer.core.topology.host import uniform_topology


@pytest.fixture
def sim() -> SimCluster:
    cluster = SimCluster(seed=1, noise=0.0)
    for name in ("h1", "h2"):
        cluster.add_host(name, uniform_topology(nodes=1, cores_per_node=4, name=name))
    cluster.hosts["h1"].define_domain("a", workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    return cluster


def placement(host: str, cpu: int) -> Placement:
    return Placement("a", host, {0: frozenset({cpu})}, memory_kib=256 * 1024)


def test_every_plan_action_kind_has_exactly_one_class(sim):
    kinds = action_kinds(dict(sim.hosts))
    assert set(kinds) == set(ACTION_KINDS)
    for kind, handler in kinds.items():
        assert kind in handler.kinds


def test_repin_checks_applies_verifies_and_reverts(sim):
    repin = action_kinds(dict(sim.hosts))["repin"]
    action = Action(0, "repin", "h1", "a", None, placement("h1", 0), placement("h1", 2))
    assert repin.precheck(action) == Check(True)
    repin.execute(action)
    assert repin.verify(action) == ""
    assert repin.precheck(action) == Check(True, done=True)  # applying twice is harmless
    repin.revert(action)
    repin.revert(action)  # idempotent
    assert sim.hosts["h1"].domain("a").placement.vcpupin == {0: frozenset({0})}
    assert repin.verify(action) == "pinning read back as 0→0, expected 0→2"
    drifted = replace(action, before=placement("h1", 3))
    assert repin.precheck(drifted).reason.startswith("drift: a is pinned")


def test_migration_moves_reports_where_and_records_the_target_host(sim):
    migrate = action_kinds(dict(sim.hosts), migration_timeout_s=600)["migrate"]
    action = Action(0, "migrate", "h1", "a", "h2", placement("h1", 0), placement("h2", 0))
    assert migrate.precheck(action).ok
    migrate.execute(action)
    assert migrate.verify(action) == "" and migrate.arrived(action)
    assert migrate.done(action) == "running on h2"
    assert migrate.placement_after(action).host == "h2"
    migrate.revert(action)  # runs only on the target: migrated back
    assert sim.hosts["h1"].domain("a").state == "running"
    assert migrate.verify(action) == "a is not on h2"
    assert migrate.after_failure(action) == "the guest stays on the source; now h1: running, h2: absent"


def test_bandwidth_kinds_refuse_a_host_without_cfs_control_and_record_no_placement(sim):
    before, after = CpuBandwidth(), throttled_to(0.25)
    action = Action(0, "throttle", "h1", "a", parameters={"bandwidth_before": before.to_dict(),
                                                           "bandwidth_after": after.to_dict()})

    class NoQuota:
        def __init__(self, host):
            self.domain = host.domain

    throttle = action_kinds({"h1": NoQuota(sim.hosts["h1"])})["throttle"]
    assert throttle.precheck(action) == Check(False, "host h1 cannot change a guest's CPU bandwidth "
                                                     "(its adapter has no CFS quota control)")
    throttle = action_kinds(dict(sim.hosts))["throttle"]
    assert throttle.throttle_ledger and throttle.ledger_intent_first
    assert not action_kinds(dict(sim.hosts))["release"].ledger_intent_first
    throttle.execute(action)
    assert throttle.verify(action) == ""
    assert throttle.placement_after(action) is None and throttle.placement_before(action) is None
    assert throttle.change_text(action, "after") == after.describe()
    throttle.revert(action)
    assert sim.hosts["h1"].cpu_bandwidth("a").same_limits(before)


def test_probe_needs_a_profiler_and_changes_nothing(sim):
    action = Action(0, "probe", "h1", parameters={"seconds": 2.0})
    assert action_kinds(dict(sim.hosts))["probe"].precheck(action) == Check(
        False, "no profiler is available to probe with")
    seen: list[tuple[str, float]] = []
    probe = action_kinds(dict(sim.hosts), probe=lambda h, s: seen.append((h, s)) or "ok")["probe"]
    probe.execute(action)
    assert seen == [("h1", 2.0)] and probe.verify(action) == "" and probe.placement_before(action) is None
