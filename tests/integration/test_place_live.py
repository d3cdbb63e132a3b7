"""`vmplacer place` on a real libvirtd: what libvirt reports (read with virsh, an
independent client) is what vmplacer planned, and racing `place` processes never
double-book a pCPU."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import libvirt
import pytest

from tests.support import VMPLACER, clean_env, run_vmplacer
from vmplacer.core.cpuset import parse_cpuset

pytestmark = pytest.mark.integration


def _config(tmp_path: Path, uri: str) -> Path:
    config = tmp_path / "vmplacer.yaml"
    config.write_text(
        f"data_dir: {tmp_path}\nhosts:\n  - {{name: h1, uri: '{uri}', domain_type: qemu}}\n"
    )
    return config


def _vmplacer(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer("--config", str(config), *args, timeout=180)


def _virsh_vcpupin(uri: str, name: str) -> dict[int, frozenset[int]]:
    out = subprocess.run(["virsh", "-c", uri, "vcpupin", name], capture_output=True, text=True,
                         check=True).stdout
    pins = {}
    for line in out.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) == 2 and parts[0].isdigit():
            pins[int(parts[0])] = parse_cpuset(parts[1])
    return pins


def _cleanup(conn: libvirt.virConnect, names: list[str]) -> None:
    for name in names:
        try:
            dom = conn.lookupByName(name)
        except libvirt.libvirtError:
            continue
        if dom.isActive():
            dom.destroy()
        dom.undefine()


def test_place_defines_and_starts_what_it_planned(testbed, host1_conn, tmp_path):
    config = _config(tmp_path, testbed.host1_uri)
    name = f"vmpt-{os.getpid()}-place"
    request = tmp_path / "req.yaml"
    request.write_text(
        f"guests:\n  - {{name: {name}, vcpus: 1, memory_mib: 64, cpu_policy: dedicated}}\n"
    )
    try:
        result = _vmplacer(config, "place", "--request", str(request), "--start", "--format", "json")
        assert result.returncode == 0, result.stderr
        placed = json.loads(result.stdout)["placements"][0]
        assert placed["state"] == "running"
        planned = {int(v): frozenset(c) for v, c in placed["vcpupin"].items()}
        assert _virsh_vcpupin(testbed.host1_uri, name) == planned
        numatune = subprocess.run(["virsh", "-c", testbed.host1_uri, "numatune", name],
                                  capture_output=True, text=True, check=True).stdout
        assert "strict" in numatune
        assert parse_cpuset(numatune.split("numa_nodeset")[1].split(":")[1].strip()) == set(
            placed["memory_nodes"])
        # recorded, with its exclusive pCPU claimed
        listing = json.loads(_vmplacer(config, "placements", "--format", "json").stdout)
        assert [(p["guest"], p["state"], p["claims"]) for p in listing] == [
            (name, "running", sorted(set().union(*planned.values())))]
        # placing it again is refused by name, nothing changes on the host
        again = _vmplacer(config, "place", "--request", str(request), "--format", "json")
        assert again.returncode == 3  # a NoFit (already placed)
        assert "already placed" in json.loads(again.stdout)["errors"][0]["message"]
        assert host1_conn.lookupByName(name).isActive()
    finally:
        _cleanup(host1_conn, [name])


def test_concurrent_place_calls_never_double_book(testbed, host1_conn, tmp_path):
    config = _config(tmp_path, testbed.host1_uri)
    assert _vmplacer(config, "db", "upgrade").returncode == 0
    names = [f"vmpt-{os.getpid()}-race{i}" for i in range(6)]
    procs = []
    for name in names:
        request = tmp_path / f"{name}.yaml"
        request.write_text(
            f"guests:\n  - {{name: {name}, vcpus: 1, memory_mib: 64, cpu_policy: dedicated}}\n")
        procs.append(subprocess.Popen(
            [VMPLACER, "--config", str(config), "place", "--request", str(request), "--format", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()))
    try:
        outcomes = [(p.wait(timeout=180), p.stdout.read(), p.stderr.read()) for p in procs]
        placed = []
        for code, out, err in outcomes:
            data = json.loads(out)
            assert code in (0, 1, 3), err  # 1: a lost claim race, 3: no fit
            placed.extend(data["placements"])
            for error in data["errors"]:
                assert error["kind"] in ("no-fit", "conflict"), error
        assert placed, [o[2] for o in outcomes]
        owned = [frozenset(set().union(*map(set, p["vcpupin"].values()))) for p in placed]
        for i, a in enumerate(owned):
            for b in owned[i + 1:]:
                assert not a & b, f"double-booked pCPUs {sorted(a & b)}"
        # libvirt agrees, and nothing is defined for the guests that lost
        defined = {d.name() for d in host1_conn.listAllDomains()}
        assert {p["guest"] for p in placed} <= defined
        assert not (set(names) - {p["guest"] for p in placed}) & defined
        for p in placed:
            live = set().union(*_virsh_vcpupin(testbed.host1_uri, p["guest"]).values())
            assert live == set().union(*map(set, p["vcpupin"].values()))
    finally:
        _cleanup(host1_conn, names)
