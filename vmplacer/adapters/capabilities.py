"""Read a host's topology from libvirt capabilities XML (a file or a live connection).

Elements used, all under `<host>`:
- `<topology><cells><cell id>`: `<memory unit>` (total), `<pages unit size>count`,
  `<distances><sibling id value>`,
  `<cpus><cpu id socket_id die_id cluster_id core_id siblings>`; a `<cpu>`
  carrying only an `id` is offline (libvirt omits the topology of offline
  CPUs; on x86 it leaves them out altogether). A cell without `<cpus>` is a
  CPU-less memory node. libvirt writes `die_id` and `cluster_id` 0 on
  hosts without dies or clusters, and passes on the 65535 x86 kernels print
  for an unknown cluster: both mean "no such level" (`assemble_topology`);
- `<cache><bank level type size unit cpus>` when present (libvirt reports banks of
  level 3 and up; a hand-written file may add level-2 banks, e.g. for AMD
  module pairs). Missing cache levels fall back to one L2 per core and one
  LLC per die, with a warning.

libvirt maps a `physical_package_id` of -1 (s390x, some hypervisors) to
`socket_id='0'`, so such hosts read as one package here; the sysfs reader
sees their sockets.

Capabilities carry no free memory: a live reader asks the connection
(`getCellsFreeMemory`, `getFreePages`); a file is taken as an idle host
(free = total).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from lxml import etree

from vmplacer.adapters.xml_errors import xml_problem
from vmplacer.core.topology.assemble import CacheFacts, CpuFacts, TopologyError, assemble_topology
from vmplacer.core.topology.cpuset import CpusetError, parse_cpuset
from vmplacer.core.topology.host import HostTopology, HugepagePool, Node

if TYPE_CHECKING:
    import libvirt

# libvirt's scaled-integer units (docs: formatdomain "memory" units), in bytes.
_UNIT_BYTES = {
    "b": 1, "bytes": 1,
    "kb": 1000, "k": 1024, "kib": 1024,
    "mb": 1000**2, "m": 1024**2, "mib": 1024**2,
    "gb": 1000**3, "g": 1024**3, "gib": 1024**3,
    "tb": 1000**4, "t": 1024**4, "tib": 1024**4,
    "pb": 1000**5, "p": 1024**5, "pib": 1024**5,
}


class CapabilitiesError(ValueError):
    """Capabilities XML that cannot be read; names the source, line and element."""


def read_capabilities_file(path: str | Path, name: str | None = None) -> HostTopology:
    """Topology from a saved `virsh capabilities` file; the host name defaults to the file stem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise CapabilitiesError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parsed_once(text, name or path.stem, str(path))


_SHAPES_KEPT = 256  # distinct capabilities documents kept parsed (a fleet has a few host shapes)
_shapes: OrderedDict[bytes, HostTopology] = OrderedDict()
_shapes_lock = threading.Lock()


def parsed_once(xml_text: str, name: str, source: str) -> HostTopology:
    """`parse_capabilities`, once per distinct document in the process: a fleet of a thousand
    hosts has a handful of shapes, and parsing and assembling one costs milliseconds that
    every read of every host would pay again. Keyed by a digest of the text (the text itself
    can be 100 kB); the host's own name is put on the shared result."""
    digest = hashlib.blake2b(xml_text.encode(), digest_size=20).digest()
    with _shapes_lock:
        topology = _shapes.get(digest)
        if topology is not None:
            _shapes.move_to_end(digest)
    if topology is None:
        topology = parse_capabilities(xml_text, name=name, source=source)
        with _shapes_lock:
            _shapes[digest] = topology
            while len(_shapes) > _SHAPES_KEPT:
                _shapes.popitem(last=False)
    return topology if topology.name == name else replace(topology, name=name)


