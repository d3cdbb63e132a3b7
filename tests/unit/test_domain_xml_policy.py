"""The domain XML policy: each forbidden construct refused by name, each allowed one accepted and kept.

Host "h": emulator /usr/bin/qemu-system-x86_64, one storage pool at /var/lib/libvirt/images.
"""

from __future__ import annotations

import pytest

from vmplacer.adapters.domain_xml import render_domain
from vmplacer.adapters.domain_xml_policy import (
    EXCEPTIONS,
    MAX_VIOLATIONS,
    DomainXmlPolicy,
    DomainXmlPolicyError,
    HostFacts,
    emulators_in,
    pool_path,
)
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.guest_placement import GuestCell, Placement

EMULATOR = "/usr/bin/qemu-system-x86_64"
POOL = "/var/lib/libvirt/images"
FACTS = HostFacts(frozenset({EMULATOR}), (POOL,))


def policy(**kwargs) -> DomainXmlPolicy:  # type: ignore[no-untyped-def]
    return DomainXmlPolicy("h", facts=lambda: FACTS, **kwargs)


def domain(devices: str = "", *, os: str = "", top: str = "", type_: str = "kvm", ns: str = "") -> str:
    return (f"<domain type='{type_}'{ns}><name>g1</name><memory unit='MiB'>512</memory>"
            f"<os><type arch='x86_64'>hvm</type>{os}</os>{top}<devices>{devices}</devices></domain>")


QEMU_NS = " xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'"

