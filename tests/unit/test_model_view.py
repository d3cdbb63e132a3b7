"""The web view's picture of the interference model: one β table per neighbour distance class
with the evidence behind each cell, and the predicted loss per neighbour of one guest."""

from __future__ import annotations

import pytest

from vmplacer.core.model.interference import Exposure, InterferenceModel, Observation, Tenant
from vmplacer.core.model.view import coefficient_tables, heat_level, nearest_distance, neighbour_losses
from vmplacer.core.topology.host import NEIGHBOUR_CLASSES, DistanceClass, uniform_topology

LLC = DistanceClass.SAME_LLC


def learned() -> InterferenceModel:
    """b hurts a by 0.3 at a shared LLC (six observations), c hurts a by 0.1 (two)."""
    obs = [Observation("a", 0.7, 1.0, (Exposure("b", LLC, 1.0),)) for _ in range(6)]
    obs += [Observation("a", 0.9, 1.0, (Exposure("c", LLC, 1.0),)) for _ in range(2)]
    return InterferenceModel().fit(obs)


def test_each_distance_class_has_a_table_and_observed_cells_carry_their_counts():
    model = learned()
    tables = coefficient_tables(model)
    assert [t["distance"] for t in tables["tables"]] == [c.value for c in NEIGHBOUR_CLASSES]
    assert tables["workloads"] == ["a", "b", "c"]
    llc = next(t for t in tables["tables"] if t["distance"] == LLC.value)
    cells = {(row["background"], cell["foreground"]): cell for row in llc["rows"] for cell in row["cells"]}
    assert cells[("b", "a")]["observations"] == pytest.approx(6.0)
    assert cells[("c", "a")]["observations"] == pytest.approx(2.0)
    assert not cells[("a", "b")]["observed"] and cells[("a", "b")]["observations"] == 0
    assert cells[("b", "a")]["beta"] == pytest.approx(model.beta("b", "a", LLC))
    assert cells[("b", "a")]["beta"] > cells[("c", "a")]["beta"] > 0
    assert llc["observations"] == pytest.approx(8.0)
    assert sum(t["observations"] for t in tables["tables"]) == pytest.approx(8.0)  # nothing seen elsewhere


def test_the_shown_workloads_are_the_best_observed_ones():
    tables = coefficient_tables(learned(), max_keys=2)
    assert tables["workloads"] == ["a", "b"] and tables["known"] == 3


def test_an_empty_model_has_empty_tables():
    tables = coefficient_tables(InterferenceModel())
    assert tables["workloads"] == [] and tables["observations"] == 0
    assert all(t["rows"] == [] for t in tables["tables"])


def test_heat_levels_span_the_scale():
    assert heat_level(0.0, 0.4) == "h0" and heat_level(0.4, 0.4) == "h8" and heat_level(0.2, 0.4) == "h4"
    assert heat_level(-0.01, 0.4) == "hneg" and heat_level(0.1, 0.0) == "h0"


def test_the_predicted_loss_follows_the_learned_coefficients():
    model = learned()
    topology = uniform_topology(nodes=1, cores_per_node=4)
    cores = [c for c in topology.cores if c.node == topology.nodes_with_cpus()[0]]
    a = Tenant("a", [cores[0].cpus[0]])
    b = Tenant("b", [cores[1].cpus[0]])
    c = Tenant("c", [cores[2].cpus[0]])
    distance = nearest_distance(topology, a, b)
    result = neighbour_losses(model, topology, a, [c, b])
    rows = {r["neighbour"]: r for r in result["neighbours"]}
    assert [r["neighbour"] for r in result["neighbours"]] == ["b", "c"]  # the larger loss first
    assert rows["b"]["distance"] == distance.value
    assert rows["b"]["loss"] == pytest.approx(model.beta("b", "a", distance), abs=1e-9)
    assert rows["b"]["loss"] > rows["c"]["loss"] > 0
    assert result["loss"] == pytest.approx(rows["b"]["loss"] + rows["c"]["loss"], abs=1e-9)  # additive form
    shared = neighbour_losses(model, topology, a, [Tenant("b", [cores[0].cpus[0]])])["neighbours"][0]
    assert shared["distance"] == DistanceClass.SAME_CPU.value and shared["beta"] is None
    assert shared["loss"] == pytest.approx(0.5)  # one pCPU time-shared: half its speed
