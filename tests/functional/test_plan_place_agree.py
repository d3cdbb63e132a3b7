"""`plan` and `place` judge a host alike after a domain vmplacer placed is undefined behind its
back: both count the record (its pCPU claims stay in the database), both name it, and once
`vmplacer reconcile` releases it both use its pCPUs again — the same guests, pins and exit code.

Host: libvirt's shared test:///default (2 nodes x 8 pCPUs, its own domain out of the way),
kept alive by the test's connection so that the CLI, run in process, sees what libvirt has;
the domain is undefined through that connection. SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.functional.test_api_helpers import roomy_test_driver
from vmplacer.cli.common import EXIT_NO_FIT, EXIT_OK
from vmplacer.cli.main import main

HOST = {"name": "t", "uri": "test:///default", "domain_type": "qemu"}


@pytest.fixture
def driver(database_url, tmp_path):
    with roomy_test_driver() as connection:
        config = tmp_path / "vmplacer.yaml"
        config.write_text(json.dumps({"data_dir": str(tmp_path), "database_url": database_url, "hosts": [HOST]}))
        yield connection, config


def _request(tmp_path: Path, name: str, guests: dict[str, int]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({"guests": [{"name": guest, "vcpus": vcpus, "memory_mib": 64,
                                            "cpu_policy": "dedicated"} for guest, vcpus in guests.items()]}))
    return path


def _run(capsys, config: Path, *argv: str) -> tuple[int, dict[str, Any], str]:  # type: ignore[no-untyped-def]
    capsys.readouterr()
    code = main(["--config", str(config), *argv, "--format", "json"])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def _judged(data: dict[str, Any]) -> tuple:
    """What a plan and a placement must agree on: each guest's pins, each refusal, the stale records."""
    pins = {p["guest"]: (p["vcpupin"], p["emulatorpin"], p["memory_nodes"]) for p in data["placements"]}
    refused = [(e["guest"], e["kind"], e["message"]) for e in data["errors"]]
    return pins, refused, data["stale_records"]


def _plan_then_place(capsys, config: Path, request: Path) -> tuple:  # type: ignore[no-untyped-def]
    plan_code, planned, plan_err = _run(capsys, config, "plan", "--request", str(request))
    place_code, placed, place_err = _run(capsys, config, "place", "--request", str(request))
    assert plan_code == place_code, (plan_err, place_err)
    assert _judged(planned) == _judged(placed)
    return plan_code, planned, plan_err, place_err


def _cpus(entry: dict[str, Any]) -> set[int]:
    return {cpu for cpus in entry["vcpupin"].values() for cpu in cpus}


def test_plan_and_place_agree_on_a_host_whose_domain_went_away(driver, capsys, tmp_path):
    connection, config = driver
    code, first, err = _run(capsys, config, "place", "--request", str(_request(tmp_path, "db1", {"db1": 4})))
    assert code == EXIT_OK, err
    (db1,) = first["placements"]
    taken = _cpus(db1)
    assert len(taken) == 4 and first["stale_records"] == []

    connection.lookupByName("db1").undefine()  # behind vmplacer's back
    gone = [{"host": "t", "guest": "db1", "state": "defined"}]

    # the same request again: both refuse the name on record, with the same words
    code, planned, plan_err, place_err = _plan_then_place(capsys, config, tmp_path / "db1.yaml")
    assert code == EXIT_NO_FIT and planned["placements"] == []
    (refusal,) = planned["errors"]
    assert "guest db1 is already placed" in refusal["message"] and "host t" in refusal["message"]
    assert planned["stale_records"] == gone
    for err in (plan_err, place_err):
        assert "1 placement record names a domain the host no longer has (db1)" in err, err
        assert "vmplacer reconcile" in err, err

    # two guests of a whole node each: the record still holds 4 pCPUs of one node, so one fits
    pair = _request(tmp_path, "pair", {"a": 8, "b": 8})
    code, planned, _, _ = _plan_then_place(capsys, config, pair)
    assert code == EXIT_NO_FIT and planned["stale_records"] == gone
    (placed,) = planned["placements"]
    (left_out,) = planned["errors"]
    assert not _cpus(placed) & taken, "the stale record's pCPUs stay taken in plan and place alike"
    assert "dedicated-cpus" in left_out["message"], left_out["message"]

    code, report, err = _run(capsys, config, "reconcile", "--settle", "0")
    assert code == EXIT_OK, err
    assert report["released"] == 1, report

    # released: the guest left out now fits on the freed node, in the plan and the placement
    code, planned, plan_err, place_err = _plan_then_place(capsys, config, pair)
    assert planned["stale_records"] == [] and "no longer has" not in plan_err + place_err
    (now,) = planned["placements"]
    assert now["guest"] == left_out["guest"] and _cpus(now) >= taken
    assert [e["guest"] for e in planned["errors"]] == [placed["guest"]]  # placed by the run before
    assert code == EXIT_NO_FIT