# (case, document, element, attribute, rule)
FORBIDDEN = [
    ("emulator of the caller's choice", domain("<emulator>/bin/sh</emulator>"),
     "/domain/devices/emulator", None, "emulator"),
    ("disk reading /etc/shadow", domain("<disk type='file' device='disk'><source file='/etc/shadow'/>"
                                        "<target dev='vda'/></disk>"),
     "/domain/devices/disk/source", "file", "source-path"),
    ("disk escaping the pool with ..", domain(f"<disk type='file' device='disk'><source file='{POOL}/../../../etc/"
                                              "shadow'/><target dev='vda'/></disk>"),
     "/domain/devices/disk/source", "file", "source-path"),
    ("block device of the host", domain("<disk type='block' device='disk'><source dev='/dev/sda'/>"
                                        "<target dev='vda'/></disk>"),
     "/domain/devices/disk/source", "dev", "source-path"),
    ("serial writing into /etc/cron.d", domain("<serial type='file'><source path='/etc/cron.d/evil'/>"
                                               "<target port='0'/></serial>"),
     "/domain/devices/serial/source", "path", "source-path"),
    ("channel onto a host socket", domain("<channel type='unix'><source mode='connect' path='/run/docker.sock'/>"
                                          "<target type='virtio' name='x'/></channel>"),
     "/domain/devices/channel/source", "path", "source-path"),
    ("console log outside the pool", domain("<console type='pty'><log file='/root/.bashrc'/></console>"),
     "/domain/devices/console/log", "file", "source-path"),
    ("PCI host device", domain("<hostdev mode='subsystem' type='pci' managed='yes'><source>"
                               "<address domain='0' bus='0' slot='1' function='0'/></source></hostdev>"),
     "/domain/devices/hostdev", None, "hostdev"),
    ("SR-IOV interface", domain("<interface type='hostdev'><source><address type='pci' domain='0' bus='1' "
                                "slot='0' function='1'/></source></interface>"),
     "/domain/devices/interface", "type", "hostdev"),
    ("filesystem passthrough", domain("<filesystem type='mount' accessmode='passthrough'><source dir='/'/>"
                                      "<target dir='root'/></filesystem>"),
     "/domain/devices/filesystem", None, "filesystem"),
    ("kernel", domain(os="<kernel>/boot/vmlinuz</kernel>"), "/domain/os/kernel", None, "direct-boot"),
    ("initrd", domain(os=f"<initrd>{POOL}/initrd.img</initrd>"), "/domain/os/initrd", None, "direct-boot"),
    ("cmdline", domain(os="<cmdline>init=/bin/sh</cmdline>"), "/domain/os/cmdline", None, "direct-boot"),
    ("dtb", domain(os="<dtb>/boot/x.dtb</dtb>"), "/domain/os/dtb", None, "direct-boot"),
    ("loader", domain(os="<loader readonly='yes' type='pflash'>/etc/shadow</loader>"),
     "/domain/os/loader", None, "firmware"),
    ("nvram", domain(os=f"<nvram>{POOL}/vars.fd</nvram>"), "/domain/os/nvram", None, "firmware"),
    ("seclabel none", domain(top="<seclabel type='none'/>"), "/domain/seclabel", "type", "seclabel"),
    ("seclabel relabel=no", domain(top="<seclabel type='dynamic' model='selinux' relabel='no'/>"),
     "/domain/seclabel", "relabel", "seclabel"),
    ("seclabel static", domain(top="<seclabel type='static' model='dac' relabel='yes'/>"),
     "/domain/seclabel", "type", "seclabel"),
    ("seclabel chosen base label", domain(top="<seclabel type='dynamic' model='selinux'>"
                                              "<baselabel>system_u:system_r:unconfined_t:s0</baselabel></seclabel>"),
     "/domain/seclabel/baselabel", None, "seclabel"),
    ("disk left unlabelled", domain(f"<disk type='file' device='disk'><source file='{POOL}/a.img'>"
                                    "<seclabel model='selinux' relabel='no'/></source><target dev='vda'/></disk>"),
     "/domain/devices/disk/source/seclabel", "relabel", "seclabel"),
    ("lxc domain", domain(type_="lxc"), "/domain", "type", "domain-type"),
    ("xen domain", domain(type_="xen"), "/domain", "type", "domain-type"),
    ("qemu:commandline", domain(top="<qemu:commandline><qemu:arg value='-monitor'/></qemu:commandline>",
                                ns=QEMU_NS),
     "/domain/qemu:commandline", None, "hypervisor-namespace"),
    ("hypervisor element hidden in <features>", domain(top="<features><qemu:x/></features>", ns=QEMU_NS),
     "/domain/features//qemu:x", None, "hypervisor-namespace"),
    ("bootloader (a host program)", domain(top="<bootloader>/bin/sh</bootloader>"),
     "/domain/bootloader", None, "allowlist"),
    ("interface script", domain("<interface type='ethernet'><script path='/tmp/x'/></interface>"),
     "/domain/devices/interface", "type", "allowlist"),
    ("raw SCSI I/O", domain(f"<disk type='file' device='disk' rawio='yes'><source file='{POOL}/a.img'/>"
                            "<target dev='vda'/></disk>"),
     "/domain/devices/disk", "rawio", "allowlist"),
    ("rng reading a host disk", domain("<rng model='virtio'><backend model='random'>/dev/sda</backend></rng>"),
     "/domain/devices/rng/backend", None, "allowlist"),
    ("fw_cfg file", domain(top="<sysinfo type='fwcfg'><entry name='opt/x' file='/etc/shadow'/></sysinfo>"),
     "/domain/sysinfo", "type", "allowlist"),
    ("host TPM", domain("<tpm model='tpm-tis'><backend type='passthrough'/></tpm>"),
     "/domain/devices/tpm/backend", "type", "allowlist"),
    ("shared memory with the host", domain("<shmem name='x'><server path='/tmp/s'/></shmem>"),
     "/domain/devices/shmem", None, "allowlist"),
    ("cgroup partition", domain(top="<resource><partition>/machine</partition></resource>"),
     "/domain/resource", None, "allowlist"),
]


