"""Where rebalance planning spends its time, measured on the caller's clock without
changing what it plans."""

from __future__ import annotations

import itertools

from vmplacer.core.stage_times import NO_STAGE_TIMES, StageTimes


def test_stages_add_up_on_the_given_clock():
    ticks = itertools.count()
    times = StageTimes(lambda: float(next(ticks)))
    with times.stage("climb"):
        pass
    with times.stage("climb"):
        pass
    with times.stage("actions"):
        pass
    assert times.seconds == {"climb": 2.0, "actions": 1.0}


def test_a_stage_that_raises_still_counts():
    ticks = itertools.count()
    times = StageTimes(lambda: float(next(ticks)))
    try:
        with times.stage("exact"):
            raise ValueError("solver gave up")
    except ValueError:
        pass
    assert times.seconds == {"exact": 1.0}


def test_without_a_clock_nothing_is_measured():
    with NO_STAGE_TIMES.stage("climb"):
        pass
    assert NO_STAGE_TIMES.seconds == {}


def test_timing_a_plan_names_its_stages_and_changes_nothing_it_decides():
    from vmplacer.core.placement.guest_placement import Placement
    from vmplacer.core.rebalance.policy import ClusterState, HostState, describe_guest, plan_rebalance
    from vmplacer.core.model.interference import InterferenceModel
    from vmplacer.core.topology.host import uniform_topology

    topologies = {h: uniform_topology(nodes=1, cores_per_node=4, name=h) for h in ("h1", "h2")}
    placements = [Placement(guest=f"{h}-{i}", host=h, vcpupin={0: frozenset({0})}, memory_kib=512 * 1024)
                  for h in topologies for i in range(3)]
    state = ClusterState({h: HostState(h, t) for h, t in topologies.items()},
                         {p.guest: describe_guest(p) for p in placements})
    ticks = itertools.count()
    times = StageTimes(lambda: float(next(ticks)))
    timed = plan_rebalance(state, InterferenceModel(), now=0.0, times=times)
    untimed = plan_rebalance(state, InterferenceModel(), now=0.0)
    assert timed == untimed and timed.actions
    assert {"setup", "climb", "pessimistic", "actions"} <= set(times.seconds)
    assert all(seconds > 0 for seconds in times.seconds.values())
