"""`vmplacer reconcile` on a real libvirtd: a guest placed by vmplacer agrees with its record (no
false drift from live XML), and once an operator destroys and undefines it by hand, reconciling
releases its record and exclusive pCPU claims — after the settle window, never inside it."""

from __future__ import annotations

import json
from pathlib import Path

import libvirt
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from tests.support import run_vmplacer
from vmplacer.adapters.db.models import AuditRow, CpuClaimRow
from vmplacer.testbed import guests

pytestmark = pytest.mark.integration


def _vmplacer(config: Path, *args: str) -> tuple[int, dict, str]:
    done = run_vmplacer("--config", str(config), *args)
    return done.returncode, (json.loads(done.stdout) if done.stdout.strip() else {}), done.stderr


def _mine(report: dict, guest: str) -> list[tuple[str, str, str]]:
    """This guest's findings (other people's domains on the shared testbed show up as unmanaged)."""
    return [(f["kind"], f["action"], f["outcome"]) for h in report["hosts"] for f in h["findings"]
            if f["guest"] == guest]


def test_reconcile_releases_a_domain_undefined_by_hand(testbed, host1_conn, tmp_path):
    database = tmp_path / "vmplacer.db"
    config = tmp_path / "vmplacer.yaml"
    config.write_text(f"database_url: sqlite:///{database}\ndata_dir: {tmp_path}\n"
                      f"hosts:\n  - {{name: h1, uri: '{testbed.host1_uri}', domain_type: qemu}}\n")
    name = guests.owned_name("reconcile")
    request = tmp_path / "req.yaml"
    request.write_text(f"guests:\n  - {{name: {name}, vcpus: 1, memory_mib: 64, cpu_policy: dedicated}}\n")
    engine = create_engine(f"sqlite:///{database}")
    try:
        code, placed, err = _vmplacer(config, "place", "--request", str(request), "--start", "--format", "json")
        assert code == 0, (err, placed)
        claimed = placed["placements"][0]["exclusive_cpus"]
        assert placed["placements"][0]["state"] == "running" and claimed

        # as placed: the live domain (pinning read from its live XML) agrees with the record
        code, report, err = _vmplacer(config, "reconcile", "--host", "h1", "--settle", "0", "--format", "json")
        assert code == 0, (err, report)
        assert _mine(report, name) == []

        dom = host1_conn.lookupByName(name)  # the operator, by hand
        dom.destroy()
        dom.undefine()

        # just placed: within the default settle window the record is left alone
        code, report, err = _vmplacer(config, "reconcile", "--host", "h1", "--format", "json")
        assert code == 0, (err, report)
        assert _mine(report, name) == [("settling", "none", "reported")]

        code, report, err = _vmplacer(config, "reconcile", "--host", "h1", "--settle", "0s", "--format", "json")
        assert code == 0, (err, report)
        assert report["status"] == "complete" and report["hosts"][0]["status"] == "reconciled"
        assert _mine(report, name) == [("gone", "release", "applied")]
        assert report["released"] == 1

        code, listed, err = _vmplacer(config, "placements", "--format", "json")
        assert code == 0, (err, listed)
        assert name not in {p["guest"] for p in listed}
        with Session(engine) as session:
            assert session.scalars(select(CpuClaimRow)).all() == [], "the released claims must be gone"
            audit = session.scalars(select(AuditRow).where(AuditRow.action == "reconcile")).all()
            assert [(a.guest, a.host, a.outcome, a.detail["kind"]) for a in audit] == [(name, "h1", "ok", "gone")]
            assert audit[0].detail["placement"]["exclusive_cpus"] == claimed
    finally:
        engine.dispose()
        try:
            dom = host1_conn.lookupByName(name)
        except libvirt.libvirtError:
            dom = None
        if dom is not None:
            if dom.isActive():
                dom.destroy()
            dom.undefine()


def test_reconcile_moves_the_record_of_a_guest_migrated_by_hand(testbed, host1_conn, host2_conn, tmp_path):
    from vmplacer.testbed import daemons

    database = tmp_path / "vmplacer.db"
    config = tmp_path / "vmplacer.yaml"
    config.write_text(f"database_url: sqlite:///{database}\ndata_dir: {tmp_path}\nhosts:\n"
                      f"  - {{name: h1, uri: '{testbed.host1_uri}', domain_type: qemu}}\n"
                      f"  - {{name: h2, uri: '{testbed.host2_uri}', domain_type: qemu}}\n")
    name = guests.owned_name("reconcile-moved")
    request = tmp_path / "req.yaml"
    request.write_text(f"guests:\n  - {{name: {name}, vcpus: 1, memory_mib: 96, cpu_policy: dedicated}}\n")
    try:
        code, placed, err = _vmplacer(config, "place", "--host", "h1", "--request", str(request), "--start",
                                      "--format", "json")
        assert code == 0, (err, placed)
        dom = host1_conn.lookupByName(name)  # the operator moves it by hand, as `virsh migrate --live` would
        dom.migrate3(host2_conn, {libvirt.VIR_MIGRATE_PARAM_URI: daemons.MIGRATE_URI},
                     libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PERSIST_DEST
                     | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE)
        live_pins = host2_conn.lookupByName(name).vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE)

        code, report, err = _vmplacer(config, "reconcile", "--host", "h1", "--settle", "0", "--format", "json")
        assert code == 0, (err, report)
        assert _mine(report, name) == [("moved", "follow", "applied")]
        assert report["followed"] == 1 and report["released"] == 0

        code, listed, err = _vmplacer(config, "placements", "--format", "json")
        assert code == 0, (err, listed)
        record = next(p for p in listed if p["guest"] == name)
        assert record["host"] == "h2"
        pinned = {i for i, allowed in enumerate(live_pins[0]) if allowed}
        assert set(record["placement"]["vcpupin"]["0"]) == pinned, (record, live_pins)
        assert record["claims"] == sorted(pinned) and record["state"] == "running"
    finally:
        for conn in (host1_conn, host2_conn):
            try:
                dom = conn.lookupByName(name)
            except libvirt.libvirtError:
                continue
            if dom.isActive():
                dom.destroy()
            dom.undefine()


