"""A second opinion where the model's planned layouts measured worse: the model in its other form
keeps a refuted host from climbing to another layout it disagrees with, and its exact layout is
the host's trial; a host never refuted is planned as before."""

from __future__ import annotations

from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
from vmplacer.core.model.interference import ADDITIVE, MULTIPLICATIVE, ModelConfig, other_form
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.policy import ClusterState, HostState, describe_guest, plan_rebalance

from tests.unit.test_rebalance_pessimism import GUESTS, TOPO, learned, sibling_averse, spread_state
from tests.unit.test_rebalance_pessimism import settings as plain_settings

SOLVER = CpSatLayoutSolver()


def settings(**overrides):
    """The scenarios' settings (test_rebalance_pessimism), the second opinion switched on."""
    return plain_settings(**{"second_opinion": True, **overrides})


def placed(cpus: tuple[int, ...]) -> ClusterState:
    """Guests a, b, c, d on these pCPUs (c and c + 4 are one core's siblings)."""
    guests = {n: describe_guest(Placement(guest=n, host="h", vcpupin={0: frozenset({cpu})}, memory_kib=1024))
              for n, cpu in zip(GUESTS, cpus)}
    return ClusterState({"h": HostState("h", TOPO)}, guests)


def final_cores(plan, state: ClusterState) -> dict[str, int]:
    """Each guest's core once the plan and its trials ran."""
    pins = {n: next(iter(g.placement.vcpupin[0])) for n, g in state.guests.items()}
    for action in plan.actions:
        if action.kind == "repin":
            pins[action.guest] = next(iter(action.after.vcpupin[0]))
    return {n: TOPO.cpus[c].core for n, c in pins.items()}


def planned_repins(plan) -> dict[str, int]:
    return {a.guest: next(iter(a.after.vcpupin[0])) for a in plan.actions
            if a.kind == "repin" and not a.parameters.get("tried")}


def trials(plan) -> list[dict]:
    return plan.settings["notes"]["trials"]


def test_the_other_form_is_the_same_configuration_in_the_other_form():
    config = ModelConfig(pair_shrinkage=0.7)
    assert other_form(config).form == MULTIPLICATIVE and other_form(config).pair_shrinkage == 0.7
    assert other_form(other_form(config)) == config and config.form == ADDITIVE


def test_a_host_never_refuted_is_planned_as_without_a_second_opinion():
    state = spread_state()
    plain = plan_rebalance(state, learned(sibling_rounds=40), settings(), now=0.0, solver=SOLVER)
    consulted = plan_rebalance(state, learned(sibling_rounds=40), settings(), now=0.0, solver=SOLVER,
                               second=sibling_averse())
    assert planned_repins(plain), plain.summary  # the model pairs guests on siblings
    assert planned_repins(consulted) == planned_repins(plain)
    assert trials(consulted) == trials(plain)


def test_a_refuted_host_where_the_second_form_has_nothing_to_try_is_planned_as_before():
    """From the spread, the second form's own layout is where the host is: nothing to try, and one
    refuted plan does not hold the model's next one back."""
    state = spread_state()
    plain = plan_rebalance(state, learned(sibling_rounds=40), settings(), now=0.0, solver=SOLVER)
    plan = plan_rebalance(state, learned(sibling_rounds=40), settings(), now=0.0, solver=SOLVER,
                          refuted={"h"}, second=sibling_averse())
    assert planned_repins(plan) == planned_repins(plain) != {}
    assert not [t for t in trials(plan) if t["what"] == "second"]


