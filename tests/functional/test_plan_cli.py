"""`vmplacer plan` through the real console script: JSON contract, table, exit codes 0/2/3."""

from __future__ import annotations

import json
import subprocess
from itertools import combinations
from pathlib import Path

import pytest

from tests.support import require, run_vmplacer
from vmplacer.adapters.domain_xml import parse_placement
from vmplacer.adapters.request_file import load_request_file
from vmplacer.app.place.fleet_planner import FleetHost
from vmplacer.cli.fleet_plan import plan_on
from vmplacer.core.placement.occupancy import exclusive_of
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import uniform_topology

ROOT = Path(__file__).resolve().parents[2]
XEON = ROOT / "examples" / "hosts" / "xeon-2s-56c-smt2.xml"
MIXED = ROOT / "examples" / "requests" / "mixed.yaml"
PLACEMENT_KEYS = {"guest", "host", "vcpupin", "emulatorpin", "memory_nodes", "mem_mode", "score", "xml"}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer("plan", *args)


def plan_json(*args: str) -> tuple[int, dict]:
    result = run(*args, "--format", "json")
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def test_example_request_json_contract():
    code, data = plan_json("--caps", str(XEON), "--request", str(MIXED))
    assert code == 0 and data["errors"] == []
    names = [r.spec.name for r in load_request_file(MIXED)]
    assert [p["guest"] for p in data["placements"]] == names  # file order
    placements = []
    for entry in data["placements"]:
        assert PLACEMENT_KEYS <= set(entry)
        assert entry["host"] == "xeon-2s-56c-smt2"
        parsed = parse_placement(entry["xml"], entry["host"])
        assert {str(v): sorted(c) for v, c in parsed.vcpupin.items()} == entry["vcpupin"]
        assert sorted(parsed.emulatorpin) == entry["emulatorpin"]
        assert sorted(parsed.memory_nodes) == entry["memory_nodes"]
        assert parsed.mem_mode == entry["mem_mode"] and parsed.score == entry["score"]
        placements.append(parsed)
    for a, b in combinations(placements, 2):  # owned pCPUs are nobody else's
        assert not exclusive_of(a) & (b.pcpus | b.emulatorpin), (a.guest, b.guest)
        assert not exclusive_of(b) & (a.pcpus | a.emulatorpin), (b.guest, a.guest)
    by_name = {p.guest: p for p in placements}
    assert not by_name["db1"].memory_nodes & by_name["db2"].memory_nodes  # anti-affinity
    assert by_name["analytics1"].memory_nodes == {0, 1} and len(by_name["analytics1"].cells) == 2
    assert by_name["db1"].hugepage_kib == 1048576 and by_name["web1"].hugepage_kib == 2048


def test_table_output_shows_pinning_and_xml_on_request(tmp_path):
    result = run("--caps", str(XEON), "--request", str(MIXED))
    assert result.returncode == 0, result.stderr
    assert "placement plan for host xeon-2s-56c-smt2 (dry run)" in result.stdout
    assert "<domain " not in result.stdout  # the table alone
    result = run("--caps", str(XEON), "--request", str(MIXED), "--xml", "--xml-dir", str(tmp_path / "xml"))
    assert result.returncode == 0, result.stderr
    for name in ("db1", "web1", "analytics1"):
        assert name in result.stdout
        assert f"<!-- domain XML of guest {name} -->" in result.stdout
        written = (tmp_path / "xml" / f"{name}.xml").read_text()
        assert f"<name>{name}</name>" in written and written in result.stdout
    assert result.stdout.count("<domain ") == len(load_request_file(MIXED))
    refused = run("--caps", str(XEON), "--request", str(MIXED), "--xml", "--format", "json")
    assert refused.returncode == 2 and "--xml" in refused.stderr


def test_guest_that_does_not_fit_is_an_error_and_later_guests_are_placed(tmp_path):
    request = tmp_path / "guests.yaml"
    request.write_text("""
guests:
  - {name: small1, vcpus: 2, memory_mib: 1024, cpu_policy: dedicated}
  - {name: giant, vcpus: 60, memory_mib: 1024, cpu_policy: dedicated, thread_policy: isolate, numa_nodes: 1}
  - {name: small2, vcpus: 2, memory_mib: 1024, cpu_policy: dedicated}
""")
    code, data = plan_json("--caps", str(XEON), "--request", str(request))
    assert code == 3  # a guest that does not fit: an answer, not an operational failure (exit 1)
    assert [p["guest"] for p in data["placements"]] == ["small1", "small2"]
    (error,) = data["errors"]
    assert (error["index"], error["guest"], error["kind"]) == (1, "giant", "no-fit")
    assert {r["constraint"] for r in error["reasons"]} == {"whole-cores"}
    assert {r["where"] for r in error["reasons"]} == {"cell 0 on node 0", "cell 0 on node 1"}
    result = run("--caps", str(XEON), "--request", str(request))
    assert result.returncode == 3 and "guest #1 (giant): guest giant does not fit" in result.stderr


