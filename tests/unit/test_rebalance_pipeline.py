"""The rebalance policy as a list of named stages over one draft: the order is listed once,
each stage is timed under its name, and what earlier runs did is read, never changed."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
from vmplacer.core.rebalance.draft import Draft, NamedStage, RunHistory
from vmplacer.core.rebalance.policy import PIPELINE, RebalanceSettings, plan_rebalance
from vmplacer.core.rebalance.search import RebalanceSearch
from vmplacer.core.stage_times import StageTimes

from tests.unit.test_rebalance_pessimism import learned, spread_state


def test_the_stages_run_in_the_listed_order():
    assert [stage.name for stage in PIPELINE] == [
        "climb", "exact", "climb", "pessimistic", "declined_layouts",
        "optimistic_groups", "optimistic_layouts"]


def test_each_stage_refines_the_search_in_turn_and_is_timed_under_its_name():
    ran: list[str] = []
    ticks = itertools.count()
    search = RebalanceSearch(spread_state(), learned(sibling_rounds=5), RebalanceSettings(), 0.0, {}, None)
    search.times = StageTimes(lambda: float(next(ticks)))
    stages = [NamedStage("first", lambda s: ran.append(f"first:{s is search}")),
              NamedStage("second", lambda s: ran.append("second")),
              NamedStage("first", lambda s: ran.append("first again"))]
    search.run(stages)
    assert ran == ["first:True", "second", "first again"]
    assert search.times.seconds == {"first": 2.0, "second": 1.0}  # a name listed twice adds up


def test_the_draft_is_typed_and_starts_empty():
    draft = RebalanceSearch(spread_state(), learned(sibling_rounds=5), RebalanceSettings(), 0.0, {}, None).draft
    assert isinstance(draft, Draft)
    assert all(not getattr(draft, f.name) for f in dataclasses.fields(Draft))


def test_the_run_history_is_read_not_changed():
    history = RunHistory.of(measured=[("a", "b")], tried={"h": 1}, pooled=["x"],
                            refuted=["h"], held={"h": "backed off"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        history.tried = {}  # type: ignore[misc]
    search = RebalanceSearch(spread_state(), learned(sibling_rounds=5), RebalanceSettings(), 0.0, {}, None,
                             CpSatLayoutSolver(), history=history)
    search.run(PIPELINE)
    assert history == RunHistory.of(measured=[("a", "b")], tried={"h": 1}, pooled=["x"],
                                    refuted=["h"], held={"h": "backed off"})
    assert search.history is history


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
