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
from vmplacer.core.topology.cpuset import parse_cpuset

pytestmark = pytest.mark.integration


def _config(tmp_path: Path, uri: str) -> Path:
    config = tmp_path / "vmplacer.yaml"
    config.write_text(
        f"data_dir: {tmp_path}\nhosts:\n  - {{name: h1, uri: '{uri}', domain_type: qemu}}\n"
    )
    return config


def _vmplacer(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer("--config", str(config), *args, timeout=180)


def _virsh_vcpupin(uri: str, name: str, *flags: str) -> dict[int, frozenset[int]]:
    out = subprocess.run(["virsh", "-c", uri, "vcpupin", name, *flags], capture_output=True, text=True,
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


def _virsh_emulatorpin(uri: str, name: str, *flags: str) -> frozenset[int]:
    out = subprocess.run(["virsh", "-c", uri, "emulatorpin", name, *flags], capture_output=True, text=True,
                         check=True).stdout
    line = next(line for line in out.splitlines() if line.strip().startswith("*:"))
    return frozenset(parse_cpuset(line.split(":", 1)[1].strip()))


@pytest.mark.parametrize("requests", ["two", "one"])
def test_a_dedicated_guest_after_a_shared_one_keeps_every_thread_of_it_off_its_pcpu(
        testbed, host1_conn, tmp_path, requests):
    """Read with virsh: the shared guest's vCPUs and emulator threads leave the pCPU the dedicated
    guest owns, live and in the persistent config; the records and `place`'s answer say the same."""
    config = _config(tmp_path, testbed.host1_uri)
    shared, owner = f"vmpt-{os.getpid()}-{requests}-floats", f"vmpt-{os.getpid()}-{requests}-owns"
    guests = [f"  - {{name: {shared}, vcpus: 1, memory_mib: 64}}\n",
              f"  - {{name: {owner}, vcpus: 1, memory_mib: 64, cpu_policy: dedicated}}\n"]
    files = ([tmp_path / "shared.yaml", tmp_path / "owner.yaml"] if requests == "two" else [tmp_path / "both.yaml"])
    if requests == "two":
        files[0].write_text("guests:\n" + guests[0])
        files[1].write_text("guests:\n" + guests[1])
    else:
        files[0].write_text("guests:\n" + "".join(guests))
    try:
        answers = []
        for request in files:
            result = _vmplacer(config, "place", "--request", str(request), "--start", "--format", "json")
            assert result.returncode == 0, result.stderr
            answers.append(json.loads(result.stdout))
        listing = {p["guest"]: p for p in json.loads(_vmplacer(config, "placements", "--format", "json").stdout)}
        owned = frozenset(listing[owner]["claims"])
        assert owned
        live_pins = _virsh_vcpupin(testbed.host1_uri, shared)
        live_emulator = _virsh_emulatorpin(testbed.host1_uri, shared)
        assert live_pins[0] and not live_pins[0] & owned, live_pins
        assert live_emulator and not live_emulator & owned, live_emulator
        # the persistent definition too: a restart of the guest keeps it off the owned pCPU
        assert not _virsh_emulatorpin(testbed.host1_uri, shared, "--config") & owned
        config_pins = _virsh_vcpupin(testbed.host1_uri, shared, "--config")
        assert config_pins == live_pins, (config_pins, live_pins)
        # records = what libvirt says
        record = listing[shared]["placement"]
        assert {int(v): frozenset(c) for v, c in record["vcpupin"].items()} == live_pins
        assert frozenset(record["emulatorpin"]) == live_emulator
        # `place` answered with the final pins of the guest it narrowed
        reported = {p["guest"]: p for answer in answers for p in answer["placements"]}
        if requests == "two":
            narrowed = answers[1]["placements"][0]["narrowed_pins"]
            assert [(n["guest"], n["vcpupin"], n["emulatorpin"]) for n in narrowed] == [
                (shared, record["vcpupin"], record["emulatorpin"])]
        else:
            assert reported[shared]["vcpupin"] == record["vcpupin"]
            assert reported[shared]["emulatorpin"] == record["emulatorpin"]
        assert all(not p.get("isolation_violations") for p in reported.values())
    finally:
        _cleanup(host1_conn, [owner, shared])