def read_capabilities_live(conn: libvirt.virConnect, name: str = "host") -> HostTopology:
    """Topology of a connected host, with free memory and free hugepages per node.

    libvirt errors propagate as `libvirt.libvirtError` (the caller maps them);
    a driver that cannot report free memory leaves free = total.
    """
    topology = parsed_once(conn.getCapabilities(), name, f"capabilities of host {name}")
    free_kib = _live_free_memory(conn, topology)
    free_pages = _live_free_hugepages(conn, topology)
    nodes = {}
    for node_id, node in topology.nodes.items():
        pools = tuple(
            replace(pool, free=free_pages.get(node_id, {}).get(pool.size_kib, pool.free))
            for pool in node.hugepages
        )
        nodes[node_id] = replace(node, free_kib=free_kib.get(node_id, node.free_kib), hugepages=pools)
    return replace(topology, nodes=nodes)


def parse_capabilities(xml_text: str, name: str = "host", *, source: str | None = None) -> HostTopology:
    """Topology from capabilities XML text; `source` names it in error messages."""
    source = source or f"capabilities of host {name}"
    parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)
    try:
        root = etree.fromstring(xml_text.encode(), parser)
    except etree.XMLSyntaxError as exc:
        raise CapabilitiesError(f"{source}: {xml_problem(exc)}") from None
    reader = _Reader(source, root)
    if root.tag != "capabilities":
        raise reader.error(root, "root element must be <capabilities>")
    host = root.find("host")
    if host is None:
        raise reader.error(root, "no <host> element")
    cells = host.findall("topology/cells/cell")
    if not cells:
        raise reader.error(host, "no NUMA cells in <host><topology><cells>; cannot place guests on this host")

    nodes: dict[int, Node] = {}
    facts: list[CpuFacts] = []
    for cell in cells:
        node_id = reader.int_attr(cell, "id")
        if node_id in nodes:
            raise reader.error(cell, f"cell id {node_id} appears twice")
        memory = cell.find("memory")
        memory_kib = reader.scaled_kib(memory, memory.text, memory.get("unit", "KiB")) if memory is not None else 0
        base_page = _base_page_kib(reader, host, cell)
        pools = []
        for pages in cell.findall("pages"):
            size_kib = reader.scaled_kib(pages, pages.get("size"), pages.get("unit", "KiB"))
            if size_kib > base_page:
                count = reader.int_text(pages)
                pools.append(HugepagePool(size_kib=size_kib, total=count, free=count))
        distances = {
            reader.int_attr(sibling, "id"): reader.int_attr(sibling, "value")
            for sibling in cell.findall("distances/sibling")
        }
        nodes[node_id] = Node(
            id=node_id,
            memory_kib=memory_kib,
            free_kib=memory_kib,
            distances=distances,
            hugepages=tuple(sorted(pools, key=lambda p: p.size_kib)),
        )
        for cpu in cell.findall("cpus/cpu"):
            facts.append(reader.cpu_facts(cpu, node_id))

    caches = []
    for bank in host.findall("cache/bank"):
        if bank.get("type", "both") == "code":
            continue
        size = bank.get("size")
        caches.append(CacheFacts(level=reader.int_attr(bank, "level"), cpus=reader.cpuset_attr(bank, "cpus"),
                                 size_kib=None if size is None else reader.scaled_kib(bank, size,
                                                                                     bank.get("unit", "B"))))
    warnings = []
    if not caches and any(f.online for f in facts):
        warnings.append("<host><cache>: no cache banks; each die is taken as one last-level cache "
                        "and each core as one L2")

    try:
        return assemble_topology(facts, nodes, caches, name=name, warnings=warnings)
    except TopologyError as exc:
        raise CapabilitiesError(f"{source}: {exc}") from None


def _base_page_kib(reader: _Reader, host: etree._Element, cell: etree._Element) -> int:
    """The cell's system page size; larger pages are hugepage pools.

    libvirt lists the system page and every hugepage size in each cell, so the
    smallest is the system page. A cell listing one size only is compared with
    the sizes in <host><cpu><pages> (4 KiB when absent).
    """
    cell_sizes = [reader.scaled_kib(p, p.get("size"), p.get("unit", "KiB")) for p in cell.findall("pages")]
    if len(cell_sizes) >= 2:
        return min(cell_sizes)
    host_sizes = [reader.scaled_kib(p, p.get("size"), p.get("unit", "KiB")) for p in host.findall("cpu/pages")]
    return min(host_sizes, default=4)


