"""The model's layout against the blind spread at the lower confidence bound: a layout whose
predicted gain rests on pairs the model observed little does not beat the spread, backed by
data; the same gain backed by data is kept."""

from __future__ import annotations

import random

from vmplacer.core.rebalance.draft import Draft, RunHistory
from vmplacer.core.rebalance.offers import TrialKind
from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
from vmplacer.core.model.interference import Exposure, InterferenceModel, Observation
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.policy import ClusterState, HostState, RebalanceSettings, describe_guest, plan_rebalance
from vmplacer.core.rebalance.pessimistic import doubt, spread_layout
from vmplacer.core.rebalance.search import start_search, take_move
from vmplacer.core.rebalance.whatif import CandidateMove, GuestChange, new_move
from vmplacer.core.topology.host import DistanceClass, uniform_topology
from vmplacer.core.rebalance.trial import Backoff

LLC, CORE = DistanceClass.SAME_LLC, DistanceClass.SAME_CORE
GUESTS = ("a", "b", "c", "d")
TOPO = uniform_topology(nodes=1, cores_per_node=4, threads_per_core=2, name="h")  # pCPU c and c + 4: one core


def settings(**overrides) -> RebalanceSettings:
    """The product's settings, with the hysteresis absolute: these four-guest scenarios are set
    against `min_gain` 0.05. Scaled to four guests (0.02), the climb takes smaller steps and
    reaches a pairing whose lower bound clears (+0.13, against −0.03 for the one it reaches in
    steps of 0.05), so the scenarios would no longer put a layout short of its bound to the test."""
    return RebalanceSettings(**{"min_gain_share": 0.0, **overrides})


def spread_state() -> ClusterState:
    """One guest per core: the blind spread itself."""
    guests = {n: describe_guest(Placement(guest=n, host="h", vcpupin={0: frozenset({cpu})}, memory_kib=1024))
              for cpu, n in enumerate(GUESTS)}
    return ClusterState({"h": HostState("h", TOPO)}, guests)


def learned(sibling_rounds: int, seed: int = 0) -> InterferenceModel:
    """Every pair costs 0.2 at same-LLC distance, observed 200 times in varied company; a and b,
    c and d were also seen on SMT siblings, costing each other 0.15 there, `sibling_rounds`
    times. Every observation has 10 % noise: one sibling sample says little, forty say a lot."""
    rng = random.Random(seed)
    observations = []
    for _ in range(200):
        key = rng.choice(GUESTS)
        company = rng.sample([g for g in GUESTS if g != key], rng.randint(1, 3))
        loss = 0.2 * len(company) + rng.gauss(0.0, 0.1)
        observations.append(Observation(key, max(0.0, 1.0 - loss), 1.0,
                                        tuple(Exposure(g, LLC, 1.0) for g in company)))
    for _ in range(sibling_rounds):
        for key, other in (("a", "b"), ("b", "a"), ("c", "d"), ("d", "c")):
            loss = 0.15 + rng.gauss(0.0, 0.1)
            observations.append(Observation(key, max(0.0, 1.0 - loss), 1.0, (Exposure(other, CORE, 1.0),)))
    return InterferenceModel().fit(observations)


def final_cores(plan, state: ClusterState) -> dict[str, int]:
    pins = {n: next(iter(g.placement.vcpupin[0])) for n, g in state.guests.items()}
    for action in plan.actions:
        if action.kind == "repin" and not action.parameters.get("tried"):  # the plan's layout, not its trial
            pins[action.guest] = next(iter(action.after.vcpupin[0]))
    return {n: TOPO.cpus[c].core for n, c in pins.items()}


def shares_a_core(cores: dict[str, int]) -> bool:
    return len(set(cores.values())) < len(cores)


def test_a_layout_resting_on_few_observations_does_not_beat_the_spread():
    """One noisy sample of each sibling pair: the model predicts pairing them on siblings gains,
    and without pessimism it does so; at the lower bound the gain does not hold, and the host,
    spread already, stays spread."""
    model = learned(sibling_rounds=1)
    state = spread_state()
    trusting = plan_rebalance(state, model, settings(pessimism=0.0), now=0.0)
    assert shares_a_core(final_cores(trusting, state)), trusting.summary
    plan = plan_rebalance(state, model, settings(), now=0.0)
    assert not shares_a_core(final_cores(plan, state)), plan.summary
    assert not [a for a in plan.actions if a.kind == "repin" and not a.parameters.get("tried")]
    # the model's layout is not taken, but tried: its repins end in a probe that keeps them only if
    # Freeze'nSense measures them better
    tried = [a for a in plan.actions if a.parameters.get("tried")]
    assert tried and all(a.parameters["tried"] == "model" for a in tried)
    probe = plan.actions[-1]
    assert probe.kind == "probe" and probe.parameters["trial"]["kind"] == "explore"
    assert set(probe.depends_on) == {a.index for a in tried}
    (report,) = plan.settings["notes"]["pessimistic"]
    assert report["kept"] == "start" and report["lower_bound"] < 0 < report["start"]["advantage"]