@pytest.mark.parametrize("case, document, element, attribute, rule", FORBIDDEN, ids=[c[0] for c in FORBIDDEN])
def test_each_forbidden_construct_is_refused_naming_it(case, document, element, attribute, rule):
    found = policy().violations(document)
    assert (found[0].element, found[0].attribute, found[0].rule) == (element, attribute, rule), found
    assert {v.rule for v in found} == {rule}, found
    with pytest.raises(DomainXmlPolicyError) as refused:
        policy().check(document, "g1")
    message = str(refused.value)
    assert "guest g1" in message and "host h" in message and f"rule {rule}" in message and element in message
    if attribute:
        assert f"@{attribute}" in message


def _render(base: str) -> str:
    spec = GuestSpec.from_mapping({"name": "g1", "vcpus": 2, "memory_mib": 512})
    placement = Placement(guest="g1", host="h", vcpupin={0: frozenset({0, 1}), 1: frozenset({0, 1})},
                          emulatorpin=frozenset({0, 1}), memory_nodes=frozenset({0}),
                          cells=(GuestCell(0, frozenset({0, 1}), 512 * 1024, 0),), memory_kib=512 * 1024)
    return render_domain(spec, placement, base_xml=base, domain_type="kvm")


# (case, document, what must be kept in the rendered domain)
ALLOWED = [
    ("disk image in the pool", domain(f"<disk type='file' device='disk'><driver name='qemu' type='qcow2'/>"
                                      f"<source file='{POOL}/g1.qcow2'/><target dev='vda' bus='virtio'/></disk>"),
     f"<source file=\"{POOL}/g1.qcow2\"/>"),
    ("disk with a backing file in the pool", domain(
        f"<disk type='file' device='disk'><source file='{POOL}/g1.qcow2'/><backingStore type='file'>"
        f"<format type='qcow2'/><source file='{POOL}/base.qcow2'/></backingStore>"
        "<target dev='vda' bus='virtio'/></disk>"), f"<source file=\"{POOL}/base.qcow2\"/>"),
    ("volume of a pool", domain("<disk type='volume' device='disk'><source pool='default' volume='g1'/>"
                                "<target dev='vda' bus='virtio'/></disk>"), "volume=\"g1\""),
    ("NIC on a network", domain("<interface type='network'><mac address='52:54:00:12:34:56'/>"
                                "<source network='default'/><model type='virtio'/></interface>"),
     "<source network=\"default\"/>"),
    ("NIC on a bridge", domain("<interface type='bridge'><source bridge='br0'/><model type='virtio'/>"
                               "</interface>"), "<source bridge=\"br0\"/>"),
    ("console and serial on a pty", domain("<serial type='pty'><target port='0'/></serial>"
                                           "<console type='pty'><target type='serial' port='0'/></console>"),
     "<console type=\"pty\">"),
    ("serial log file in the pool", domain(f"<serial type='file'><source path='{POOL}/g1.log' append='on'/>"
                                           "<target port='0'/></serial>"), f"{POOL}/g1.log"),
    ("guest agent channel", domain("<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/>"
                                   "</channel>"), "org.qemu.guest_agent.0"),
    ("the host's own emulator", domain(f"<emulator>{EMULATOR}</emulator>"), f"<emulator>{EMULATOR}</emulator>"),
    ("VNC on localhost", domain("<graphics type='vnc' autoport='yes' listen='127.0.0.1'>"
                                "<listen type='address' address='127.0.0.1'/></graphics><video><model type='vga'/>"
                                "</video>"), "<graphics type=\"vnc\""),
    ("confinement as configured", domain(top="<seclabel type='dynamic' model='selinux' relabel='yes'/>"),
     "<seclabel type=\"dynamic\""),
    ("rng from urandom", domain("<rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>"),
     "/dev/urandom"),
    ("features, clock and CPU model", domain(top="<features><acpi/><apic/><hyperv mode='custom'>"
                                                 "<relaxed state='on'/></hyperv></features>"
                                                 "<cpu mode='host-model'/><clock offset='utc'/>"),
     "<relaxed state=\"on\"/>"),
    ("other applications' metadata", domain(top="<metadata><app:x xmlns:app='https://example.com/app'>"
                                                "<app:y/></app:x></metadata>"), "https://example.com/app"),
    ("a comment", domain("<!-- the data disk -->"), "<!-- the data disk -->"),
    ("qemu domain type", domain(type_="qemu"), "<domain type=\"qemu\">"),
]


