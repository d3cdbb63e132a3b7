"""A libvirt host seen through the `FreezableHost` port: cheap states, fast suspend/resume.

Freeze'nSense calls these on every sample, so nothing here parses domain XML:
states for every domain come from one `getAllDomainStats(STATE)` call
(~0.1 ms), suspend/resume use cached domain handles (one RPC each, ~1.3 ms),
and pinning comes from `vcpuPinInfo` (the live affinity of each vCPU).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import libvirt

from vmplacer.adapters.libvirt_errors import operation_failed
from vmplacer.adapters.libvirt_host import LibvirtHost, pause_reason_name, state_name
from vmplacer.ports import WORKLOAD_CLASS_LABEL, DomainFacts, DomainStatus, HypervisorError



class LibvirtFreezableHost:
    """Freeze operations on one `LibvirtHost` (shares its connection)."""

    def __init__(self, host: LibvirtHost, labels: Callable[[str], dict[str, str]] | None = None):
        self.host = host
        self.name = host.name
        self._labels = labels
        self._handles: dict[str, libvirt.virDomain] = {}
        self._lock = threading.Lock()

    def _fail(self, what: str, name: str, exc: libvirt.libvirtError) -> HypervisorError:
        return operation_failed(exc, host=self.name, domain=name, what=what)

    def _handle(self, name: str) -> libvirt.virDomain:
        with self._lock:
            dom = self._handles.get(name)
        if dom is not None:
            return dom
        conn = self.host.connection()
        try:
            dom = conn.lookupByName(name)
        except libvirt.libvirtError as exc:
            raise self._fail("lookup", name, exc) from None
        with self._lock:
            self._handles[name] = dom
        return dom

    def domain_states(self) -> dict[str, DomainStatus]:
        conn = self.host.connection()
        try:
            # NOWAIT: right after a client died mid-suspend, a plain call was seen to
            # stall ~1.3 s on libvirt 9.0; the state itself never needs a domain job.
            records = conn.getAllDomainStats(libvirt.VIR_DOMAIN_STATS_STATE,
                                             libvirt.VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"host {self.name}: listing domain states failed: {exc.get_error_message()}",
                                  host=self.name, retriable=True) from None
        states = {}
        handles = {}
        for dom, stats in records:
            name = dom.name()
            if "state.state" in stats:
                state, reason = int(stats["state.state"]), int(stats.get("state.reason", 0))
            else:
                try:
                    state, reason = dom.state()
                except libvirt.libvirtError:
                    continue  # gone while we listed
            states[name] = DomainStatus(
                name=name,
                uuid=dom.UUIDString(),
                state=state_name(state),
                pause_reason=pause_reason_name(reason) if state == libvirt.VIR_DOMAIN_PAUSED else None,
            )
            handles[name] = dom
        with self._lock:
            self._handles = handles  # fresh handles; forgets domains that went away
        return states

    def suspend(self, name: str) -> None:
        dom = self._handle(name)
        try:
            dom.suspend()
        except libvirt.libvirtError as exc:
            raise self._fail("suspend", name, exc) from None

    def resume(self, name: str) -> None:
        """Resume; a domain that already runs counts as resumed (resuming is idempotent here)."""
        dom = self._handle(name)
        try:
            dom.resume()
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_OPERATION_INVALID:
                try:
                    if dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING:
                        return
                except libvirt.libvirtError:
                    pass
            raise self._fail("resume", name, exc) from None

    def domain_facts(self, names: list[str]) -> dict[str, DomainFacts]:
        """Pinned pCPUs (live vCPU affinity; None when a vCPU may run anywhere) and labels."""
        facts = {}
        for name in names:
            try:
                dom = self._handle(name)
                affinity = dom.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE)
            except (libvirt.libvirtError, HypervisorError):
                continue
            pcpus: set[int] = set()
            pinned = True
            for cpumap in affinity:
                allowed = {i for i, ok in enumerate(cpumap) if ok}
                if len(allowed) == len(cpumap):  # may run on every host CPU: not pinned
                    pinned = False
                pcpus |= allowed
            labels: dict[str, str] = {}
            if self._labels is not None:
                try:
                    labels = self._labels(name)
                except (HypervisorError, ValueError):
                    labels = {}
            facts[name] = DomainFacts(frozenset(pcpus) if pinned and pcpus else None, labels)
        return facts


def labels_from_xml(host: LibvirtHost) -> Callable[[str], dict[str, str]]:
    """Labels and workload class from the vmplacer metadata in the domain's XML
    (empty for domains vmplacer did not place)."""

    def labels(name: str) -> dict[str, str]:
        from vmplacer.adapters.domain_xml import parse_metadata

        meta = parse_metadata(host.domain_xml(name))
        if meta is None:
            return {}
        return {**meta.labels, WORKLOAD_CLASS_LABEL: meta.workload_class}

    return labels
