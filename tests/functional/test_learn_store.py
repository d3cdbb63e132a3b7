"""Stored profile samples teach the stored model, on SQLite and PostgreSQL; learning is
idempotent per run and survives a reload from the database."""

from __future__ import annotations

import pytest

from vmplacer.adapters.db.models_repo import SqlModelRepository
from vmplacer.adapters.db.profiles import SqlProfileStore
from vmplacer.app.learn.online import learn_from_runs
from vmplacer.core.model.interference import Tenant
from vmplacer.core.topology.host import uniform_topology
from vmplacer.ports import Neighbour, ProfileSample


@pytest.fixture
def stores(sessions):
    return SqlProfileStore(sessions), SqlModelRepository(sessions)


def _run(store: SqlProfileStore, loss_of_a: float, rounds: int = 20) -> int:
    """A profile run where b (on the other core of the same LLC) costs a `loss_of_a`."""
    run = store.start_run("h1", "cpu", {})
    samples = []
    for i in range(rounds):
        t = 100.0 + i
        samples.append(ProfileSample("a", "zeta", "cpu", 1.0 - loss_of_a, 0.01, 10.0, t))
        samples.append(ProfileSample("a", "zeta_b", "cpu", 1.0, 0.01, 10.0, t + 0.5,
                                     (Neighbour("b", "same-llc", True),), freeze_ms=12.0))
        samples.append(ProfileSample("b", "zeta", "cpu", 1.0, 0.01, 10.0, t))
        samples.append(ProfileSample("b", "zeta_b", "cpu", 1.0, 0.01, 10.0, t + 0.6,
                                     (Neighbour("a", "same-llc", True),), freeze_ms=12.0))
    store.add_samples(run, samples)
    store.finish_run(run, {})
    return run


def test_learned_model_predicts_the_measured_loss(stores):
    profiles, models = stores
    run = _run(profiles, loss_of_a=0.2)
    report = learn_from_runs([run], profiles, models)
    assert report.observations == 40 and report.runs == [run]

    model, last = models.load()
    assert last == run and model.observations == 40
    topology = uniform_topology(nodes=1, cores_per_node=2)
    predictions = model.predict(topology, [Tenant("a", [0]), Tenant("b", [1])])
    assert predictions["a"].perf == pytest.approx(0.8, abs=0.03)
    assert predictions["b"].perf == pytest.approx(1.0, abs=0.03)

    again = learn_from_runs([run], profiles, models)  # the same run is not learned twice
    assert again.observations == 0 and again.skipped["already-learned-run"] == 1
    assert models.load()[0].observations == 40


def test_empty_store_is_the_linear_predictor(stores):
    _, models = stores
    model, last = models.load()
    assert last is None and model.observations == 0
    topology = uniform_topology(nodes=1, cores_per_node=2)
    shared = model.predict(topology, [Tenant("a", [0]), Tenant("b", [0])])
    assert shared["a"].perf == pytest.approx(0.5)  # time sharing only
