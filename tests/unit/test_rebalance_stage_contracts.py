"""Each stage of planning declares the parts of the draft it reads and writes, and keeps to it;
a stage that reads a part only a later stage writes would be a hidden dependency on the order."""

from __future__ import annotations

import pytest

from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
from vmplacer.core.rebalance.draft import Draft, PlanInputs, RunHistory
from vmplacer.core.rebalance.pipeline import SEARCH, StageContractError, StageSpec, run_pipeline
from vmplacer.core.rebalance.policy import PIPELINE, RebalanceSettings
from vmplacer.core.rebalance.search import start_search

from tests.unit.test_rebalance_explore_groups import pairs_model, two_hosts
from tests.unit.test_rebalance_pessimism import learned, spread_state


def searches() -> list[tuple[Draft, PlanInputs]]:
    """Drafts whose stages take moves, offer trials of one host and of small hosts together,
    and read what earlier runs measured."""
    solver = CpSatLayoutSolver()
    return [
        start_search(spread_state(), learned(sibling_rounds=5), RebalanceSettings(), 0.0, {}, None, solver),
        start_search(spread_state(), learned(sibling_rounds=0), RebalanceSettings(), 0.0, {}, None, solver),
        start_search(two_hosts(), pairs_model(), RebalanceSettings(), 0.0, {}, None, solver),
        start_search(two_hosts(), pairs_model(), RebalanceSettings(), 0.0, {}, None, solver,
                     history=RunHistory.of(tried={"h2": 1}, refuted=["h1"], held={"h1": "backed off"})),
    ]


def test_every_stage_reads_and_writes_only_what_it_declares():
    for (checked, inputs), (plain, same) in zip(searches(), searches()):
        run_pipeline(checked, inputs, PIPELINE, check=True)
        run_pipeline(plain, same, PIPELINE)
        assert [m.reason for m in checked.moves] == [m.reason for m in plain.moves], "checking changes nothing"
        assert checked.trials == plain.trials and checked.group_trials == plain.group_trials


def test_the_searches_reach_every_kind_of_offer():
    drafts = [run_pipeline(draft, inputs, PIPELINE) for draft, inputs in searches()]
    assert any(d.trials for d in drafts) and any(d.group_trials for d in drafts) and any(d.moves for d in drafts)


def test_what_a_stage_reads_of_another_stage_an_earlier_one_writes():
    written: set[str] = set(SEARCH)
    for stage in PIPELINE:
        found_elsewhere = set(stage.reads) - written - set(stage.writes)
        assert not found_elsewhere, f"stage {stage.name} reads {sorted(found_elsewhere)} before any stage writes it"
        written |= set(stage.writes)


def test_a_stage_that_breaks_its_declaration_is_named():
    draft, inputs = searches()[0]

    def offers_a_trial(d: Draft, i: PlanInputs) -> None:
        d.ruled.add("h")

    with pytest.raises(StageContractError, match=r"stage sneaky: writes \['ruled'\]"):
        run_pipeline(draft, inputs, [StageSpec("sneaky", offers_a_trial, reads=(), writes=("trials",))], check=True)

    def peeks(d: Draft, i: PlanInputs) -> None:
        assert not d.over_budget

    with pytest.raises(StageContractError, match=r"stage peeking: writes \[\] and reads \['over_budget'\]"):
        run_pipeline(draft, inputs, [StageSpec("peeking", peeks, reads=("trials",), writes=())], check=True)
    fills_a_memo = StageSpec("memo", lambda d, i: d.placement_cache.clear(), reads=(), writes=())
    run_pipeline(draft, inputs, [fills_a_memo], check=True)  # memos: any stage may fill them


def test_a_declaration_names_parts_of_the_draft():
    with pytest.raises(ValueError, match=r"stage s: \['trial'\] are not parts of the draft"):
        StageSpec("s", lambda d, i: None, reads=("trial",), writes=())
