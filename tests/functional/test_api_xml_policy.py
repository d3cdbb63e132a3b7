"""The domain XML policy at POST /v1/placements, in-process on libvirt's test driver.

Host "t" keeps the defaults: the test driver's emulator (/usr/bin/test-hv, from its
capabilities) and its one storage pool (/default-pool). Host "t2" is the same
driver with the exception `hostdev`. The driver's own guest ("test", 8 GiB) is
taken off for the test so that small guests fit, and put back afterwards (the
test driver's state is shared by every connection in this process).
"""

from __future__ import annotations

import warnings

import libvirt
import pytest

from tests.functional.test_api_helpers import make_container
from vmplacer.adapters.db.api import SqlTokenStore
from vmplacer.api.app import create_app
from vmplacer.api.services import ApiOptions

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

HOSTS = [{"name": "t", "uri": "test:///default", "domain_type": "qemu"},
         {"name": "t2", "uri": "test:///default", "domain_type": "qemu", "xml_policy": {"allow": ["hostdev"]}}]
QEMU_NS = " xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'"


def domain(devices: str = "", *, os: str = "", top: str = "", type_: str = "qemu", ns: str = "") -> str:
    return (f"<domain type='{type_}'{ns}><name>x</name><memory unit='MiB'>64</memory>"
            f"<os><type arch='x86_64'>hvm</type>{os}</os>{top}<devices>{devices}</devices></domain>")


@pytest.fixture
def app(database_url, tmp_path):
    container = make_container(database_url, tmp_path, HOSTS)
    conn = container.hypervisor("t").connection()
    builtin = conn.lookupByName("test")
    saved = builtin.XMLDesc(0)
    builtin.destroy()
    builtin.undefine()
    token = SqlTokenStore(container.sessions).create("orchestrator", "admin")
    application = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
    try:
        with TestClient(application, raise_server_exceptions=False,
                        headers={"Authorization": f"Bearer {token}"}) as client:
            yield client, container, conn
    finally:
        for dom in conn.listAllDomains():
            if dom.isActive():
                dom.destroy()
            dom.undefine()
        conn.defineXML(saved).create()
        container.close()


def _names(conn: libvirt.virConnect) -> set[str]:
    return {d.name() for d in conn.listAllDomains()}


# (case, base XML, element, attribute, rule)
FORBIDDEN = [
    ("emulator", domain("<emulator>/bin/sh</emulator>"), "/domain/devices/emulator", None, "emulator"),
    ("disk on /etc/shadow", domain("<disk type='file' device='disk'><source file='/etc/shadow'/>"
                                   "<target dev='vda' bus='virtio'/></disk>"),
     "/domain/devices/disk/source", "file", "source-path"),
    ("serial into /etc/cron.d", domain("<serial type='file'><source path='/etc/cron.d/x'/><target port='0'/>"
                                       "</serial>"), "/domain/devices/serial/source", "path", "source-path"),
    ("PCI hostdev", domain("<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0' "
                           "bus='0' slot='1' function='0'/></source></hostdev>"),
     "/domain/devices/hostdev", None, "hostdev"),
    ("kernel", domain(os="<kernel>/boot/vmlinuz</kernel>"), "/domain/os/kernel", None, "direct-boot"),
    ("cmdline", domain(os="<cmdline>init=/bin/sh</cmdline>"), "/domain/os/cmdline", None, "direct-boot"),
    ("seclabel none", domain(top="<seclabel type='none'/>"), "/domain/seclabel", "type", "seclabel"),
    ("lxc", domain(type_="lxc"), "/domain", "type", "domain-type"),
    ("qemu:commandline", domain(top="<qemu:commandline><qemu:arg value='-monitor'/></qemu:commandline>",
                                ns=QEMU_NS), "/domain/qemu:commandline", None, "hypervisor-namespace"),
    ("filesystem", domain("<filesystem type='mount'><source dir='/'/><target dir='root'/></filesystem>"),
     "/domain/devices/filesystem", None, "filesystem"),
]