class _Reader:
    """Typed access to attributes with errors that point at the element."""

    def __init__(self, source: str, root: etree._Element):
        self.source = source
        self.tree = root.getroottree()

    def error(self, element: etree._Element, problem: str) -> CapabilitiesError:
        return CapabilitiesError(
            f"{self.source}: line {element.sourceline}: {self.tree.getpath(element)}: {problem}"
        )

    def int_attr(self, element: etree._Element, attribute: str) -> int:
        value = element.get(attribute)
        if value is None:
            raise self.error(element, f"missing attribute {attribute!r}")
        try:
            number = int(value)
        except ValueError:
            raise self.error(element, f"attribute {attribute}={value!r} is not an integer") from None
        if number < 0:
            raise self.error(element, f"attribute {attribute}={value!r} is negative")
        return number

    def int_text(self, element: etree._Element) -> int:
        text = (element.text or "").strip()
        try:
            return int(text)
        except ValueError:
            raise self.error(element, f"content {text!r} is not an integer") from None

    def cpuset_attr(self, element: etree._Element, attribute: str) -> frozenset[int]:
        value = element.get(attribute)
        if value is None:
            raise self.error(element, f"missing attribute {attribute!r}")
        try:
            return parse_cpuset(value)
        except CpusetError as exc:
            raise self.error(element, f"attribute {attribute}: {exc}") from None

    def scaled_kib(self, element: etree._Element, value: str | None, unit: str) -> int:
        factor = _UNIT_BYTES.get(unit.strip().lower())
        if factor is None:
            raise self.error(element, f"unknown unit {unit!r}")
        try:
            number = int((value or "").strip())
        except ValueError:
            raise self.error(element, f"value {value!r} is not an integer") from None
        return number * factor // 1024

    def cpu_facts(self, cpu: etree._Element, node_id: int) -> CpuFacts:
        cpu_id = self.int_attr(cpu, "id")
        if cpu.get("socket_id") is None and cpu.get("core_id") is None:
            return CpuFacts(id=cpu_id, node=node_id, online=False)
        siblings = self.cpuset_attr(cpu, "siblings") if cpu.get("siblings") is not None else None
        return CpuFacts(
            id=cpu_id,
            node=node_id,
            online=True,
            package=self.int_attr(cpu, "socket_id"),
            die=self.int_attr(cpu, "die_id") if cpu.get("die_id") is not None else 0,
            cluster=self.int_attr(cpu, "cluster_id") if cpu.get("cluster_id") is not None else None,
            core_id=self.int_attr(cpu, "core_id"),
            siblings=siblings,
        )


# ----- live free memory -------------------------------------------------------------------

def _unsupported(exc: Exception) -> bool:
    import libvirt

    return isinstance(exc, libvirt.libvirtError) and exc.get_error_code() in (
        libvirt.VIR_ERR_NO_SUPPORT,
        libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED,
        libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
    )


def _live_free_memory(conn: libvirt.virConnect, topology: HostTopology) -> dict[int, int]:
    """Free KiB per node. The test driver keeps no memory accounting: its nodes stay free = total."""
    if conn.getType().lower() == "test":
        return {}
    highest = max(topology.nodes)
    try:
        free_bytes = conn.getCellsFreeMemory(0, highest + 1)
    except Exception as exc:
        if _unsupported(exc):
            return {}
        raise
    return {node: free_bytes[node] // 1024 for node in topology.nodes if node < len(free_bytes)}


def _live_free_hugepages(conn: libvirt.virConnect, topology: HostTopology) -> dict[int, dict[int, int]]:
    """Free hugepages per node and size (nodes asked one by one: ids may be sparse)."""
    result: dict[int, dict[int, int]] = {}
    for node_id, node in topology.nodes.items():
        sizes = [pool.size_kib for pool in node.hugepages]
        if not sizes:
            continue
        try:
            answer = conn.getFreePages(sizes, node_id, 1)
        except Exception as exc:
            if _unsupported(exc):
                return result
            raise
        if answer and node_id in answer:
            result[node_id] = {int(size): int(count) for size, count in answer[node_id].items()}
    return result
