"""Exploration's second look: a host whose explore trials all measured worse tries, within
`step_trials` more, the single step (one move or one swap) likeliest to measure better."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vmplacer.core.rebalance.draft import RunHistory
from vmplacer.core.rebalance.policy import RebalanceInputError, RebalanceSettings, plan_rebalance
from vmplacer.core.rebalance.pessimistic import compare_layout
from vmplacer.core.rebalance.search import RebalanceSearch
from vmplacer.core.rebalance.steps import offer_likeliest_steps, pinned_layout, ranked_steps, single_steps
from vmplacer.core.rebalance.trial import layout_key

from tests.unit.test_rebalance_explore import search
from tests.unit.test_rebalance_pessimism import learned, settings, spread_state


def changed_vcpus(here, layout) -> list[tuple[str, int]]:
    return [(g, v) for g, pins in layout.items() for v, cpus in pins.items() if here[g][v] != cpus]


def test_single_steps_are_every_move_and_every_swap_of_one_vcpu():
    """Four one-vCPU guests on pCPUs 0-3 of 8: each may move to 7 pCPUs (28 moves), and each pair
    may swap (6 swaps); a swap exchanges exactly the two pCPUs."""
    s = search(sibling_rounds=0)
    host = s.hosts["h"]
    here = pinned_layout(s, host)
    assert sorted(here) == ["a", "b", "c", "d"]
    steps = single_steps(host, here)
    assert len(steps) == 4 * 7 + 6
    assert len({layout_key("h", step) for step in steps}) == len(steps), "no step listed twice"
    for step in steps:
        changed = changed_vcpus(here, step)
        assert len(changed) in (1, 2)
        if len(changed) == 2:
            (a, va), (b, vb) = changed
            assert step[a][va] == here[b][vb] and step[b][vb] == here[a][va]


def test_steps_are_ranked_by_how_likely_they_measure_better_not_by_how_much_they_could_gain():
    """With the sibling pairs well measured, the step the model is surest of comes first, ahead of
    steps it predicts larger gains for with more doubt; every step listed is one the optimist takes."""
    s = search(sibling_rounds=40)
    host = s.hosts["h"]
    ranked = ranked_steps(s, host, pinned_layout(s, host))
    assert ranked
    bar = s.min_gain_on(["h"])
    for z, gain, layout in ranked:
        advantage_here, spread, _ = compare_layout(s, host, layout, "step")
        assert gain == pytest.approx(-advantage_here)
        assert z == pytest.approx(gain / spread)
        assert gain + s.settings.exploration * spread >= bar
    assert [z for z, _, _ in ranked] == sorted((z for z, _, _ in ranked), reverse=True)
    assert ranked[0][1] < max(gain for _, gain, _ in ranked), "the likeliest step is not the most hopeful here"


def offered(s: RebalanceSearch) -> dict | None:
    offer_likeliest_steps(s)
    return s.draft.trials.get("h")


def spent(sibling_rounds: int = 40, **overrides) -> RebalanceSearch:
    """A host that tried `trial_max` layouts and kept none."""
    s = search(sibling_rounds=sibling_rounds, **overrides)
    s.history = RunHistory.of(tried={"h": s.settings.trial_max})
    return s


def test_a_host_whose_exploration_found_nothing_tries_its_likeliest_step():
    s = spent()
    trial = offered(s)
    assert trial is not None and trial["what"] == "step"
    host = s.hosts["h"]
    here = pinned_layout(s, host)
    z, gain, best = ranked_steps(s, host, here)[0]
    assert trial["layout"] == best
    assert (trial["from_key"], trial["to_key"]) == (layout_key("h", here), layout_key("h", best))
    assert f"{gain:+.3f}" in trial["label"] and f"{z:+.2f} sd" in trial["label"]


def test_no_step_while_exploration_has_budget_found_something_or_the_steps_are_spent():
    fresh = search(sibling_rounds=40)
    assert offered(fresh) is None, "exploration still has its own trials to spend"
    found = spent()
    found.history = replace(found.history, explore_kept={"h": 1})
    assert offered(found) is None, "a kept trial: the exploration was not fruitless"
    done = spent()
    done.history = RunHistory.of(tried={"h": done.settings.trial_max + done.settings.step_trials})
    assert offered(done) is None
    assert offered(spent(step_trials=0)) is None
    assert offered(spent(exploration=0.0)) is None
    assert offered(spent(trials=False)) is None
    protected = spent()
    protected.guests["a"] = replace(protected.guests["a"], protected=True)
    assert offered(protected) is None
    busy = spent()
    busy.draft.trials["h"] = {"layout": {}, "what": "spread", "label": "blind spread", "from_key": "x", "to_key": "y"}
    offer_likeliest_steps(busy)
    assert busy.draft.trials["h"]["what"] == "spread", "another trial is due: it keeps its turn"


def test_a_step_measured_lately_is_not_tried_again_the_next_likeliest_is():
    first = spent()
    trial = offered(first)
    measured = spent()
    measured.history = replace(measured.history, measured_better=frozenset({(trial["from_key"], trial["to_key"])}))
    second = offered(measured)
    assert second is not None and second["to_key"] != trial["to_key"]
    host = measured.hosts["h"]
    assert second["layout"] == ranked_steps(measured, host, pinned_layout(measured, host))[1][2]


def test_the_plan_offers_the_step_only_where_the_trial_memory_says_so():
    state, model = spread_state(), learned(sibling_rounds=40)
    trial_max = settings().trial_max
    plan = plan_rebalance(state, model, settings(), now=0.0, tried={"h": trial_max})
    assert [t["what"] for t in plan.settings["notes"]["trials"]] == ["step"], plan.settings["notes"]["trials"]
    kept = plan_rebalance(state, model, settings(), now=0.0, tried={"h": trial_max}, explore_kept={"h": 1})
    assert "step" not in [t["what"] for t in kept.settings["notes"]["trials"]]


def test_step_trials_must_be_a_whole_number_of_layouts():
    with pytest.raises(RebalanceInputError, match="step_trials"):
        RebalanceSettings(step_trials=-1)
    with pytest.raises(RebalanceInputError, match="step_trials"):
        RebalanceSettings(step_trials=1.5)  # type: ignore[arg-type]
