"""The cyclic collector is held off during a hold and comes back as it was."""

from __future__ import annotations

import gc
import threading

import pytest

from vmplacer.core.collector import collection_held


@pytest.fixture(autouse=True)
def _collector_restored():
    enabled = gc.isenabled()
    yield
    (gc.enable if enabled else gc.disable)()


def test_hold_pauses_and_restores_the_collector() -> None:
    gc.enable()
    with collection_held():
        assert not gc.isenabled()
        with collection_held():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer hold still runs
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    with collection_held():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_holds_in_threads_end_with_the_collector_as_it_was() -> None:
    gc.enable()
    inside, release = threading.Event(), threading.Event()

    def plan() -> None:
        with collection_held():
            inside.set()
            release.wait(5)

    worker = threading.Thread(target=plan)
    with collection_held():
        worker.start()
        assert inside.wait(5)
        assert not gc.isenabled()
    release.set()
    worker.join(5)
    assert gc.isenabled()


def test_a_plan_leaves_the_collector_as_it_was() -> None:
    from vmplacer.core.rebalance.policy import plan_rebalance
    from vmplacer.core.model.interference import InterferenceModel
    from vmplacer.core.placement.guest_placement import Placement
    from vmplacer.core.rebalance.state import ClusterState, HostState, describe_guest
    from vmplacer.core.topology.host import uniform_topology

    host = HostState("h", uniform_topology(nodes=1, cores_per_node=2, threads_per_core=1, name="h"))
    guests = {f"g{i}": describe_guest(Placement(guest=f"g{i}", host="h", vcpupin={0: frozenset({0})},
                                                memory_kib=1024 * 1024)) for i in range(2)}
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        plan = plan_rebalance(ClusterState({"h": host}, guests), InterferenceModel())
        assert plan.actions  # two guests on one pCPU of two: one moves
        assert gc.isenabled() is enabled


def test_an_error_inside_a_hold_restores_the_collector() -> None:
    gc.enable()
    with pytest.raises(RuntimeError):
        with collection_held():
            raise RuntimeError("boom")
    assert gc.isenabled()
