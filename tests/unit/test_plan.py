"""Plans as data: validation, lifecycle, diff, round trip; and the migration cost model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from vmplacer.core.rebalance.migration_cost import migration_cost
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import (
    PLAN_CANCELLABLE_STATES,
    PLAN_FINAL_STATES,
    PLAN_STATES,
    Action,
    CancelRequest,
    Plan,
    PlanError,
    initial_state,
    not_appliable,
    ordered_dependencies,
)


def _p(guest: str, host: str, cpus: dict[int, set[int]], memory_nodes=()) -> Placement:
    return Placement(guest=guest, host=host, vcpupin={v: frozenset(c) for v, c in cpus.items()},
                     memory_nodes=frozenset(memory_nodes), memory_kib=1024 * 1024)


def _plan() -> Plan:
    a0 = _p("g1", "h1", {0: {0}})
    a1 = _p("g1", "h2", {0: {0}})
    a2 = _p("g1", "h2", {0: {3}})
    b0 = _p("g2", "h1", {0: {0}, 1: {1}}, memory_nodes=(0,))
    b1 = _p("g2", "h1", {0: {4}, 1: {5}}, memory_nodes=(0,))
    b2 = _p("g2", "h1", {0: {4}, 1: {5}}, memory_nodes=(1,))
    actions = (
        Action(0, "migrate", "h1", "g1", "h2", a0, a1, reason="crowded", predicted_gain=0.4,
               cost={"downtime_s": 0.1}, confidence=0.5),
        Action(1, "repin", "h2", "g1", None, a1, a2, reason="pin on arrival", depends_on=(0,)),
        Action(2, "repin", "h1", "g2", None, b0, b1, predicted_gain=0.2),
        Action(3, "set_memory_nodes", "h1", "g2", None, b1, b2, depends_on=(2,)),
        Action(4, "probe", "h2", depends_on=(0, 1), parameters={"seconds": 5.0}),
    )
    return Plan(actions, ("h1", "h2"), objective_before=1.0, objective_after=1.6,
                predicted={"g1": {"before": 0.5, "after": 1.0}}, created_at=1700000000.0)


def test_round_trip_keeps_everything():
    plan = _plan()
    again = Plan.from_dict(plan.to_dict())
    assert again == plan
    assert again.to_dict()["predicted_gain"] == pytest.approx(0.6)


def test_diff_shows_first_and_last_state_per_guest():
    rows = {row.guest: row for row in _plan().diff()}
    assert set(rows) == {"g1", "g2"}
    assert (rows["g1"].host_before, rows["g1"].host_after) == ("h1", "h2")
    assert (rows["g1"].pins_before, rows["g1"].pins_after) == ("0→0", "0→3")
    assert rows["g2"].pins_before == "0→0 1→1 mem→0"
    assert rows["g2"].pins_after == "0→4 1→5 mem→1"
    assert rows["g1"].perf_after == 1.0


def test_lifecycle_allows_only_the_documented_transitions():
    plan = _plan()
    with pytest.raises(PlanError, match="cannot go from proposed to running"):
        plan.moved_to("running")
    plan = plan.moved_to("approved").moved_to("running")
    with pytest.raises(PlanError, match="still pending"):
        plan.outcome()
    for action in plan.actions:
        plan = plan.with_action(action.moved_to("running").moved_to("succeeded"))
    assert plan.outcome() == "succeeded"
    failed = plan.with_action(plan.actions[1].moved_to("rolled_back"))
    assert failed.outcome() == "failed"  # some succeeded, one undone: not a clean rollback
    with pytest.raises(PlanError, match="cannot go from succeeded to running"):
        plan.actions[0].moved_to("running")
    finished = plan.moved_to("succeeded")
    with pytest.raises(PlanError, match="cannot go from succeeded"):
        finished.moved_to("running")


def test_all_undone_is_rolled_back_and_skips_alone_succeed():
    plan = _plan().moved_to("approved").moved_to("running")
    for action in plan.actions:
        plan = plan.with_action(action.moved_to("running").moved_to("rolled_back"))
    assert plan.outcome() == "rolled_back"
    skipped = _plan()
    for action in skipped.actions:
        skipped = skipped.with_action(action.moved_to("skipped", "drift"))
    assert skipped.outcome() == "succeeded"


@pytest.mark.parametrize("change, message", [
    (dict(kind="jump"), "field 'kind' must be one of"),
    (dict(guest=None), "field 'guest' is required"),
    (dict(target_host="h1"), "field 'target_host' must name another host"),
    (dict(depends_on=(0,)), "names the action itself"),
    (dict(confidence=1.5), "field 'confidence'"),
])
def test_bad_actions_name_the_field(change, message):
    base = dict(index=0, kind="migrate", host="h1", guest="g1", target_host="h2",
                before=_p("g1", "h1", {0: {0}}), after=_p("g1", "h2", {0: {0}}))
    with pytest.raises(PlanError, match=message):
        Action(**{**base, **change})


def test_plan_refuses_forward_dependencies_and_gaps():
    a = Action(0, "probe", "h1", depends_on=(1,))
    b = Action(1, "probe", "h1")
    with pytest.raises(PlanError, match="later action 1"):
        Plan((a, b), ("h1",))
    with pytest.raises(PlanError, match="numbered 0..0"):
        Plan((Action(3, "probe", "h1"),), ("h1",))


def test_dependency_closure():
    closure = ordered_dependencies(_plan().actions)
    assert closure[1] == {0}
    assert closure[4] == {0, 1}
    assert closure[3] == {2}


def test_migration_cost_converges_and_grows_with_memory_and_dirt():
    small = migration_cost(1024, 10, 1000)
    big = migration_cost(8192, 10, 1000)
    dirty = migration_cost(8192, 500, 1000)
    assert small.converges and big.converges and dirty.converges
    assert small.duration_s == pytest.approx(1024 / 1000 + small.downtime_s, rel=0.05)
    assert big.duration_s > small.duration_s
    assert dirty.rounds > big.rounds and dirty.duration_s > big.duration_s
    assert 0 < big.downtime_s <= 0.3 + 1e-9
    assert big.lost_perf_s == pytest.approx(big.downtime_s + 0.1 * (big.duration_s - big.downtime_s))


def test_migration_that_cannot_converge_is_refused():
    cost = migration_cost(4096, 1200, 1000)
    assert not cost.converges
    assert math.isinf(cost.lost_perf_s)
    assert "never converges" in cost.reason
    with pytest.raises(ValueError, match="bandwidth_mib_s"):
        migration_cost(1024, 1, 0)


def test_a_failure_whose_companions_were_undone_is_a_rollback():
    plan = _plan().moved_to("approved").moved_to("running")
    plan = plan.with_action(plan.actions[0].moved_to("running").moved_to("rolled_back"))
    plan = plan.with_action(plan.actions[1].moved_to("running").moved_to("failed"))
    for action in plan.actions[2:]:
        plan = plan.with_action(action.moved_to("skipped"))
    assert plan.outcome() == "rolled_back"


def test_final_states_include_empty_and_cancelled_and_have_no_way_out():
    assert set(PLAN_FINAL_STATES) == {"succeeded", "failed", "rolled_back", "empty", "cancelled"}
    assert set(PLAN_FINAL_STATES) < set(PLAN_STATES)
    for state in PLAN_FINAL_STATES:
        stuck = Plan((), ("h1",), state=state, id=7)
        assert stuck.final
        for target in PLAN_STATES:
            if target != state:
                with pytest.raises(PlanError, match=f"plan 7: cannot go from {state} to {target}"):
                    stuck.moved_to(target)
    for state in set(PLAN_STATES) - set(PLAN_FINAL_STATES):
        assert not Plan((), ("h1",), state=state).final


def test_a_plan_without_actions_is_born_empty_and_empty_means_no_actions():
    assert initial_state(()) == "empty"
    assert initial_state(_plan().actions) == "proposed"
    with pytest.raises(PlanError, match="plan 3: state 'empty' means no actions, but it has 5"):
        Plan(_plan().actions, ("h1", "h2"), state="empty", id=3)
    with pytest.raises(PlanError, match="cannot go from proposed to empty"):
        _plan().moved_to("empty")  # a plan is born empty, never becomes it
    assert "is empty: nothing worth doing was found" in not_appliable(3, "empty")
    assert "plan 3 is cancelled: only a proposed or approved plan can be applied" == not_appliable(3, "cancelled")


@pytest.mark.parametrize("start", ["proposed", "approved", "running"])
def test_cancel_is_allowed_until_the_plan_is_final(start):
    plan = _plan()
    for state in ("approved", "running")[:("proposed", "approved", "running").index(start)]:
        plan = plan.moved_to(state)
    assert plan.state == start and start in PLAN_CANCELLABLE_STATES
    assert plan.moved_to("cancelled", "stop").state == "cancelled"


def test_cancelled_before_running_skips_pending_actions_with_the_reason():
    request = CancelRequest(by="ops@desk", reason="maintenance", at=1.0)
    assert request.message == "cancelled by ops@desk: maintenance"
    assert CancelRequest(by="api:ci").message == "cancelled by api:ci"
    for plan in (_plan(), _plan().moved_to("approved")):
        done = plan.cancelled(request.message)
        assert done.state == "cancelled" and done.message == request.message
        assert [(a.state, a.message) for a in done.actions] == [("skipped", request.message)] * 5
    with pytest.raises(PlanError, match="only a proposed or approved plan is cancelled at once"):
        _plan().moved_to("approved").moved_to("running").cancelled("stop")  # running: the executor stops it


def test_a_cancel_request_survives_the_round_trip():
    plan = replace(_plan().moved_to("approved").moved_to("running"),
                   cancel_request=CancelRequest("ops", "window", 1700000100.0))
    again = Plan.from_dict(plan.to_dict())
    assert again.cancel_request == plan.cancel_request and again == plan
    assert plan.to_dict()["cancel_request"] == {"by": "ops", "reason": "window", "at": 1700000100.0}
    assert _plan().to_dict()["cancel_request"] is None
    with pytest.raises(PlanError, match="malformed"):
        Plan.from_dict({**plan.to_dict(), "cancel_request": {"reason": "no author"}})
