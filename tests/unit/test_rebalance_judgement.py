"""How the rebalancer judges a gain: what the data identify, what the topology alone predicts,
and the reasons a plan gives for gains it declined."""

from __future__ import annotations

import pytest

from vmplacer.core.model.interference import Exposure, InterferenceModel, ModelConfig, Observation
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.policy import (
    ClusterState,
    HostState,
    RebalanceSettings,
    declined_text,
    describe_guest,
    plan_rebalance,
)
from vmplacer.core.topology.host import DistanceClass, uniform_topology

LLC, CORE = DistanceClass.SAME_LLC, DistanceClass.SAME_CORE


def state_two_on_one_pcpu(load: str = "0.6") -> ClusterState:
    topo = uniform_topology(nodes=1, cores_per_node=2, name="h")
    guests = {n: describe_guest(Placement(guest=n, host="h", vcpupin={0: frozenset({0})}, memory_kib=1024),
                                labels={"load": load}) for n in ("a", "b")}
    return ClusterState({"h": HostState("h", topo)}, guests)


def test_a_gain_below_the_minimum_is_declined_and_the_plan_says_so():
    plan = plan_rebalance(state_two_on_one_pcpu(), InterferenceModel(), RebalanceSettings(min_gain=1.0, min_gain_share=0.0), now=0.0)
    assert plan.state == "empty" and not plan.actions
    declined = plan.settings["notes"]["declined"]
    assert declined and declined[-1]["declined_by"] == "min_gain"
    assert 0 < declined[-1]["predicted_gain"] < 1.0 and declined[-1]["threshold"] == 1.0
    assert "declined" in plan.summary and "below the minimum gain 1" in plan.summary


def test_a_gain_beyond_the_action_budget_is_declined_by_the_budget():
    plan = plan_rebalance(state_two_on_one_pcpu(), InterferenceModel(), RebalanceSettings(max_actions=0), now=0.0)
    declined = plan.settings["notes"]["declined"]
    assert declined[-1]["declined_by"] == "max_actions"
    assert "the action budget is spent" in declined_text(declined[-1])


def test_time_sharing_gains_are_taken_without_any_data():
    plan = plan_rebalance(state_two_on_one_pcpu(), InterferenceModel(), now=0.0)
    assert [a.kind for a in plan.actions] == ["repin"]
    assert not plan.settings["notes"]["declined"]


def test_a_distance_class_never_observed_is_not_trusted():
    model = InterferenceModel().fit([Observation("v", 0.8, 1.0, (Exposure("x", LLC, 1.0),)) for _ in range(20)])
    assert model.beta_confidence("x", "v", LLC) > 0.8
    assert model.beta_confidence("x", "v", CORE) == 0.0


def test_nearer_pcpus_never_interfere_less_than_farther_ones():
    """Data where SMT siblings look harmless next to cores sharing only the LLC (the layouts
    seen confound them) still give siblings at least the same-LLC scale."""
    observations = []
    for _ in range(20):
        observations.append(Observation("v", 0.6, 1.0, (Exposure("x", LLC, 1.0), Exposure("y", CORE, 1.0))))
        observations.append(Observation("w", 0.9, 1.0, (Exposure("y", CORE, 1.0),)))
        observations.append(Observation("w", 0.6, 1.0, (Exposure("x", LLC, 1.0),)))
    model = InterferenceModel(ModelConfig(distance_prior={"same-core": 0.2})).fit(observations)
    scales = [model.distance_scale(c) for c in (CORE, DistanceClass.SAME_L2, LLC, DistanceClass.SAME_NODE,
                                                 DistanceClass.REMOTE_NODE)]
    assert all(a >= b - 1e-9 for a, b in zip(scales, scales[1:])), scales


def test_moving_off_a_busy_sibling_counts_even_when_the_model_cannot_say_why():
    """Four guests packed on the siblings of two cores, the model fitted on that one layout
    only: it cannot split their losses between sibling and LLC neighbours, but the topology
    says an idle core helps whoever the neighbours are — the plan spreads them."""
    topo = uniform_topology(nodes=1, cores_per_node=4, threads_per_core=2, name="h")
    layout = {"a": 0, "b": 4, "c": 1, "d": 5}
    guests = {n: describe_guest(Placement(guest=n, host="h", vcpupin={0: frozenset({c})}, memory_kib=1024))
              for n, c in layout.items()}
    observations = []
    for name, cpu in layout.items():
        sibling = next(n for n, c in layout.items() if n != name and topo.cpus[c].core == topo.cpus[cpu].core)
        others = [n for n in layout if n not in (name, sibling)]
        neighbours = (Exposure(sibling, CORE, 1.0), *(Exposure(o, LLC, 1.0) for o in others))
        observations += [Observation(name, 0.75, 1.0, neighbours) for _ in range(10)]
    model = InterferenceModel(ModelConfig(distance_prior={"same-core": 5.0})).fit(observations)
    plan = plan_rebalance(ClusterState({"h": HostState("h", topo)}, guests), model, now=0.0)
    assert any(a.kind == "repin" for a in plan.actions), plan.summary
    cores = [topo.cpus[next(iter(a.after.vcpupin[0]))].core for a in plan.actions
             if a.kind == "repin" and not a.parameters.get("tried")]
    assert all(c in (2, 3) for c in cores)


@pytest.mark.parametrize("by, words", [
    ("min_gain", "below the minimum gain"),
    ("confidence", "of it is sure at confidence"),
    ("migration_cost", "the migration costs"),
    ("min_migration_gain", "below the minimum migration gain"),
])
def test_every_decline_reason_reads_as_words(by, words):
    text = declined_text({"move": "m", "predicted_gain": 0.2, "sure_gain": 0.01, "confidence": 0.1,
                          "cost": 0.15, "threshold": 0.1, "declined_by": by})
    assert words in text and "predicted +0.200" in text