def test_the_same_gain_backed_by_data_is_kept():
    """Forty samples of each sibling pair, the same truth and noise: the gain holds at the bound."""
    model = learned(sibling_rounds=40)
    state = spread_state()
    plan = plan_rebalance(state, model, settings(), now=0.0)
    assert shares_a_core(final_cores(plan, state)), plan.summary
    (report,) = plan.settings["notes"]["pessimistic"]
    assert report["kept"] == "model" and report["lower_bound"] > 0


def test_doubt_counts_only_pairs_whose_distance_changes():
    """Swapping two guests' cores keeps every pair at LLC distance: the same coefficients, no
    doubt. Moving one onto another's sibling puts a pair at a distance seen once."""
    draft, inputs = start_search(spread_state(), learned(sibling_rounds=1), settings())
    swap = CandidateMove("swap", [GuestChange("a", "h", {0: frozenset({1})}), GuestChange("b", "h", {0: frozenset({0})})], 0.0, 0.0)
    pair = CandidateMove("move", [GuestChange("b", "h", {0: frozenset({4})})], 0.0, 0.0)
    assert doubt(draft, inputs, swap) == 0.0
    assert doubt(draft, inputs, pair) > 0.1
    assert doubt(draft, inputs, pair) > doubt(*start_search(spread_state(), learned(sibling_rounds=40), settings()), pair)
    assert spread_layout(draft, inputs, draft.hosts["h"]) == {n: {0: frozenset({c})} for c, n in enumerate(GUESTS)}


def _trial(plan):
    return next((a.parameters["trial"] for a in plan.actions
                 if a.kind == "probe" and a.parameters.get("trial", {}).get("kind") == "explore"), None)


def test_a_measurement_decides_before_the_model_and_the_same_pair_is_not_tried_again():
    """The host is spread and the model's layout fails the bound, so it is tried; once a trial
    measured it better, the next plan takes it without trying anything; once a trial measured it
    worse, the next plan neither takes it nor tries it again."""
    model = learned(sibling_rounds=1)
    state = spread_state()
    first = plan_rebalance(state, model, settings(), now=0.0)
    trial = _trial(first)
    spread_key, model_key = trial["from_key"], trial["to_key"]

    won = plan_rebalance(state, model, settings(), now=0.0, measured={(model_key, spread_key)})
    assert shares_a_core(final_cores(won, state)), won.summary
    assert _trial(won) is None
    assert won.settings["notes"]["pessimistic"][0]["measured"] == "the model's layout measured better than the spread"

    lost = plan_rebalance(state, model, settings(), now=0.0, measured={(spread_key, model_key)})
    assert not [a for a in lost.actions if a.kind == "repin"], lost.summary
    assert _trial(lost) is None


def test_a_host_tries_at_most_trial_max_layouts_within_the_memory():
    model = learned(sibling_rounds=1)
    state = spread_state()
    assert _trial(plan_rebalance(state, model, settings(trial_max=3), now=0.0, tried={"h": 2})) is not None
    capped = plan_rebalance(state, model, settings(trial_max=3), now=0.0, tried={"h": 3})
    assert _trial(capped) is None and not capped.actions
    spent = plan_rebalance(state, model, settings(trial_max=3), now=0.0, tried={"h": 3})
    assert _trial(spent) is None and not spent.actions, "three trials undone: nothing more is tried"
    assert not plan_rebalance(state, model, settings(trials=False), now=0.0).actions


