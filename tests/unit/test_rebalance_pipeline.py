"""The rebalance policy as a list of named stages over one draft: the order is listed once,
each stage refines the draft it is given and is timed under its name, and what the stages
are given (the inputs, the history of earlier runs) is read, never changed."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
from vmplacer.core.rebalance.draft import Draft, NamedStage, PlanInputs, RunHistory
from vmplacer.core.rebalance.policy import PIPELINE, RebalanceSettings, plan_rebalance
from vmplacer.core.rebalance.search import run_stages, start_search
from vmplacer.core.stage_times import StageTimes

from tests.unit.test_rebalance_pessimism import learned, spread_state


def test_the_stages_run_in_the_listed_order():
    assert [stage.name for stage in PIPELINE] == [
        "climb", "exact", "climb", "pessimistic", "declined_layouts",
        "optimistic_groups", "optimistic_layouts", "disruption"]


def test_each_stage_refines_the_draft_in_turn_and_is_timed_under_its_name():
    ran: list[str] = []
    ticks = itertools.count()
    draft, inputs = start_search(spread_state(), learned(sibling_rounds=5), RebalanceSettings(), 0.0, {}, None,
                                 times=StageTimes(lambda: float(next(ticks))))
    stages = [NamedStage("first", lambda d, i: ran.append(f"first:{d is draft and i is inputs}")),
              NamedStage("second", lambda d, i: ran.append("second")),
              NamedStage("first", lambda d, i: ran.append("first again"))]
    assert run_stages(draft, inputs, stages) is draft
    assert ran == ["first:True", "second", "first again"]
    assert inputs.times.seconds == {"first": 2.0, "second": 1.0}  # a name listed twice adds up


def test_the_draft_starts_with_every_host_as_it_is_and_nothing_decided():
    state = spread_state()
    draft, inputs = start_search(state, learned(sibling_rounds=5), RebalanceSettings(), 0.0, {}, None)
    assert isinstance(draft, Draft) and isinstance(inputs, PlanInputs)
    assert set(draft.hosts) == set(state.hosts)
    assert {n: {v: set(p) for v, p in draft.hosts[g.host].pins[n].items()} for n, g in state.guests.items()} == {
        n: {v: set(p) for v, p in g.placement.vcpupin.items()} for n, g in state.guests.items()}
    assert draft.perf_now == inputs.start_perf
    layout = {"hosts", "guests", "host_of", "memory_nodes", "perf_now", "placement_cache", "confidence_cache"}
    assert all(not getattr(draft, f.name) for f in dataclasses.fields(Draft) if f.name not in layout)


def test_the_inputs_are_frozen():
    _, inputs = start_search(spread_state(), learned(sibling_rounds=5), RebalanceSettings(), 0.0, {}, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.settings = RebalanceSettings()  # type: ignore[misc]


def test_the_run_history_is_read_not_changed():
    history = RunHistory.of(measured=[("a", "b")], tried={"h": 1}, pooled=["x"],
                            refuted=["h"], held={"h": "backed off"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        history.tried = {}  # type: ignore[misc]
    draft, inputs = start_search(spread_state(), learned(sibling_rounds=5), RebalanceSettings(), 0.0, {}, None,
                                 CpSatLayoutSolver(), history=history)
    run_stages(draft, inputs, PIPELINE)
    assert history == RunHistory.of(measured=[("a", "b")], tried={"h": 1}, pooled=["x"],
                                    refuted=["h"], held={"h": "backed off"})
    assert inputs.history is history


def test_a_plan_reads_the_history_it_is_given():
    """Without history the plan moves the host to the model's layout and offers the blind spread
    as its trial; once a trial measured the spread better, the plan takes the spread and offers
    no trial of it again."""
    state, model = spread_state(), learned(sibling_rounds=5)
    fresh = plan_rebalance(state, model, RebalanceSettings(), now=0.0, solver=CpSatLayoutSolver())
    (trial,) = fresh.settings["notes"]["trials"]
    assert trial["host"] == "h" and trial["what"] == "spread"
    spread_won = {(trial["to_key"], trial["from_key"])}
    again = plan_rebalance(state, model, RebalanceSettings(), now=0.0, solver=CpSatLayoutSolver(),
                           measured=spread_won)
    assert not any(t["what"] == "spread" for t in again.settings["notes"]["trials"])
    report = next(r for r in again.settings["notes"]["pessimistic"] if r["host"] == "h")
    assert report["measured"] == "the spread measured better than the model's layout"
