"""Rendered XML on a real libvirtd with a real QEMU guest (the testbed's host1).

The placement vmplacer computes for the host's real topology is merged into
the testbed's TCG guest XML, defined and started; libvirt's live pinning must
be the placement's, and the live XML must parse back to it.
"""

from __future__ import annotations

import pytest

from vmplacer.adapters.domain_xml import parse_placement, render_domain
from vmplacer.core.placement.allocate import allocate
from vmplacer.core.placement.guest import GuestSpec

pytestmark = pytest.mark.integration


def test_placed_guest_runs_pinned_as_planned(testbed, host1_conn):
    import libvirt

    from vmplacer.adapters.capabilities import read_capabilities_live
    from vmplacer.testbed import guests

    topology = read_capabilities_live(host1_conn, "host1")
    name = guests.owned_name("xml-live")
    spec = GuestSpec.from_mapping({
        "name": name, "vcpus": 1, "memory_mib": 128, "cpu_policy": "dedicated",
        "labels": {"purpose": "integration <test>"},
    })
    placement = allocate(topology, spec)
    console = guests.console_path(name, testbed.dirs)
    base = guests.domain_xml(name, testbed.image, console)
    xml = render_domain(spec, placement, base_xml=base)
    domain = host1_conn.defineXMLFlags(xml, libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
    try:
        domain.create()
        guests.wait_for_progress(console, samples=1)  # the guest booted and runs
        cpus = host1_conn.getInfo()[2]
        for vcpu, pins in placement.vcpupin.items():
            live = domain.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE)[vcpu]
            assert {c for c in range(cpus) if live[c]} == set(pins)
        emulator = domain.emulatorPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE)
        assert {c for c in range(cpus) if emulator[c]} == set(placement.emulatorpin)
        assert parse_placement(domain.XMLDesc(0), "host1", topology) == placement
    finally:
        guests.destroy_and_undefine(host1_conn, name)
