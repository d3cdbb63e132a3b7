"""`vmplacer plan` and `place` over several hosts: the host per guest, why the others were
refused, offline fleets of capabilities files, maintenance, and no domain replaced by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import require, run_vmplacer


ROOT = Path(__file__).resolve().parents[2]
BIG = ROOT / "examples" / "hosts" / "xeon-2s-56c-smt2.xml"  # 2 sockets, 56 CPUs and 192 GiB each
SMALL = ROOT / "examples" / "hosts" / "xeon-e3-4c8t.xml"  # 1 socket, 8 CPUs, 32 GiB


def _vmplacer(*args: str, config: Path | None = None) -> tuple[int, dict, str, str]:
    done = run_vmplacer(*(["--config", str(config)] if config else []), *args)
    try:
        data = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    except json.JSONDecodeError:
        data = {}
    return done.returncode, data, done.stdout, done.stderr


def _request(tmp_path: Path, text: str) -> str:
    path = tmp_path / "guests.yaml"
    path.write_text(text)
    return str(path)


GUESTS = ("guests:\n"
          "  - {name: wide, vcpus: 16, memory_mib: 65536, cpu_policy: dedicated}\n"
          "  - {name: small, vcpus: 2, memory_mib: 2048}\n"
          "  - {name: huge, vcpus: 4, memory_mib: 4194304}\n")


def test_plan_on_repeated_caps_files_shows_the_host_of_each_guest_and_why_others_were_refused(tmp_path):
    request = _request(tmp_path, GUESTS)
    code, data, _, err = _vmplacer("plan", "--caps", f"big={BIG}", "--caps", f"small={SMALL}",
                                   "--request", request, "--why", "--format", "json")
    assert code == 3, err  # huge fits nowhere; the others are still placed
    assert data["host"] is None and data["hosts"] == ["big", "small"]
    hosts = {p["guest"]: p["host"] for p in data["placements"]}
    assert hosts["wide"] == "big"  # 16 dedicated vCPUs do not fit 8 CPUs
    wide = next(p for p in data["placements"] if p["guest"] == "wide")
    assert [(o["host"], o["kind"]) for o in wide["others"]] == [("small", "no-fit")]
    small = next(p for p in data["placements"] if p["guest"] == "small")
    assert {o["host"] for o in small["others"]} == {"big", "small"} - {small["host"]}
    (error,) = data["errors"]
    assert error["guest"] == "huge" and error["kind"] == "no-fit"
    assert [(r["host"], r["kind"]) for r in error["refused"]] == [("big", "no-fit"), ("small", "no-fit")]
    assert any(r["constraint"] == "memory" for r in error["reasons"])
    code, _, table, err = _vmplacer("plan", "--caps", f"big={BIG}", "--caps", f"small={SMALL}",
                                    "--request", request, "--why")
    assert code == 3
    assert "placement plan for hosts big, small (dry run)" in table
    assert "guest wide goes to host big; the other hosts:" in table and "host small: no-fit:" in table
    assert "guest huge fits on no candidate host:" in err and "host small: no-fit" in err


def test_a_caps_file_given_twice_needs_names(tmp_path):
    request = _request(tmp_path, "guests:\n  - {name: a, vcpus: 8, memory_mib: 1024, cpu_policy: dedicated}\n"
                                 "  - {name: b, vcpus: 8, memory_mib: 1024, cpu_policy: dedicated}\n")
    code, _, _, err = _vmplacer("plan", "--caps", str(SMALL), "--caps", str(SMALL), "--request", request)
    assert code == 2 and "given twice (name them: NAME=FILE)" in err
    code, data, _, err = _vmplacer("plan", "--caps", f"x={SMALL}", "--caps", f"y={SMALL}",
                                   "--request", request, "--format", "json")
    assert code == 0, err  # one 8-CPU host per guest: the second did not fit the first host's rest
    assert sorted(p["host"] for p in data["placements"]) == ["x", "y"]


@pytest.fixture
def two_hosts(tmp_path) -> Path:
    try:
        import libvirt  # noqa: F401
    except ImportError:
        require(False, "libvirt-python is not installed")
    path = tmp_path / "vmplacer.yaml"
    path.write_text(f"database_url: sqlite:///{tmp_path / 'vmplacer.db'}\ndata_dir: {tmp_path}\n"
                    "hosts:\n"
                    f"  - {{name: big, uri: 'test:///default', domain_type: qemu, capabilities: '{BIG}'}}\n"
                    f"  - {{name: small, uri: 'test:///default', domain_type: qemu, capabilities: '{SMALL}'}}\n")
    return path


def test_plan_all_is_the_fleet_dry_run_and_skips_hosts_in_maintenance(two_hosts, tmp_path):
    request = _request(tmp_path, "guests:\n  - {name: a, vcpus: 2, memory_mib: 1024, cpu_policy: dedicated}\n")
    code, data, _, err = _vmplacer("plan", "--all", "--request", request, "--why", "--format", "json",
                                   config=two_hosts)
    assert code == 0, err
    assert data["hosts"] == ["big", "small"] and data["refused_hosts"] == []
    (placed,) = data["placements"]
    assert {placed["host"]} | {o["host"] for o in placed["others"]} == {"big", "small"}
    code, _, _, err = _vmplacer("hosts", "disable", placed["host"], "--reason", "PSU swap", config=two_hosts)
    assert code == 0, err
    code, data, _, err = _vmplacer("plan", "--all", "--request", request, "--format", "json", config=two_hosts)
    assert code == 0, err
    other = ({"big", "small"} - {placed["host"]}).pop()
    assert [p["host"] for p in data["placements"]] == [other]
    (refused,) = data["refused_hosts"]
    assert refused["host"] == placed["host"] and refused["kind"] == "maintenance" and "PSU swap" in refused["message"]
    code, data, _, err = _vmplacer("plan", "--host", "big", "--host", "small", "--request", request,
                                   "--format", "json", config=two_hosts)
    assert code == 0 and [p["host"] for p in data["placements"]] == [other], err


def test_place_never_replaces_a_domain_of_the_same_name(two_hosts, tmp_path):
    # libvirt's test driver starts with a domain named "test" (on both hosts: they share the driver)
    request = _request(tmp_path, "guests:\n  - {name: test, vcpus: 1, memory_mib: 64}\n")
    code, data, _, err = _vmplacer("place", "--all", "--request", request, "--format", "json", config=two_hosts)
    assert code == 3, err
    assert data["placements"] == []
    (error,) = data["errors"]
    assert error["kind"] == "no-fit" and {r["kind"] for r in error["refused"]} == {"exists"}
    assert any("a domain named test exists" in r["message"] for r in error["refused"])
    code, data, _, err = _vmplacer("plan", "--host", "big", "--request", request, "--format", "json",
                                   config=two_hosts)
    assert code == 3 and data["errors"][0]["refused"][0]["kind"] == "exists", err
    code, listed, _, _ = _vmplacer("placements", "--format", "json", config=two_hosts)
    assert listed == {} or listed == []


def test_placing_a_guest_again_is_refused_as_already_placed(two_hosts, tmp_path):
    request = _request(tmp_path, "guests:\n  - {name: once, vcpus: 1, memory_mib: 64}\n")
    code, data, _, err = _vmplacer("place", "--all", "--request", request, "--format", "json", config=two_hosts)
    assert code == 0, err
    (placed,) = data["placements"]
    assert placed["guest"] == "once" and placed["host"] in ("big", "small") and placed["state"] == "defined"
    code, data, _, err = _vmplacer("place", "--all", "--request", request, "--format", "json", config=two_hosts)
    assert code == 3 and data["placements"] == [], err
    assert "guest once is already placed" in data["errors"][0]["message"]


def _nodes_of(config: Path) -> dict[str, set[int]]:
    """Each recorded guest's host nodes, from its pinned pCPUs (BIG: CPUs 0-27 and 56-83 are node 0)."""
    code, _, out, err = _vmplacer("placements", "--format", "json", config=config)
    assert code == 0, err
    listed = json.loads(out)
    node = lambda cpu: 0 if cpu % 56 < 28 else 1  # noqa: E731
    return {row["guest"]: {node(c) for cpus in row["placement"]["vcpupin"].values() for c in cpus} for row in listed}


