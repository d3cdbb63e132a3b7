"""Model-aware admission on every placement path, against libvirt's test driver (2 nodes × 8
pCPUs, one LLC per node) and a model stored in the database (SQLite and PostgreSQL).

A "noisy" guest runs on node 0 and a "quiet" one on node 1. The topology scorers alone put a
new "victim" next to the noisy one (node 0 comes first); with the stored model, `plan`,
`place` and the API's dry run and placement put it by the quiet one, and `plan --why` shows
the predicted loss of each candidate."""

from __future__ import annotations

import json
import warnings

import pytest

from tests.admission_model import learned
from tests.functional.test_api_helpers import make_container, roomy_test_driver
from vmplacer.adapters.domain_xml import render_domain
from vmplacer.cli.main import main
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.guest_placement import Placement

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

HOST = {"name": "t", "uri": "test:///default", "domain_type": "qemu"}
NEIGHBOURS = (("loud", 0, "noisy"), ("calm", 8, "quiet"))  # name, pCPU, workload class
VICTIM = {"name": "victim", "vcpus": 1, "memory_mib": 64, "cpu_policy": "dedicated",
          "labels": {"workload_class": "victim"}}


@pytest.fixture
def driver():
    with roomy_test_driver() as connection:
        for name, cpu, workload_class in NEIGHBOURS:
            spec = GuestSpec.from_mapping({"name": name, "vcpus": 1, "memory_mib": 64, "cpu_policy": "dedicated",
                                           "labels": {"workload_class": workload_class}})
            placement = Placement(guest=name, host="t", vcpupin={0: frozenset({cpu})}, emulatorpin=frozenset({cpu}),
                                  memory_nodes=frozenset({cpu // 8}), memory_kib=64 * 1024, dedicated=True,
                                  exclusive_cpus=frozenset({cpu}))
            connection.defineXML(render_domain(spec, placement, domain_type="qemu")).create()
        yield connection


def _container(database_url, tmp_path, with_model: bool):
    container = make_container(database_url, tmp_path, [HOST])
    if with_model:
        container.model_repository.save(learned(), None)
    return container


def _node(pins: dict) -> int:
    cpus = {c for cs in pins.values() for c in cs}
    assert len(cpus) == 1, pins
    return next(iter(cpus)) // 8


def _plan(tmp_path, database_url, capsys, *extra: str) -> tuple[int, dict]:
    config = tmp_path / "vmplacer.yaml"
    config.write_text(json.dumps({"data_dir": str(tmp_path), "database_url": database_url, "hosts": [HOST]}))
    request = tmp_path / "request.yaml"
    request.write_text(json.dumps({"guests": [VICTIM]}))
    capsys.readouterr()
    code = main(["--config", str(config), "plan", "--host", "t", "--request", str(request), *extra])
    return code, capsys.readouterr()


@pytest.mark.parametrize("with_model", [False, True], ids=["no-model", "model"])
def test_plan_why_shows_predicted_loss_per_candidate(driver, database_url, tmp_path, capsys, with_model):
    _container(database_url, tmp_path, with_model).close()
    code, out = _plan(tmp_path, database_url, capsys, "--why", "--format", "json")
    assert code == 0, out.err
    entry = json.loads(out.out)["placements"][0]
    why = entry["why"]
    chosen = [c for c in why["candidates"] if c["chosen"]]
    assert len(chosen) == 1 and chosen[0]["vcpupin"] == entry["vcpupin"]
    if not with_model:
        assert why["model"] == "no data (topology only)" and why["identity"] is None
        assert all(c["predicted_loss"] is None for c in why["candidates"])
        assert _node(entry["vcpupin"]) == 0  # topology only: next to the noisy guest
        return
    assert why["model"].endswith("observations") and why["weight"] == 1.0
    assert why["identity"]["workload_class"] == "victim" and why["identity"]["levels"]["own"] == 0.0
    assert why["identity"]["key"] == "victim" and why["identity"]["profiled"] is False
    assert why["identity"]["levels"]["class"] > 0.9
    assert _node(entry["vcpupin"]) == 1  # by the quiet guest
    by_node = {}
    for candidate in why["candidates"]:
        loss = candidate["predicted_loss"]
        assert loss["total"] == pytest.approx(loss["guest"] + sum(loss["joined"].values()), abs=2e-4)
        by_node.setdefault(_node(candidate["vcpupin"]), []).append(loss)
    assert min(loss["guest"] for loss in by_node[0]) > 2 * max(loss["guest"] for loss in by_node[1])
    assert "loud" in by_node[0][0]["joined"] and "calm" in by_node[1][0]["joined"]
    assert chosen[0]["score"] == max(c["score"] for c in why["candidates"])

    code, out = _plan(tmp_path, database_url, capsys, "--why")  # the table
    assert code == 0, out.err
    assert "candidates for guest victim (model: " in out.out and "guest loss" in out.out
    assert "predicted as key victim (never profiled), class victim: own 0.00" in out.out
    assert "loud +" in out.out and "calm +" in out.out


def test_plan_without_why_is_unchanged_in_shape(driver, database_url, tmp_path, capsys):
    _container(database_url, tmp_path, True).close()
    code, out = _plan(tmp_path, database_url, capsys, "--format", "json")
    assert code == 0, out.err
    entry = json.loads(out.out)["placements"][0]
    assert "why" not in entry and _node(entry["vcpupin"]) == 1


@pytest.mark.parametrize("with_model", [False, True], ids=["no-model", "model"])
def test_api_dry_run_and_placement_use_the_model(driver, database_url, tmp_path, with_model):
    from vmplacer.adapters.db.api import SqlTokenStore
    from vmplacer.api.app import create_app
    from vmplacer.api.services import ApiOptions

    container = _container(database_url, tmp_path, with_model)
    admin = SqlTokenStore(container.sessions).create("orchestrator", "admin")
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
    expected = 1 if with_model else 0
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {admin}"
            dry = client.post("/v1/placements", json={**VICTIM, "host": "t", "dry_run": True})
            assert dry.status_code == 200, dry.text
            assert _node(dry.json()["placement"]["vcpupin"]) == expected
            real = client.post("/v1/placements", json={**VICTIM, "host": "t"})
            assert real.status_code in (200, 201), real.text
            assert _node(real.json()["placement"]["vcpupin"]) == expected
    finally:
        container.close()


def test_cli_place_uses_the_model(driver, database_url, tmp_path, capsys):
    _container(database_url, tmp_path, True).close()
    config = tmp_path / "vmplacer.yaml"
    config.write_text(json.dumps({"data_dir": str(tmp_path), "database_url": database_url, "hosts": [HOST]}))
    request = tmp_path / "request.yaml"
    request.write_text(json.dumps({"guests": [VICTIM]}))
    capsys.readouterr()
    code = main(["--config", str(config), "place", "--host", "t", "--request", str(request), "--format", "json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert _node(json.loads(out.out)["placements"][0]["vcpupin"]) == 1


def test_a_dry_run_without_a_database_creates_none(tmp_path):
    from vmplacer.bootstrap import Container
    from vmplacer.config import settings_from_mapping

    missing = tmp_path / "nothing-here" / "vmplacer.db"
    settings = settings_from_mapping({"database_url": f"sqlite:///{missing}", "hosts": [HOST]}, "test", environ={})
    container = Container(settings)
    assert container.admission.betas().empty
    assert container.admission.status == "no data (topology only)"
    assert not missing.parent.exists()
    container.close()
