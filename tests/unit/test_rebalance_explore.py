"""Exploration: a host with no other trial tries the layout the model would choose were its
doubtful pairs harmless, so a pairing the model fears without data gets measured once."""

from __future__ import annotations

import numpy as np

from vmplacer.core.rebalance.draft import RunHistory
from vmplacer.core.rebalance.offers import HostTrial, TrialKind
from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
from vmplacer.core.rebalance.policy import RebalanceSettings
from vmplacer.core.rebalance.explore import offer_optimistic_layouts
from vmplacer.core.rebalance.layout import BetaTable
from vmplacer.core.rebalance.draft import Draft, PlanInputs
from vmplacer.core.rebalance.search import start_search
from vmplacer.core.topology.host import DistanceClass

from tests.unit.test_rebalance_pessimism import GUESTS, TOPO, learned, spread_state

CORE, LLC = DistanceClass.SAME_CORE.rank, DistanceClass.SAME_LLC.rank


def search(sibling_rounds: int, history: RunHistory = RunHistory(), **settings) -> tuple[Draft, PlanInputs]:
    return start_search(spread_state(), learned(sibling_rounds=sibling_rounds), RebalanceSettings(**settings), 0.0, {},
                        None, CpSatLayoutSolver(), history=history)


def cores_of(layout) -> dict[str, int]:
    return {g: TOPO.cpus[next(iter(p[0]))].core for g, p in layout.items()}


def test_optimism_lowers_each_coefficient_by_its_doubt_never_below_zero():
    """a and b were seen on SMT siblings once (noisy), every pair at LLC distance 200 times: the
    sibling coefficient drops most; nothing that costs is turned into a benefit."""
    model = learned(sibling_rounds=1)
    ids = [("key", g) for g in GUESTS]
    plain, hopeful = BetaTable(model).tensor(ids), BetaTable(model, optimism=1.5).tensor(ids)
    assert np.all(hopeful <= plain + 1e-12)
    assert np.all(hopeful >= np.minimum(plain, 0.0) - 1e-12)
    a, b = 0, 1
    assert plain[CORE, a, b] - hopeful[CORE, a, b] > plain[LLC, a, b] - hopeful[LLC, a, b]
    assert np.array_equal(BetaTable(model, optimism=0.0).tensor(ids), plain)


def test_a_pairing_never_observed_is_tried_when_nothing_else_is():
    """No sibling samples at all: the prior says siblings hurt, so neither the plan nor its trials
    would ever pair guests on a core. The optimistic layout does, and becomes the host's trial."""
    draft, inputs = search(sibling_rounds=0)
    offer_optimistic_layouts(draft, inputs)
    trial = draft.trials["h"]
    assert trial.kind is TrialKind.OPTIMISTIC
    cores = cores_of(trial.layout)
    assert len(set(cores.values())) < len(cores), f"no pair on one core's siblings: {cores}"


def test_no_exploration_when_switched_off_capped_already_measured_or_another_trial_is_due():
    assert not _offered(search(sibling_rounds=0, exploration=0.0))
    assert not _offered(search(sibling_rounds=0, trials=False))
    assert not _offered(search(sibling_rounds=0, history=RunHistory.of(tried={"h": RebalanceSettings().trial_max})))
    first, inputs = search(sibling_rounds=0)
    offer_optimistic_layouts(first, inputs)
    here, there = first.trials["h"].from_key, first.trials["h"].to_key
    assert not _offered(search(sibling_rounds=0, history=RunHistory.of(measured={(here, there)})))
    busy, inputs = search(sibling_rounds=0)
    busy.trials["h"] = HostTrial("h", {}, TrialKind.SPREAD, "blind spread", "x", "y", 0.0)
    offer_optimistic_layouts(busy, inputs)
    assert busy.trials["h"].kind is TrialKind.SPREAD


def _offered(planning: tuple[Draft, PlanInputs]) -> bool:
    draft, inputs = planning
    offer_optimistic_layouts(draft, inputs)
    return "h" in draft.trials


def test_a_host_with_a_protected_guest_is_not_explored():
    from dataclasses import replace

    draft, inputs = search(sibling_rounds=0)
    draft.guests["a"] = replace(draft.guests["a"], protected=True)
    assert not _offered((draft, inputs))


def test_operators_turn_exploration_off_without_losing_trials():
    import argparse

    from vmplacer.cli.rebalance import settings_with_flags

    off = settings_with_flags(argparse.Namespace(no_explore=True), RebalanceSettings())
    assert off.exploration == 0.0 and off.trials
    assert settings_with_flags(argparse.Namespace(), RebalanceSettings()).exploration > 0
    assert not _offered(search(sibling_rounds=0, exploration=off.exploration))