@pytest.mark.parametrize("case, document, kept", ALLOWED, ids=[c[0] for c in ALLOWED])
def test_each_allowed_construct_is_accepted_and_kept(case, document, kept):
    assert policy().violations(document) == []
    rendered = _render(document)
    assert kept in rendered
    policy().check(rendered, "g1", "the rendered domain XML")  # the second line accepts it too


@pytest.mark.parametrize("rule", sorted(EXCEPTIONS))
def test_each_rule_is_lifted_by_its_own_name_only(rule):
    documents = {case[4]: case[1] for case in reversed(FORBIDDEN)}  # the first case of each rule
    document = documents[rule]
    left = {v.rule for v in policy(allow=[rule]).violations(document)}
    assert rule not in left and left <= {"source-path"}  # a lifted element's files stay in the storage paths
    others = [name for name in EXCEPTIONS if name != rule]
    assert rule in {v.rule for v in policy(allow=others).violations(document)}


def test_lifting_direct_boot_or_filesystem_still_keeps_their_files_in_the_storage_paths():
    lifted = policy(allow=["direct-boot", "filesystem"])
    inside = domain(f"<filesystem type='mount'><source dir='{POOL}/share'/><target dir='s'/></filesystem>",
                    os=f"<kernel>{POOL}/vmlinuz</kernel><initrd>{POOL}/initrd</initrd><cmdline>quiet</cmdline>")
    assert lifted.violations(inside) == []
    outside = domain("<filesystem type='mount'><source dir='/etc'/><target dir='s'/></filesystem>",
                     os="<kernel>/boot/vmlinuz</kernel>")
    assert [(v.element, v.attribute, v.rule) for v in lifted.violations(outside)] == [
        ("/domain/os/kernel", None, "source-path"), ("/domain/devices/filesystem/source", "dir", "source-path")]


def test_configured_storage_paths_replace_the_pools():
    configured = policy(storage_paths=["/srv/guests"])
    assert configured.violations(domain("<disk type='file' device='disk'><source file='/srv/guests/a.img'/>"
                                        "<target dev='vda'/></disk>")) == []
    refused = configured.violations(domain(f"<disk type='file' device='disk'><source file='{POOL}/a.img'/>"
                                           "<target dev='vda'/></disk>"))
    assert [v.rule for v in refused] == ["source-path"] and "/srv/guests" in refused[0].reason
    nothing = DomainXmlPolicy("bare").violations(domain("<serial type='file'><source path='/srv/x.log'/></serial>"))
    assert [v.rule for v in nothing] == ["source-path"] and "has no storage paths" in nothing[0].reason


def test_without_known_emulators_the_element_must_be_left_out():
    bare = DomainXmlPolicy("bare")
    assert bare.violations(domain()) == []
    (refused,) = bare.violations(domain(f"<emulator>{EMULATOR}</emulator>"))
    assert refused.rule == "emulator" and "must be left out" in refused.reason


def test_several_violations_are_all_named_with_positions():
    document = domain("<disk type='file' device='disk'><source file='/a'/><target dev='vda'/></disk>"
                      f"<disk type='file' device='disk'><source file='{POOL}/b'/><target dev='vdb'/></disk>"
                      "<disk type='file' device='disk'><source file='/c'/><target dev='vdc'/></disk>")
    found = policy().violations(document)
    assert [v.element for v in found] == ["/domain/devices/disk[1]/source", "/domain/devices/disk[3]/source"]


def test_a_flood_of_violations_is_cut_short():
    document = domain("".join("<hostdev mode='subsystem' type='pci'/>" for _ in range(5000)))
    found = policy().violations(document)
    assert len(found) == MAX_VIOLATIONS
    with pytest.raises(DomainXmlPolicyError, match=f"only the first {MAX_VIOLATIONS}"):
        policy().check(document, "g1")


