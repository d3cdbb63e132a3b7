"""What the domain XML policy trusts about a libvirt host, read from the host itself.

- its emulators: the <path> of libvirt's domain capabilities for kvm and qemu
  (what libvirt would pick when a domain names none), else the <emulator>s of
  its capabilities (drivers without domain capabilities, such as the test driver);
- its storage: the target paths of its directory-like storage pools.
"""

from __future__ import annotations

from typing import Any

import libvirt

from vmplacer.adapters.domain_xml_policy import HostFacts, emulators_in, pool_path
from vmplacer.ports import HypervisorError

VIRT_TYPES = ("kvm", "qemu")


def host_facts(host: Any, *, read_pools: bool = True) -> HostFacts:
    """Facts of a `LibvirtHost` (anything with `name` and `connection()`); HypervisorError if unreadable.
    `read_pools` False (storage paths configured): the pools are neither needed nor read, so a host
    whose storage driver fails cannot make the emulators unreadable."""
    conn = host.connection()
    try:
        capabilities = conn.getCapabilities()
        pools = [pool.XMLDesc(0) for pool in _pools(conn)] if read_pools else []
    except libvirt.libvirtError as exc:
        raise HypervisorError(f"host {host.name}: cannot read emulators and storage pools: "
                              f"{exc.get_error_message()}", host=host.name, retriable=True) from None
    domain_capabilities = []
    for virt_type in VIRT_TYPES:
        try:
            domain_capabilities.append(conn.getDomainCapabilities(None, None, None, virt_type, 0))
        except libvirt.libvirtError:
            continue  # no such virtualization here (kvm without /dev/kvm), or a driver without them
    paths = tuple(dict.fromkeys(p for p in (pool_path(xml) for xml in pools) if p))
    return HostFacts(emulators_in(capabilities, domain_capabilities), paths)


def _pools(conn: libvirt.virConnect) -> list[libvirt.virStoragePool]:
    try:
        return conn.listAllStoragePools(0)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT:
            return []  # no storage driver on this host: only configured storage paths count
        raise
