"""`vmplacer plan` keeps a new guest off the node of a defined guest whose record refuses it,
as `place` does (libvirt's test driver, 2 nodes × 8 pCPUs; SQLite and PostgreSQL)."""

from __future__ import annotations

import json

import pytest

from tests.functional.test_api_helpers import roomy_test_driver
from vmplacer.cli.main import main

HOST = {"name": "t", "uri": "test:///default", "domain_type": "qemu"}
DEDICATED = {"vcpus": 1, "memory_mib": 64, "cpu_policy": "dedicated"}


@pytest.fixture
def config(database_url, tmp_path):
    with roomy_test_driver():
        path = tmp_path / "vmplacer.yaml"
        path.write_text(json.dumps({"data_dir": str(tmp_path), "database_url": database_url, "hosts": [HOST]}))
        yield path


def _run(config, capsys, tmp_path, command: str, guest: dict) -> dict:  # type: ignore[no-untyped-def]
    request = tmp_path / f"{guest['name']}.yaml"
    request.write_text(json.dumps({"guests": [guest]}))
    capsys.readouterr()
    code = main(["--config", str(config), command, "--host", "t", "--request", str(request), "--format", "json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    (placed,) = json.loads(out.out)["placements"]
    return placed


def _node(placed: dict) -> int:
    cpus = {c for cs in placed["vcpupin"].values() for c in cs}
    assert len(cpus) == 1, placed
    return next(iter(cpus)) // 8


def test_plan_honours_the_refusal_of_a_defined_guest_on_record(config, capsys, tmp_path):
    first = _run(config, capsys, tmp_path, "place", {"name": "first", **DEDICATED, "anti_affinity": ["later"]})
    bulk = _run(config, capsys, tmp_path, "place", {"name": "bulk", **DEDICATED, "vcpus": 4})
    assert {c // 8 for cs in bulk["vcpupin"].values() for c in cs} == {1 - _node(first)}
    free = _run(config, capsys, tmp_path, "plan", {"name": "free", **DEDICATED})
    assert _node(free) == _node(first)  # the control: a guest nobody refuses goes to the emptier node
    later = _run(config, capsys, tmp_path, "plan", {"name": "later", **DEDICATED})
    assert _node(later) != _node(first)
    placed = _run(config, capsys, tmp_path, "place", {"name": "later", **DEDICATED})
    assert _node(placed) == _node(later)


def test_plan_and_place_honour_a_refusal_written_in_a_domain_no_record_keeps(config, capsys, tmp_path):
    """A database restored from before `first` was placed (or a second deployment on the same
    host) has no record of its rule; the rule in first's domain XML still keeps `later` off
    its node."""
    first = _run(config, capsys, tmp_path, "place", {"name": "first", **DEDICATED, "anti_affinity": ["later"]})
    _run(config, capsys, tmp_path, "place", {"name": "bulk", **DEDICATED, "vcpus": 4})
    elsewhere = tmp_path / "restored"
    elsewhere.mkdir()
    restored = elsewhere / "vmplacer.yaml"
    restored.write_text(json.dumps({"data_dir": str(elsewhere), "database_url": f"sqlite:///{elsewhere / 'v.db'}",
                                    "hosts": [HOST]}))
    assert main(["--config", str(restored), "db", "upgrade"]) == 0
    free = _run(restored, capsys, tmp_path, "plan", {"name": "free", **DEDICATED})
    assert _node(free) == _node(first)  # the control: a guest nobody refuses goes to the emptier node
    later = _run(restored, capsys, tmp_path, "plan", {"name": "later", **DEDICATED})
    assert _node(later) != _node(first)
    placed = _run(restored, capsys, tmp_path, "place", {"name": "later", **DEDICATED})
    assert _node(placed) == _node(later)
