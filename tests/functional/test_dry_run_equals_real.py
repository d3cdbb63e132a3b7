"""A dry run decides exactly as the real run, and the records say what libvirt was told.

The same request (examples/requests/mixed.yaml: dedicated, isolate, require, mixed, shared
and two-cell guests, anti-affinity inside the request) goes through `vmplacer plan`,
`vmplacer place`, and the API's dry run and real placement, guest by guest in the order the
batch placed them. Every guest's final pins (vCPUs, emulator threads, memory nodes) must be
the same in all four, and equal to the records. Host: libvirt's test driver with a
two-socket, 112-pCPU machine's capabilities.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.functional.test_api_helpers import admin_client, roomy_test_driver
from tests.support import run_vmplacer

ROOT = Path(__file__).resolve().parents[2]
CAPS = ROOT / "examples" / "hosts" / "xeon-2s-56c-smt2.xml"
REQUEST = ROOT / "examples" / "requests" / "mixed.yaml"
HOST = {"name": "t", "uri": "test:///default", "domain_type": "qemu", "capabilities": str(CAPS)}


def _final(entry: dict[str, Any]) -> tuple:
    return (entry["vcpupin"], entry["emulatorpin"], entry["memory_nodes"])


def _cli(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """plan, then place, then the records, of the whole request on a fresh database."""
    config = tmp_path / "vmplacer.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path), "hosts": [HOST]}))
    results = []
    for args in (("plan", "--request", str(REQUEST)), ("place", "--request", str(REQUEST)), ("placements",)):
        done = run_vmplacer("--config", str(config), *args, "--format", "json")
        assert done.returncode == 0, (args, done.stderr)
        results.append(json.loads(done.stdout))
    return results[0], results[1], results[2]


def test_plan_and_place_decide_alike_and_the_records_say_so(tmp_path):
    planned, placed, records = _cli(tmp_path)
    guests = [g["name"] for g in yaml.safe_load(REQUEST.read_text())["guests"]]
    assert sorted(planned["batch"]["order"]) == sorted(guests)
    by_plan = {p["guest"]: _final(p) for p in planned["placements"]}
    by_place = {p["guest"]: _final(p) for p in placed["placements"]}
    by_record = {r["guest"]: (r["placement"]["vcpupin"], r["placement"]["emulatorpin"],
                              r["placement"]["memory_nodes"]) for r in records}
    assert set(by_plan) == set(guests)
    for guest in guests:
        assert by_plan[guest] == by_place[guest] == by_record[guest], guest
    # the anti-affinity inside the request held: db1 refuses db2's node
    assert not set(by_place["db1"][2]) & set(by_place["db2"][2])


def test_the_api_s_dry_run_and_placement_decide_as_the_cli(database_url, tmp_path):
    cli = tmp_path / "cli"
    cli.mkdir()
    planned, _, _ = _cli(cli)
    by_plan = {p["guest"]: _final(p) for p in planned["placements"]}
    guests = {g["name"]: g for g in yaml.safe_load(REQUEST.read_text())["guests"]}
    with roomy_test_driver(), admin_client(database_url, tmp_path, [HOST]) as api:
        for name in planned["batch"]["order"]:
            body = {**guests[name], "host": "t"}
            dry = api.post("/v1/placements", json={**body, "dry_run": True})
            assert dry.status_code == 200, dry.text
            real = api.post("/v1/placements", json=body)
            assert real.status_code == 201, real.text
            assert dry.json()["placement"] == real.json()["placement"], name
            assert real.json()["isolation_violations"] == []
            for narrowed in real.json()["narrowed_pins"]:  # what it reports is what is recorded
                record = api.get(f"/v1/placements/{narrowed['guest']}").json()["placement"]
                assert (narrowed["vcpupin"], narrowed["emulatorpin"]) == (record["vcpupin"], record["emulatorpin"])
        for name in planned["batch"]["order"]:
            record = api.get(f"/v1/placements/{name}").json()["placement"]
            assert _final(record) == by_plan[name], name
