"""The domain XML policy on the other placement paths: `vmplacer place` and `vmplacer plan`
request files (exit 2, before anything is placed), and the placement service's renderer
(the second line: a refused document is never claimed nor defined)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.functional.test_api_helpers import make_container
from tests.support import run_vmplacer
from vmplacer.adapters.capabilities import read_capabilities_file
from vmplacer.adapters.domain_xml_policy import DomainXmlPolicyError
from vmplacer.core.placement.guest import GuestSpec

ROOT = Path(__file__).resolve().parents[2]
XEON_E3 = ROOT / "examples" / "hosts" / "xeon-e3-4c8t.xml"
SHADOW = ("<domain type='qemu'><name>x</name><devices><disk type='file' device='disk'>"
          "<source file='/etc/shadow'/><target dev='vda' bus='virtio'/></disk></devices></domain>")
HOSTDEV = ("<domain type='qemu'><name>x</name><devices><hostdev mode='subsystem' type='pci' managed='yes'>"
           "<source><address domain='0' bus='0' slot='1' function='0'/></source></hostdev></devices></domain>")


def _vmplacer(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer("--config", str(config), *args)


@pytest.fixture
def files(tmp_path):
    config = tmp_path / "vmplacer.yaml"
    config.write_text(f"data_dir: {tmp_path}\nhosts:\n  - {{name: t, uri: 'test:///default', domain_type: qemu}}\n")
    (tmp_path / "shadow.xml").write_text(SHADOW)
    request = tmp_path / "guests.yaml"
    request.write_text("guests:\n  - {name: plain, vcpus: 1, memory_mib: 64}\n"
                       "  - {name: evil, vcpus: 1, memory_mib: 64, base_xml: shadow.xml}\n")
    return config, request


def test_place_refuses_the_whole_request_file_before_placing_anything(files):
    config, request = files
    result = _vmplacer(config, "place", "--host", "t", "--request", str(request))
    assert result.returncode == 2, result.stderr
    assert "refused by the domain XML policy of host t" in result.stderr
    assert "guest #1 (evil): field base_xml" in result.stderr
    assert "/domain/devices/disk/source @file: rule source-path: /etc/shadow is outside the storage paths " \
           "of host t (/default-pool)" in result.stderr  # the test driver's one storage pool
    listing = _vmplacer(config, "placements", "--format", "json")
    assert listing.returncode == 0 and json.loads(listing.stdout) == []


def test_plan_reports_the_refusal_as_bad_input(files):
    config, request = files
    result = _vmplacer(config, "plan", "--host", "t", "--request", str(request), "--format", "json")
    assert result.returncode == 2, result.stderr
    errors = {e["guest"]: e for e in json.loads(result.stdout)["errors"]}
    assert errors["evil"]["kind"] == "xml-policy"
    assert [(r["element"], r["attribute"], r["rule"]) for r in errors["evil"]["reasons"]] == [
        ("/domain/devices/disk/source", "file", "source-path")]


class _Host:
    """A host that must never be asked to define anything."""

    name = "xeon-e3-4c8t"  # the name its capabilities file gives it
    uri = "test:///default"

    def __init__(self) -> None:
        self.defined: list[str] = []

    def topology(self):  # type: ignore[no-untyped-def]
        return read_capabilities_file(XEON_E3)

    def domains(self) -> list:
        return []

    def define(self, xml: str, name: str = "") -> str:
        self.defined.append(name)
        return "00000000-0000-4000-8000-000000000000"


def test_the_rendered_xml_is_held_to_the_policy_before_libvirt_and_its_claim_is_undone(sqlite_url, tmp_path):
    container = make_container(sqlite_url, tmp_path, [{"name": "xeon-e3-4c8t", "uri": "test:///default"}])
    try:
        service = container.placement_service()
        host = _Host()
        spec = GuestSpec.from_mapping({"name": "gpu1", "vcpus": 2, "memory_mib": 1024, "cpu_policy": "dedicated"})
        with pytest.raises(DomainXmlPolicyError) as refused:
            service.place(host, spec, HOSTDEV)  # as if the first line had been skipped
        assert refused.value.what == "the rendered domain XML"
        assert [(v.element, v.rule) for v in refused.value.violations] == [("/domain/devices/hostdev", "hostdev")]
        assert host.defined == [] and container.placement_store.get("gpu1") is None
        assert container.placement_store.occupied("xeon-e3-4c8t") == []
    finally:
        container.close()


def test_host_facts_read_pools_only_when_no_storage_paths_are_configured():
    """With storage paths configured the pools are not read at all, so a failing storage
    driver cannot make the host's emulators unreadable (libvirt's test driver, real calls)."""
    from vmplacer.adapters.libvirt_facts import host_facts
    from vmplacer.adapters.libvirt_host import LibvirtHost
    from vmplacer.config import HostSettings

    host = LibvirtHost(HostSettings("t", "test:///default"))
    with_pools = host_facts(host)
    without = host_facts(host, read_pools=False)
    assert with_pools.pool_paths, "the test driver's default pool should be read"
    assert without.pool_paths == ()
    assert without.emulators == with_pools.emulators and without.emulators


def test_configured_storage_paths_keep_the_policy_working_when_pool_listing_fails(monkeypatch, tmp_path):
    import libvirt

    from vmplacer.adapters.libvirt_facts import host_facts
    from vmplacer.adapters.libvirt_host import LibvirtHost
    from vmplacer.config import HostSettings

    emulator = sorted(host_facts(LibvirtHost(HostSettings("t", "test:///default"))).emulators)[0]

    def broken(self, flags=0):
        raise libvirt.libvirtError("storage driver failed")

    monkeypatch.setattr(libvirt.virConnect, "listAllStoragePools", broken)
    container = make_container(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, [
        {"name": "t", "uri": "test:///default", "xml_policy": {"storage_paths": ["/srv/images"]}}])
    try:
        policy = container.xml_policy("t")
        document = (f"<domain type='qemu'><name>g</name><devices><emulator>{emulator}</emulator>"
                    "<disk type='file' device='disk'><source file='/srv/images/g.qcow2'/>"
                    "<target dev='vda' bus='virtio'/></disk></devices></domain>")
        assert policy.violations(document) == []
        outside = document.replace("/srv/images/g.qcow2", "/etc/shadow")
        assert [v.rule for v in policy.violations(outside)], "a disk outside the storage paths must be refused"
    finally:
        container.close()