def _iothread_pins(uri: str, name: str) -> dict[int, frozenset[int]]:
    """IOThread -> pCPUs as `virsh iothreadinfo` prints them (an independent client)."""
    import subprocess

    from vmplacer.core.topology.cpuset import parse_cpuset

    out = subprocess.run(["virsh", "-c", uri, "iothreadinfo", name], capture_output=True, text=True,
                         check=True).stdout
    pins = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            pins[int(parts[0])] = parse_cpuset(parts[1])
    return pins


def test_a_guest_pinned_by_hand_onto_an_owned_pcpu_is_named_and_pinned_back(testbed, host1_conn, tmp_path):
    """The operator's `virsh vcpupin` puts a shared guest on a dedicated guest's pCPU: reconcile's
    dry run names the drift and the isolation violation, the real run pins it back as recorded
    (read back with virsh), and the next run finds nothing."""
    from tests.integration.test_place_live import _virsh_vcpupin

    config = tmp_path / "vmplacer.yaml"
    config.write_text(f"data_dir: {tmp_path}\nhosts:\n  - {{name: h1, uri: '{testbed.host1_uri}', domain_type: qemu}}\n")
    owner, shared = guests.owned_name("rc-owner"), guests.owned_name("rc-shared")
    request = tmp_path / "req.yaml"
    (tmp_path / "shared.xml").write_text(  # a caller's document with an IOThread, which floats with the emulator
        f"<domain type='qemu'><name>{shared}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>"
        "<iothreads>1</iothreads><os><type arch='x86_64'>hvm</type></os></domain>\n")
    request.write_text(f"guests:\n  - {{name: {owner}, vcpus: 1, memory_mib: 64, cpu_policy: dedicated}}\n"
                       f"  - {{name: {shared}, vcpus: 1, memory_mib: 64, base_xml: shared.xml}}\n")
    try:
        code, placed, err = _vmplacer(config, "place", "--request", str(request), "--start", "--format", "json")
        assert code == 0, (err, placed)
        by_guest = {p["guest"]: p for p in placed["placements"]}
        owned = set(by_guest[owner]["exclusive_cpus"])
        recorded = {int(v): frozenset(c) for v, c in by_guest[shared]["vcpupin"].items()}
        assert owned and not recorded[0] & owned

        onto = str(min(owned))
        import subprocess
        subprocess.run(["virsh", "-c", testbed.host1_uri, "vcpupin", shared, "0", onto, "--live"], check=True,
                       capture_output=True)
        emulator = _iothread_pins(testbed.host1_uri, shared)
        assert set(emulator) == {1} and not emulator[1] & owned, emulator
        subprocess.run(["virsh", "-c", testbed.host1_uri, "iothreadpin", shared, "1", onto, "--live"],
                       check=True, capture_output=True)

        code, report, err = _vmplacer(config, "reconcile", "--host", "h1", "--settle", "0", "--dry-run",
                                      "--format", "json")
        assert code == 0, (err, report)
        assert sorted(_mine(report, shared)) == [("drifted", "restore", "would-apply"),
                                                 ("isolation", "none", "reported"), ("isolation", "none", "reported")]
        details = sorted(f["detail"] for h in report["hosts"] for f in h["findings"]
                         if f["guest"] == shared and f["kind"] == "isolation")
        assert all(f"exclusive to guest {owner}" in d for d in details), details
        assert [d for d in details if "iothread 1" in d] and [d for d in details if "vCPU 0" in d], details
        drift = next(f["detail"] for h in report["hosts"] for f in h["findings"]
                     if f["guest"] == shared and f["kind"] == "drifted")
        assert "IOThread pins 1→" in drift, drift
        assert _virsh_vcpupin(testbed.host1_uri, shared)[0] == frozenset({int(onto)}), "a dry run changed it"

        code, report, err = _vmplacer(config, "reconcile", "--host", "h1", "--settle", "0", "--format", "json")
        assert code == 0, (err, report)
        assert ("drifted", "restore", "applied") in _mine(report, shared) and report["restored"] == 1
        assert _virsh_vcpupin(testbed.host1_uri, shared) == recorded
        assert _iothread_pins(testbed.host1_uri, shared) == emulator

        code, report, err = _vmplacer(config, "reconcile", "--host", "h1", "--settle", "0", "--format", "json")
        assert code == 0 and _mine(report, shared) == [] and _mine(report, owner) == [], report
    finally:
        for name in (shared, owner):
            try:
                dom = host1_conn.lookupByName(name)
            except libvirt.libvirtError:
                continue
            if dom.isActive():
                dom.destroy()
            dom.undefine()