def test_a_host_in_back_off_gets_no_data_driven_move_only_a_trial():
    """Forty sibling samples: unheld, the plan pairs guests on siblings, confirmed by measurement."""
    model = learned(sibling_rounds=40)
    state = spread_state()
    held = {"h": Backoff("h", 3, 1800.0)}
    free = plan_rebalance(state, model, settings(), now=0.0)
    assert [a for a in free.actions if a.kind == "repin" and not a.parameters.get("tried")]
    assert any((a.parameters.get("trial") or {}).get("kind") == "confirm" for a in free.actions)
    waiting = plan_rebalance(state, model, settings(), now=0.0, held=held)
    assert not waiting.actions, waiting.summary
    assert waiting.settings["notes"]["held"] == [
        "host h: its last 3 planned layouts measured worse and were undone; for 1800 s more its layout is "
        "only tried, kept if measured better (back-off)"]
    assert waiting.settings["notes"]["declined"][-1]["declined_by"] == "backoff"
    assert "back-off" in waiting.summary
    # the exact layout the host would have taken becomes its trial: repins marked tried, then an explore probe
    solved = plan_rebalance(state, model, settings(), now=0.0, held=held, solver=CpSatLayoutSolver())
    repins = [a for a in solved.actions if a.kind == "repin"]
    assert repins and all(a.parameters.get("tried") == "exact" for a in repins), solved.summary
    assert solved.actions[-1].parameters["trial"]["kind"] == "explore"
    # ... within the host's trial budget
    capped = plan_rebalance(state, model, settings(), now=0.0, held=held, solver=CpSatLayoutSolver(),
                            tried={"h": settings().trial_max})
    assert not [a for a in capped.actions if a.kind == "repin"], capped.summary
    # another host's back-off changes nothing here
    other = plan_rebalance(state, model, settings(), now=0.0, held={"g": Backoff("g", 3, 1800.0)})
    assert [a.kind for a in other.actions] == [a.kind for a in free.actions]


def test_a_planned_layout_measured_worse_than_where_the_host_is_is_not_taken_again():
    """Forty sibling samples: the model surely prefers pairing on siblings. A trial undid that
    layout once (it measured worse than the spread the host is in): the plan stays put."""
    model = learned(sibling_rounds=40)
    state = spread_state()
    plan = plan_rebalance(state, model, settings(), now=0.0)
    confirm = next(a.parameters["trial"] for a in plan.actions if a.kind == "probe" and "trial" in a.parameters)
    assert confirm["kind"] == "confirm"
    again = plan_rebalance(state, model, settings(), now=0.0,
                           measured={(confirm["from_key"], confirm["to_key"])})
    assert not [a for a in again.actions if a.kind == "repin"], again.summary
    # here where the host is is the spread: the measurement decides the comparison with the spread
    assert again.settings["notes"]["pessimistic"][0]["measured"] == "the spread measured better than the model's layout"


def test_moves_whose_layout_measured_worse_than_the_start_are_not_planned_again():
    """From a packed start the plan moves guests apart; an earlier trial measured exactly that
    layout worse than this start, so the next plan keeps the start."""
    model = learned(sibling_rounds=40)
    packed = {n: describe_guest(Placement(guest=n, host="h", vcpupin={0: frozenset({cpu})}, memory_kib=1024))
              for n, cpu in zip(GUESTS, (0, 4, 1, 5))}
    state = ClusterState({"h": HostState("h", TOPO)}, packed)
    plan = plan_rebalance(state, model, settings(), now=0.0)
    planned = [a for a in plan.actions if a.kind == "repin" and not a.parameters.get("tried")]
    assert planned, plan.summary
    confirm = next(a.parameters["trial"] for a in plan.actions
                   if a.kind == "probe" and a.parameters.get("trial", {}).get("kind") == "confirm")
    again = plan_rebalance(state, model, settings(), now=0.0,
                           measured={(confirm["from_key"], confirm["to_key"])})
    assert not [a for a in again.actions if a.kind == "repin" and not a.parameters.get("tried")], again.summary


def test_data_driven_moves_are_measured_before_and_after_in_the_plan():
    """The plan first measures the host as it is (a baseline, pooled with the run's profile), then
    moves, then confirms the moves by measuring again; a rule's moves (the blind spread) are
    measured after, so a trial that follows compares with them."""
    model = learned(sibling_rounds=40)
    packed = {n: describe_guest(Placement(guest=n, host="h", vcpupin={0: frozenset({cpu})}, memory_kib=1024))
              for n, cpu in zip(GUESTS, (0, 4, 1, 5))}
    plan = plan_rebalance(ClusterState({"h": HostState("h", TOPO)}, packed), model, settings(), now=0.0)
    kinds = [(a.kind, "baseline" if a.parameters.get("baseline") else a.parameters.get("trial", {}).get("kind", ""))
             for a in plan.actions]
    assert kinds[0] == ("probe", "baseline")
    confirm = next(i for i, k in enumerate(kinds) if k == ("probe", "confirm"))
    moves = [a for a in plan.actions[:confirm] if a.kind == "repin"]
    assert moves and all(a.index > 0 for a in moves)
    assert set(plan.actions[confirm].depends_on) == {a.index for a in moves}
    assert all(d < a.index for a in plan.actions for d in a.depends_on)


