"""Simulated hosts that keep each domain as its XML document, as libvirt does.

What vmplacer reads back from such a host is the product's own parse of the
document it defined (`parse_placement_and_labels`), and pins change the
document the way vmplacer changes an inactive domain (`with_pin`): a test on
them checks the product's paths end to end without a daemon. The libvirt
paths themselves are tested on the testbed (tests/integration).
"""

from __future__ import annotations

import uuid as uuids
from dataclasses import dataclass, field

from vmplacer.adapters.domain_xml import (
    document_with_exclusive_cpus,
    parse_domain,
    parse_placement_and_labels,
    with_pin,
)
from vmplacer.core.placement.bandwidth import CpuBandwidth
from vmplacer.core.topology.host import HostTopology
from vmplacer.ports import DomainGone, DomainInfo, HypervisorError


@dataclass
class _Document:
    xml: str
    uuid: str
    state: str = "shut off"
    bandwidth: CpuBandwidth = field(default_factory=CpuBandwidth)


class XmlHost:
    """One host: defined domains by name, each a document, a state and a CPU bandwidth."""

    def __init__(self, name: str, topology: HostTopology):
        self.name = name
        self.uri = f"test:///{name}"
        self._topology = topology
        self.documents: dict[str, _Document] = {}

    # ----- what placing and the executor read ------------------------------------------------
    def topology(self) -> HostTopology:
        return self._topology

    def domains(self) -> list[DomainInfo]:
        return [self.domain(name) for name in sorted(self.documents)]

    def domain(self, name: str) -> DomainInfo:
        document = self._get(name)
        placement, labels = parse_placement_and_labels(document.xml, self.name)
        return DomainInfo(name, document.uuid, document.state, None, len(placement.vcpupin),
                          placement.memory_kib, placement, labels)

    def domain_state(self, name: str) -> tuple[str, str | None]:
        return self._get(name).state, None

    # ----- what placing and the executor change -----------------------------------------------
    def define(self, xml: str, name: str = "") -> str:
        root = parse_domain(xml)
        named = root.findtext("name") or ""
        if name and named != name:
            raise HypervisorError(f"define {name}: the document names {named!r}", host=self.name, domain=name)
        known = self.documents.get(named)
        document = _Document(xml, known.uuid if known else str(uuids.uuid4()), known.state if known else "shut off")
        self.documents[named] = document
        return document.uuid

    def start(self, name: str) -> None:
        self._get(name).state = "running"

    def destroy(self, name: str) -> None:
        self._get(name).state = "shut off"

    def undefine(self, name: str) -> None:
        self._get(name)
        del self.documents[name]

    def pin_vcpu(self, name: str, vcpu: int, cpus: frozenset[int]) -> None:
        self._check(name, cpus)
        document = self._get(name)
        document.xml = with_pin(document.xml, frozenset(cpus), vcpu)

    def pin_emulator(self, name: str, cpus: frozenset[int]) -> None:
        self._check(name, cpus)
        document = self._get(name)
        document.xml = with_pin(document.xml, frozenset(cpus))

    def set_exclusive_cpus(self, name: str, cpus: frozenset[int]) -> None:
        document = self._get(name)
        document.xml = document_with_exclusive_cpus(document.xml, frozenset(cpus)) or document.xml

    def migrate(self, name: str, destination: XmlHost, *, bandwidth_mib_s: int | None = None,
                timeout_s: float | None = None) -> None:
        document = self._get(name)
        if name in destination.documents:
            raise HypervisorError(f"{name} exists on {destination.name}", host=self.name, domain=name)
        destination.documents[name] = document
        del self.documents[name]

    def cpu_bandwidth(self, name: str) -> CpuBandwidth:
        return self._get(name).bandwidth

    def set_cpu_bandwidth(self, name: str, bandwidth: CpuBandwidth) -> None:
        self._get(name).bandwidth = bandwidth

    # ----- internals ----------------------------------------------------------------------------
    def _get(self, name: str) -> _Document:
        try:
            return self.documents[name]
        except KeyError:
            raise DomainGone(f"no domain {name} on {self.name}", host=self.name, domain=name) from None

    def _check(self, name: str, cpus: frozenset[int]) -> None:
        unknown = sorted(frozenset(cpus) - self._topology.online_cpus)
        if not cpus or unknown:
            raise HypervisorError(f"{name}: pCPUs {unknown or 'none'} are not online on {self.name}",
                                  host=self.name, domain=name)