def test_anti_affinity_binds_both_ways_within_a_request_and_across_requests(tmp_path):
    config = tmp_path / "vmplacer.yaml"
    config.write_text(f"database_url: sqlite:///{tmp_path / 'vmplacer.db'}\ndata_dir: {tmp_path}\n"
                      f"hosts:\n  - {{name: big, uri: 'test:///default', domain_type: qemu, capabilities: '{BIG}'}}\n")
    dedicated = "vcpus: 2, memory_mib: 1024, cpu_policy: dedicated"
    # `first` refuses `second` (in the same request) and `later` (placed by another request);
    # neither of them names `first`: the refusal is `first`'s alone.
    request = _request(tmp_path, f"guests:\n  - {{name: first, {dedicated}, anti_affinity: [second, later]}}\n"
                                 f"  - {{name: second, {dedicated}}}\n")
    code, data, _, err = _vmplacer("place", "--host", "big", "--request", request, "--format", "json", config=config)
    assert code == 0, err
    request = _request(tmp_path, f"guests:\n  - {{name: later, {dedicated}}}\n  - {{name: free, {dedicated}}}\n")
    code, data, _, err = _vmplacer("place", "--host", "big", "--request", request, "--format", "json", config=config)
    assert code == 0, err
    nodes = _nodes_of(config)
    assert len(nodes["first"]) == 1
    assert not nodes["second"] & nodes["first"], nodes
    assert not nodes["later"] & nodes["first"], nodes
    # the control: a guest nobody refuses packs next to `first`, so the two above moved for the rule
    assert nodes["free"] == nodes["first"], nodes