def test_host_facts_are_read_only_when_needed_and_kept_for_their_ttl():
    reads = []
    now = [0.0]

    def facts() -> HostFacts:
        reads.append(now[0])
        return FACTS

    lazy = DomainXmlPolicy("h", facts=facts, facts_ttl_s=60, clock=lambda: now[0])
    assert lazy.violations(domain("<interface type='network'><source network='default'/></interface>")) == []
    assert reads == []  # nothing in it needs the host
    disk = domain(f"<disk type='file' device='disk'><source file='{POOL}/a.img'/><target dev='vda'/></disk>")
    lazy.violations(disk)
    lazy.violations(disk)
    assert reads == [0.0]
    now[0] = 61.0
    lazy.violations(disk)
    assert reads == [0.0, 61.0]


def test_unknown_exception_names_are_refused():
    with pytest.raises(ValueError, match="hostdevs"):
        DomainXmlPolicy("h", allow=["hostdevs"])


def test_emulators_come_from_domain_capabilities_and_capabilities():
    capabilities = ("<capabilities><host/><guest><os_type>hvm</os_type><arch name='x86_64'>"
                    "<emulator>/usr/bin/qemu-system-x86_64</emulator><domain type='qemu'/>"
                    "<domain type='kvm'><emulator>/usr/libexec/qemu-kvm</emulator></domain></arch></guest>"
                    "</capabilities>")
    domcaps = "<domainCapabilities><path>/usr/bin/qemu-system-x86_64</path><domain>kvm</domain></domainCapabilities>"
    assert emulators_in(capabilities, [domcaps, "not xml"]) == {"/usr/bin/qemu-system-x86_64",
                                                                "/usr/libexec/qemu-kvm"}


@pytest.mark.parametrize("xml, expected", [
    ("<pool type='dir'><name>d</name><target><path>/var/lib/libvirt/images/</path></target></pool>",
     "/var/lib/libvirt/images"),
    ("<pool type='logical'><name>vg</name><target><path>/dev/vg0</path></target></pool>", "/dev/vg0"),
    ("<pool type='disk'><name>sda</name><target><path>/dev</path></target></pool>", None),
    ("<pool type='iscsi'><name>i</name><target><path>/dev/disk/by-path</path></target></pool>", None),
    ("<pool type='dir'><name>root</name><target><path>/</path></target></pool>", None),
    ("<pool type='dir'><name>etc</name><target><path>/etc</path></target></pool>", None),
])
def test_only_directory_pools_below_system_directories_are_storage_paths(xml, expected):
    assert pool_path(xml) == expected



def test_the_rendered_tree_is_judged_as_the_text_libvirt_is_given():
    """The renderer hands its tree to the policy instead of the text parsed back: both must
    yield the same violations, for documents refused and accepted alike."""
    from vmplacer.adapters.domain_xml import DomainXmlError, domain_text, render_domain_tree

    spec = GuestSpec.from_mapping({"name": "g1", "vcpus": 2, "memory_mib": 512})
    placement = Placement(guest="g1", host="h", vcpupin={0: frozenset({0, 1}), 1: frozenset({0, 1})},
                          emulatorpin=frozenset({0, 1}), memory_nodes=frozenset({0}),
                          cells=(GuestCell(0, frozenset({0, 1}), 512 * 1024, 0),), memory_kib=512 * 1024)
    refused = accepted = 0
    for _, document, *_rest in FORBIDDEN + ALLOWED:
        try:
            tree = render_domain_tree(spec, placement, base_xml=document, domain_type="kvm")
        except DomainXmlError:
            continue  # libvirt's schema refuses it before any policy is asked
        from_tree = policy().violations(tree)
        assert from_tree == policy().violations(domain_text(tree)), document
        refused += bool(from_tree)
        accepted += not from_tree
    assert refused >= 20 and accepted >= 5, (refused, accepted)