def test_base_xml_is_merged_and_a_bad_one_exits_2(tmp_path):
    """--caps: the storage path is libvirt's default pool; a disk elsewhere is refused by the policy."""
    disk = ("<domain type='qemu'><name>x</name><devices><disk type='file' device='disk'>"
            "<source file='{}'/><target dev='vda' bus='virtio'/></disk></devices></domain>")
    (tmp_path / "good.xml").write_text(disk.format("/var/lib/libvirt/images/a.img"))
    (tmp_path / "bad.xml").write_text("<domain type='qemu'><name>y</name><on_crash>explode</on_crash></domain>")
    (tmp_path / "outside.xml").write_text(disk.format("/srv/a.img"))
    request = tmp_path / "guests.yaml"
    request.write_text("""
guests:
  - {name: good, vcpus: 1, memory_mib: 256, base_xml: good.xml}
  - {name: bad, vcpus: 1, memory_mib: 256, base_xml: bad.xml}
  - {name: outside, vcpus: 1, memory_mib: 256, base_xml: outside.xml}
""")
    code, data = plan_json("--caps", str(XEON), "--request", str(request))
    assert code == 2
    (placed,) = data["placements"]
    assert placed["guest"] == "good" and "/var/lib/libvirt/images/a.img" in placed["xml"]
    assert "<domain type=\"qemu\">" in placed["xml"]
    bad, outside = data["errors"]
    assert bad["guest"] == "bad" and bad["kind"] == "invalid-xml" and "does not validate" in bad["message"]
    assert outside["guest"] == "outside" and outside["kind"] == "xml-policy"
    assert outside["reasons"] == [{"element": "/domain/devices/disk/source", "attribute": "file",
                                   "rule": "source-path", "reason": outside["reasons"][0]["reason"]}]
    assert "/srv/a.img is outside the storage paths" in outside["reasons"][0]["reason"]


@pytest.mark.parametrize("args, fragment", [
    (["--caps", "/nonexistent.xml", "--request", str(MIXED)], "--caps /nonexistent.xml: no such file"),
    (["--caps", str(XEON), "--request", "/nonexistent.yaml"], "/nonexistent.yaml: file not found"),
    (["--caps", str(XEON), "--host", "h", "--request", str(MIXED)], "not allowed with argument"),
    (["--caps", str(XEON)], "--request"),
])
def test_usage_errors_exit_2(args, fragment):
    result = run(*args)
    assert result.returncode == 2 and fragment in result.stderr


def test_bad_request_file_names_file_guest_and_field(tmp_path):
    request = tmp_path / "guests.yaml"
    request.write_text("guests:\n  - {name: db1, vcpus: x, memory_mib: 1024}\n")
    result = run("--caps", str(XEON), "--request", str(request))
    assert result.returncode == 2
    assert f"{request}: guest #0 (db1): field vcpus: must be an integer 1..1024, got 'x'" in result.stderr


def test_default_host_counts_its_existing_domains():
    """No --host/--caps: the first configured host (built-in default: the example host, whose
    domains are libvirt's test driver's)."""
    try:
        import libvirt  # noqa: F401
        available = True
    except ImportError:
        available = False
    require(available, "libvirt-python is not installed")
    code, data = plan_json("--request", str(MIXED))
    assert data["host"] == "example"
    assert code == 0 and data["errors"] == []
    assert [p["guest"] for p in data["placements"]] == [r.spec.name for r in load_request_file(MIXED)]
    # The test driver's running domain 'test' floats: counted as occupied, its vCPUs narrow to
    # what the planned guests leave shared.
    (repin,) = data["repins"]
    assert repin["guest"] == "test"
    owned = {c for p in data["placements"] for cpus in p["vcpupin"].values() for c in cpus
             if p["guest"] in ("db1", "db2", "analytics1")}
    assert owned and not owned & {c for cpus in repin["vcpupin"].values() for c in cpus}
    assert run("--host", "nope", "--request", str(MIXED)).returncode == 2


def test_existing_domains_are_avoided_and_floating_ones_repinned(tmp_path):
    topology = uniform_topology(nodes=1, cores_per_node=8, name="h")
    pinned = Placement(guest="old-pinned", host="h", vcpupin={0: frozenset({0}), 1: frozenset({1})},
                       dedicated=True, memory_kib=1024 * 1024)
    floating = Placement(guest="old-floating", host="h", vcpupin={0: frozenset(range(2, 8))},
                         emulatorpin=frozenset(range(2, 8)), memory_kib=1024 * 1024)
    request = tmp_path / "guests.yaml"
    request.write_text("guests:\n  - {name: new, vcpus: 2, memory_mib: 1024, cpu_policy: dedicated}\n")
    result = plan_on([FleetHost("h", topology, [pinned, floating])], load_request_file(request))
    (placed,) = result["placements"]
    owned = {c for cpus in placed["vcpupin"].values() for c in cpus}
    assert not owned & {0, 1}
    repins = {r["guest"]: r for r in result["repins"]}
    repin = repins["old-floating"]
    assert repin["host"] == "h"
    assert set(repin["vcpupin"]["0"]) == set(range(2, 8)) - owned
    assert set(repin["emulatorpin"]) == set(range(2, 8)) - owned
    # old-pinned's emulator threads ran anywhere (no emulatorpin): they keep to its own pCPUs now
    assert set(repins) == {"old-floating", "old-pinned"}
    assert set(repins["old-pinned"]["emulatorpin"]) == {0, 1}