def sibling_averse() -> InterferenceModel:
    """Siblings cost each other 0.5, guests on other cores 0.05: any one-guest-per-core layout is
    far better than guests paired on siblings."""
    rng = random.Random(1)
    observations = []
    for _ in range(200):
        key = rng.choice(GUESTS)
        company = rng.sample([g for g in GUESTS if g != key], rng.randint(1, 3))
        observations.append(Observation(key, 1.0 - 0.05 * len(company), 1.0,
                                        tuple(Exposure(g, LLC, 1.0) for g in company)))
    for _ in range(40):
        for key in GUESTS:
            for other in GUESTS:
                if other != key:
                    observations.append(Observation(key, 0.5, 1.0, (Exposure(other, CORE, 1.0),)))
    return InterferenceModel().fit(observations)


def test_when_the_planned_layout_measured_worse_the_exact_layout_is_tried_from_where_the_host_stays():
    """The climb's layout was measured worse than the packed start and the host stays; the exact
    solver's layout is another one, which the model rates far above the start: it becomes the
    host's trial. Not when it is the layout measured worse, nor once it was measured itself."""
    from vmplacer.core.rebalance.pessimistic import keep_what_measured_better
    from vmplacer.core.rebalance.trial import layout_key

    packed = {n: describe_guest(Placement(guest=n, host="h", vcpupin={0: frozenset({cpu})}, memory_kib=1024))
              for n, cpu in zip(GUESTS, (0, 4, 1, 5))}
    state = ClusterState({"h": HostState("h", TOPO)}, packed)
    start = {n: {0: frozenset({cpu})} for n, cpu in zip(GUESTS, (0, 4, 1, 5))}
    climbed = {n: {0: frozenset({cpu})} for n, cpu in zip(GUESTS, (0, 1, 2, 3))}
    exact = {n: {0: frozenset({cpu})} for n, cpu in zip(GUESTS, (0, 2, 1, 3))}

    def after_revert(solved, measured) -> Draft:
        history = RunHistory.of(measured={(layout_key("h", start), layout_key("h", climbed))} | measured)
        draft, inputs = start_search(state, sibling_averse(), settings(), history=history)
        take_move(draft, inputs, new_move("climb", [(n, "h", pins) for n, pins in climbed.items()]))
        draft.layout_guests["h"] = list(GUESTS)
        draft.exact_layouts["h"] = solved
        assert keep_what_measured_better(draft, inputs)
        assert {n: dict(draft.hosts["h"].pins[n]) for n in GUESTS} == start  # the host stays
        return draft

    trial = after_revert(exact, set()).trials["h"]
    assert trial.kind is TrialKind.EXACT and trial.layout == exact
    assert trial.from_key == layout_key("h", start) and trial.to_key == layout_key("h", exact)
    assert "from where h stays" in trial.label
    assert "h" not in after_revert(climbed, set()).trials  # the solver's layout is the one measured worse
    assert "h" not in after_revert(exact, {(layout_key("h", start), layout_key("h", exact))}).trials


def test_the_blind_spread_balances_nodes_and_caches_not_only_cores():
    """Eight one-vCPU guests packed on the first node of a four-node host: the spread gives each
    its own core and puts two on every node (one LLC per node), not eight on the first two nodes."""
    topology = uniform_topology(nodes=4, cores_per_node=4, threads_per_core=2, name="h")
    guests = {f"g{i}": describe_guest(Placement(guest=f"g{i}", host="h", vcpupin={0: frozenset({i % 4})},
                                                memory_kib=1024), labels={"workload": GUESTS[i % 4]})
              for i in range(8)}
    draft, inputs = start_search(ClusterState({"h": HostState("h", topology)}, guests), learned(sibling_rounds=5),
                                 settings(), 0.0, {}, None)
    layout = spread_layout(draft, inputs, draft.hosts["h"])
    assert layout is not None
    cpus = [next(iter(pins[0])) for pins in layout.values()]
    assert len({topology.cpus[c].core for c in cpus}) == 8
    per_node = [sum(1 for c in cpus if topology.cpus[c].node == n) for n in range(4)]
    assert per_node == [2, 2, 2, 2]