def test_a_refuted_host_the_plan_would_move_where_the_second_form_disagrees_stays_for_the_trial():
    """a and b on core 0's siblings, c and d alone: the model would pair c and d too, the second
    form rates that below the start and would split a and b instead. The host stays where it
    is and tries the second form's layout; once that was measured, the model plans as before."""
    state = placed((0, 4, 1, 2))
    model = learned(sibling_rounds=40)
    plain = plan_rebalance(state, model, settings(), now=0.0, solver=SOLVER)
    assert planned_repins(plain), plain.summary
    plan = plan_rebalance(state, model, settings(), now=0.0, solver=SOLVER, refuted={"h"}, second=sibling_averse())
    assert not planned_repins(plan), plan.summary
    [second] = [t for t in trials(plan) if t["what"] == "second"]
    assert len(set(final_cores(plan, state).values())) == len(GUESTS)  # the trial: one guest per core
    [opinion] = plan.settings["notes"]["second_opinion"]
    assert opinion["host"] == "h" and opinion["stays"] and opinion["predicted_gain"] > 0
    assert plan.settings["notes"]["refuted"] == ["h"]
    measured = plan_rebalance(state, model, settings(), now=0.0, solver=SOLVER, refuted={"h"},
                              second=sibling_averse(), measured={(second["from_key"], second["to_key"])})
    assert planned_repins(measured) == planned_repins(plain)
    assert not [t for t in trials(measured) if t["what"] == "second"]


def test_the_second_forms_exact_layout_becomes_the_refuted_hosts_trial_within_the_budget():
    """The second form's exact layout (one guest per core) is tried, kept only if measured better;
    not once the host has tried `trial_max` layouts lately, nor without a second model or a solver."""
    state = placed((0, 4, 1, 2))
    model = learned(sibling_rounds=40)
    plan = plan_rebalance(state, model, settings(), now=0.0, solver=SOLVER, refuted={"h"}, second=sibling_averse())
    second = [t for t in trials(plan) if t["what"] == "second"]
    assert len(second) == 1 and second[0]["host"] == "h", plan.summary
    assert [a for a in plan.actions if a.kind == "repin" and a.parameters.get("tried") == "second"]
    final = final_cores(plan, state)
    assert len(set(final.values())) == len(GUESTS), final  # one guest per core
    probe = next(a for a in plan.actions
                 if a.kind == "probe" and a.parameters.get("trial", {}).get("kind") == "explore")
    assert "form would choose" in probe.reason
    capped = plan_rebalance(state, model, settings(), now=0.0, solver=SOLVER, refuted={"h"},
                            second=sibling_averse(), tried={"h": settings().trial_max})
    assert not [t for t in trials(capped) if t["what"] == "second"]
    for kwargs in ({"second": None}, {"solver": None, "second": sibling_averse()}):
        without = plan_rebalance(state, model, settings(), now=0.0, refuted={"h"}, **{"solver": SOLVER, **kwargs})
        assert not [t for t in trials(without) if t["what"] == "second"]


def test_on_by_default_and_from_the_command_line_off():
    import argparse

    from vmplacer.cli.rebalance import settings_with_flags
    from vmplacer.core.rebalance.state import RebalanceSettings

    state = placed((0, 4, 1, 2))
    model = learned(sibling_rounds=40)
    assert plain_settings().second_opinion
    off = plan_rebalance(state, model, plain_settings(second_opinion=False), now=0.0, solver=SOLVER,
                         refuted={"h"}, second=sibling_averse())
    assert planned_repins(off) == planned_repins(plan_rebalance(state, model, plain_settings(), now=0.0,
                                                                solver=SOLVER))
    assert not off.settings["notes"]["second_opinion"]
    assert not settings_with_flags(argparse.Namespace(second_opinion=False), RebalanceSettings()).second_opinion
    assert settings_with_flags(argparse.Namespace(second_opinion=None), RebalanceSettings()).second_opinion
    assert settings_with_flags(argparse.Namespace(), RebalanceSettings()).second_opinion


def test_a_protected_guest_keeps_its_host_out_of_the_second_opinion():
    from dataclasses import replace

    state = placed((0, 4, 1, 2))
    guests = dict(state.guests)
    guests["a"] = replace(guests["a"], protected=True)
    plan = plan_rebalance(ClusterState(state.hosts, guests), learned(sibling_rounds=40), settings(), now=0.0,
                          solver=SOLVER, refuted={"h"}, second=sibling_averse())
    assert not [t for t in trials(plan) if t["what"] == "second"]
