"""What the rebalancer needs from a libvirt host beyond `LibvirtHost`.

* live migration (delegated to `LibvirtHost.migrate`, peer to peer);
* moving a running guest's memory to other NUMA nodes: setNumaParameters
  with the nodeset, live and in the persistent definition. libvirt allows it
  live only for the strict and restrictive modes (it rewrites cpuset.mems and
  the kernel migrates the pages); a guest with per-cell <memnode> pinning
  cannot change live and is refused with libvirt's reason;
* vCPU demand: the time each vCPU ran plus the time it waited in the run
  queue, per second, over a short window — what the guest asked for, even
  while it was crowded off its pCPU.
"""

from __future__ import annotations

import time
from typing import Any

import libvirt

from vmplacer.adapters.libvirt_host import LibvirtHost
from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.ports import Hypervisor, HypervisorError

MIN_DEMAND = 0.02
DEFAULT_DEMAND_WINDOW_S = 1.0


class RebalanceHost:
    """A `LibvirtHost` with peer-to-peer live migration, live NUMA memory moves and demand readings."""

    def __init__(self, host: LibvirtHost):
        self.host = host
        self.name = host.name
        self.uri = host.uri

    def __getattr__(self, item: str) -> Any:
        return getattr(self.host, item)

    # ----- migration ----------------------------------------------------------------------------
    def migrate(self, name: str, destination: Hypervisor, *, bandwidth_mib_s: int | None = None,
                timeout_s: float | None = None) -> None:
        target = destination.host if isinstance(destination, RebalanceHost) else destination
        self.host.migrate(name, target, bandwidth_mib_s=bandwidth_mib_s, timeout_s=timeout_s)

    # ----- memory nodes -------------------------------------------------------------------------------
    def set_memory_nodes(self, name: str, nodes: frozenset[int]) -> None:
        if not nodes:
            raise HypervisorError(f"host {self.name}, domain {name}: no memory nodes given", host=self.name,
                                  domain=name)
        dom = self.host._lookup(name)
        flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
        if dom.isPersistent():
            flags |= libvirt.VIR_DOMAIN_AFFECT_CONFIG
        params = {libvirt.VIR_DOMAIN_NUMA_NODESET: format_cpuset(nodes)}
        self.host._changing(name, "setNumaParameters", lambda: dom.setNumaParameters(params, flags))

    # ----- demand ------------------------------------------------------------------------------------
    def vcpu_demand(self, names: list[str], window_s: float = DEFAULT_DEMAND_WINDOW_S) -> dict[str, float]:
        """Per domain: the share of a pCPU each vCPU asked for (ran + waited), over `window_s`."""
        conn = self.host.connection()
        wanted = set(names)

        def read() -> tuple[float, dict[str, tuple[float, int]]]:
            stats = self.host._call("getAllDomainStats", lambda: conn.getAllDomainStats(
                libvirt.VIR_DOMAIN_STATS_VCPU, libvirt.VIR_CONNECT_GET_ALL_DOMAINS_STATS_RUNNING))
            now = time.monotonic()
            result = {}
            for dom, values in stats:
                if dom.name() not in wanted:
                    continue
                count = int(values.get("vcpu.current", 0))
                busy = sum(values.get(f"vcpu.{i}.time", 0) + values.get(f"vcpu.{i}.delay", 0)
                           for i in range(count))
                result[dom.name()] = (busy / 1e9, count)
            return now, result

        start, before = read()
        time.sleep(window_s)
        end, after = read()
        elapsed = end - start
        demand = {}
        for name, (busy, count) in after.items():
            if name not in before or count <= 0 or elapsed <= 0:
                continue
            share = (busy - before[name][0]) / elapsed / count
            demand[name] = min(1.0, max(MIN_DEMAND, share))
        return demand
