"""`vmplacer model learn|show` through the console script on a real SQLite file; guests are learned
under the model key the rebalancer plans them by."""

from __future__ import annotations

import json

import pytest

from tests.functional.test_cli_basics import run
from tests.functional.test_learn_store import _run
from vmplacer.adapters.db import migrate
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.models_repo import SqlModelRepository
from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.profiles import SqlProfileStore
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.state import describe_guest
from vmplacer.core.topology.host import DistanceClass
from vmplacer.ports import Neighbour, ProfileSample


def test_learn_then_show(tmp_path):
    env = {"VMPLACER_DATA_DIR": str(tmp_path)}
    empty = json.loads(run("model", "show", "--format", "json", env=env).stdout)
    assert empty["observations"] == 0 and empty["guests"] == []

    url = f"sqlite:///{tmp_path / 'vmplacer.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    run_id = _run(SqlProfileStore(make_session_factory(engine)), loss_of_a=0.3)
    engine.dispose()

    learned = run("model", "learn", "--format", "json", env=env)
    assert learned.returncode == 0, learned.stderr
    assert json.loads(learned.stdout)["runs"] == [run_id]
    shown = json.loads(run("model", "show", "--format", "json", env=env).stdout)
    assert shown["observations"] == 40 and shown["last_run_id"] == run_id
    by_guest = {g["guest"]: g for g in shown["guests"]}
    assert by_guest["a"]["sensitivity"] > by_guest["b"]["sensitivity"]

    bad = run("model", "learn", "--run", "999", env=env)
    assert bad.returncode == 2 and "999" in bad.stderr


def _replica_run(store: SqlProfileStore, loss: float = 0.3, rounds: int = 20) -> int:
    """web-1 and web-2 each lose `loss` to noisy-1 beside them in the LLC; they cost it nothing."""
    run = store.start_run("h1", "cpu", {})
    samples = []
    for i in range(rounds):
        t = 100.0 + i
        for web in ("web-1", "web-2"):
            samples.append(ProfileSample(web, "zeta", "cpu", 1.0 - loss, 0.01, 10.0, t))
            samples.append(ProfileSample(web, "zeta_b", "cpu", 1.0, 0.01, 10.0, t + 0.5,
                                         (Neighbour("noisy-1", "same-llc", True),), freeze_ms=12.0))
        samples.append(ProfileSample("noisy-1", "zeta", "cpu", 1.0, 0.01, 10.0, t))
        samples.append(ProfileSample("noisy-1", "zeta_b", "cpu", 1.0, 0.01, 10.0, t + 0.6,
                                     (Neighbour("web-1", "same-llc", True), Neighbour("web-2", "same-llc", True)),
                                     freeze_ms=12.0))
    store.add_samples(run, samples)
    store.finish_run(run, {})
    return run


def test_replicas_sharing_a_workload_label_are_learned_under_the_key_the_rebalancer_plans_by(tmp_path):
    """Placed replicas (their labels on record) learn one model key through `vmplacer model learn`,
    and the rebalancer's description of them finds the learned coefficient."""
    env = {"VMPLACER_DATA_DIR": str(tmp_path)}
    url = f"sqlite:///{tmp_path / 'vmplacer.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    specs = {
        "web-1": {"labels": {"workload": "web", "workload_class": "batch"}},
        "web-2": {"labels": {"workload": "web", "workload_class": "batch"}},
        "noisy-1": {"labels": {"workload": "stress"}},
    }
    places = SqlPlacementStore(sessions)
    for cpu, (name, extra) in enumerate(specs.items()):
        spec = GuestSpec.from_mapping({"name": name, "vcpus": 1, "memory_mib": 512, **extra})
        places.record("h1", "test:///default", _pinned(name, cpu), spec.to_dict())
    run_id = _replica_run(SqlProfileStore(sessions))

    learned = run("model", "learn", "--format", "json", env=env)
    assert learned.returncode == 0, learned.stderr
    assert json.loads(learned.stdout)["runs"] == [run_id]
    shown = json.loads(run("model", "show", "--format", "json", env=env).stdout)
    assert sorted(g["guest"] for g in shown["guests"]) == ["stress", "web"]

    model, last = SqlModelRepository(sessions).load()
    assert last == run_id
    noisy = describe_guest(_pinned("noisy-1", 2), spec=GuestSpec.from_mapping(places.get("noisy-1")["spec"]))
    for cpu, name in enumerate(("web-1", "web-2")):
        web = describe_guest(_pinned(name, cpu), spec=GuestSpec.from_mapping(places.get(name)["spec"]))
        beta = model.beta(noisy.key, web.key, DistanceClass.SAME_LLC, background_class=noisy.workload_class,
                          foreground_class=web.workload_class)
        assert beta == pytest.approx(0.3, abs=0.02)
    engine.dispose()


def _pinned(name: str, cpu: int) -> Placement:
    return Placement(name, "h1", {0: frozenset({cpu})}, memory_kib=512 * 1024)
