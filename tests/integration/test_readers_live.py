"""Both topology readers on this machine: the real /sys and a real libvirtd's capabilities agree."""

from __future__ import annotations

import pytest

from tests.support import require
from vmplacer.adapters.capabilities import read_capabilities_live
from vmplacer.adapters.sysfs import read_sysfs
from vmplacer.core.topology.host import HostTopology

pytestmark = pytest.mark.integration

URI = "qemu:///system"


@pytest.fixture
def system_conn(testbed):
    """A connection to the machine's own libvirtd (the testbed brings it up under CI)."""
    import libvirt

    try:
        conn = libvirt.open(URI)
    except libvirt.libvirtError as exc:
        require(False, f"cannot connect to {URI}: {exc.get_error_message()}")
    try:
        yield conn
    finally:
        conn.close()


def structure(topology: HostTopology, clusters: bool) -> dict:
    online = topology.online_cpus
    return {
        "online": sorted(online),
        "nodes": {n: sorted(topology.cpus_in_node(n) & online) for n in topology.nodes},
        "distances": {n.id: n.distances for n in topology.nodes.values()},
        "hugepages": {n.id: {p.size_kib: p.total for p in n.hugepages} for n in topology.nodes.values()},
        "cores": [(c.id, c.node, c.package, c.die, c.cpus) for c in topology.cores if set(c.cpus) & online],
        "siblings": {cpu: sorted(topology.siblings(cpu)) for cpu in sorted(online)},
        "dies": {k: sorted(v) for k, v in topology.dies.items()},
        "clusters": {k: sorted(v) for k, v in topology.clusters.items()} if clusters else None,
        "llc": {k: sorted(v) for k, v in topology.llc_groups.items()},
        "smt": topology.smt,
        "memory_only": topology.memory_only_nodes,
    }


def test_sysfs_and_live_capabilities_agree(system_conn):
    from_caps = read_capabilities_live(system_conn, "self")
    from_sysfs = read_sysfs("/", "self")
    # libvirt writes cluster_id from version 10 on; older daemons leave clusters unknown.
    clusters = "cluster_id=" in system_conn.getCapabilities()
    assert structure(from_caps, clusters) == structure(from_sysfs, clusters)
    # libvirt reports L3 banks only: L2 is one group per core unless the XML has level-2 banks.
    if "level='2'" not in system_conn.getCapabilities():
        assert set(from_caps.l2_groups.values()) == {
            frozenset(c.cpus) for c in from_caps.cores if set(c.cpus) & from_caps.online_cpus
        }
    for node_id, node in from_sysfs.nodes.items():
        live = from_caps.nodes[node_id]
        # Both come from the node's meminfo, read a moment apart: totals match, free memory is close.
        assert live.memory_kib == pytest.approx(node.memory_kib, rel=0.05)
        assert 0 <= live.free_kib <= live.memory_kib
        assert live.free_kib == pytest.approx(node.free_kib, abs=0.1 * node.memory_kib)
        for pool in node.hugepages:
            assert live.hugepage_pool(pool.size_kib).free == pool.free