@pytest.mark.parametrize("dry_run", [False, True], ids=["define", "dry-run"])
@pytest.mark.parametrize("case, base, element, attribute, rule", FORBIDDEN, ids=[c[0] for c in FORBIDDEN])
def test_forbidden_xml_is_422_naming_it_and_nothing_reaches_the_host(app, case, base, element, attribute, rule,
                                                                     dry_run):
    client, _container, conn = app
    before = _names(conn)
    response = client.post("/v1/placements", json={"name": "evil", "vcpus": 1, "memory_mib": 64, "host": "t",
                                                   "base_xml": base, "dry_run": dry_run})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "xml-policy"
    assert {"field": "base_xml", "host": "t", "element": element, "attribute": attribute,
            "rule": rule} == {k: error["details"][0][k] for k in ("field", "host", "element", "attribute", "rule")}
    assert element in error["message"] and f"rule {rule}" in error["message"]
    assert _names(conn) == before
    assert client.get("/v1/placements/evil").status_code == 404


def test_allowed_xml_is_placed_and_kept_in_the_defined_domain(app):
    client, container, conn = app
    kept = {
        "disk image in the host's pool": "<source file='/default-pool/web1.img'/>",
        "NIC on a network": "<source network='default'/>",
        "console on a pty": "<console type='pty'>",
        "the host's own emulator": "<emulator>/usr/bin/test-hv</emulator>",
    }
    base = domain("<emulator>/usr/bin/test-hv</emulator>"
                  "<disk type='file' device='disk'><source file='/default-pool/web1.img'/>"
                  "<target dev='vda' bus='virtio'/></disk>"
                  "<interface type='network'><source network='default'/><model type='virtio'/></interface>"
                  "<console type='pty'><target type='serial' port='0'/></console>")
    dry = client.post("/v1/placements", json={"name": "web1", "vcpus": 1, "memory_mib": 64, "host": "t",
                                              "base_xml": base, "dry_run": True})
    assert dry.status_code == 200, dry.text
    placed = client.post("/v1/placements", json={"name": "web1", "vcpus": 1, "memory_mib": 64, "host": "t",
                                                 "base_xml": base})
    assert placed.status_code == 201, placed.text
    defined = container.hypervisor("t").domain_xml("web1").replace('"', "'")
    for what, fragment in kept.items():
        assert fragment in defined, what
    assert client.delete("/v1/placements/web1").status_code == 200
    assert "web1" not in _names(conn)


def test_a_host_that_lifts_a_rule_is_the_only_candidate_for_such_xml(app):
    client, container, conn = app
    base = domain("<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0' bus='0' "
                  "slot='1' function='0'/></source></hostdev>")
    refused = client.post("/v1/placements", json={"name": "gpu1", "vcpus": 1, "memory_mib": 64, "host": "t",
                                                  "base_xml": base})
    assert refused.status_code == 422 and refused.json()["error"]["details"][0]["host"] == "t"
    anywhere = client.post("/v1/placements", json={"name": "gpu1", "vcpus": 1, "memory_mib": 64, "base_xml": base})
    assert anywhere.status_code == 201, anywhere.text
    assert anywhere.json()["host"] == "t2"
    assert "<hostdev" in container.hypervisor("t2").domain_xml("gpu1")


def test_every_candidate_refusing_lists_each_hosts_reason(app):
    client, _container, conn = app
    before = _names(conn)
    base = domain("<disk type='file' device='disk'><source file='/etc/shadow'/><target dev='vda'/></disk>")
    response = client.post("/v1/placements", json={"name": "evil", "vcpus": 1, "memory_mib": 64, "base_xml": base})
    assert response.status_code == 422
    error = response.json()["error"]
    assert sorted(d["host"] for d in error["details"]) == ["t", "t2"]
    assert "every candidate host" in error["message"] and "/default-pool" in error["message"]
    assert _names(conn) == before
