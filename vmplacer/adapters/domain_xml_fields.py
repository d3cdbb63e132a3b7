"""Every domain-XML field vmplacer reads, declared once: name, XPath, converter.

Reading live XML is a loop over this table (virt-manager's virtinst idea),
so adding a field means adding one row here, not hunting through a parser.
Writing goes through the Jinja2 templates in templates/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lxml import etree

from vmplacer.core.topology.cpuset import CpusetError, parse_cpuset

NAMESPACE = "https://vmplacer.dev/xmlns/placement/1"
NS = {"vmplacer": NAMESPACE}
META = "/domain/metadata/vmplacer:placement"

# libvirt's scaled-integer units (formatdomain.html "memory"), in bytes.
UNIT_BYTES = {
    "b": 1, "bytes": 1,
    "kb": 1000, "k": 1024, "kib": 1024,
    "mb": 1000**2, "m": 1024**2, "mib": 1024**2,
    "gb": 1000**3, "g": 1024**3, "gib": 1024**3,
    "tb": 1000**4, "t": 1024**4, "tib": 1024**4,
}


class FieldError(ValueError):
    """A field whose value cannot be read; the message names the field and the value."""


def to_kib(value: str, unit: str | None, what: str) -> int:
    try:
        number = int(value.strip())
        factor = UNIT_BYTES[(unit or "KiB").strip().lower()]
    except (ValueError, KeyError):
        raise FieldError(f"{what}: cannot read {value!r} {unit or 'KiB'}") from None
    return number * factor // 1024


# ----- converters: xpath result -> value ------------------------------------------------------
def _text(default: str | None = None) -> Callable[[list, str], Any]:
    def convert(nodes: list, name: str) -> str | None:
        return str(nodes[0]).strip() if nodes else default
    return convert


def _int(default: int | None) -> Callable[[list, str], Any]:
    def convert(nodes: list, name: str) -> int | None:
        if not nodes:
            return default
        try:
            return int(str(nodes[0]).strip())
        except ValueError:
            raise FieldError(f"{name}: not an integer: {nodes[0]!r}") from None
    return convert


def _float(nodes: list, name: str) -> float | None:
    if not nodes:
        return None
    try:
        return float(str(nodes[0]).strip())
    except ValueError:
        raise FieldError(f"{name}: not a number: {nodes[0]!r}") from None


def _cpuset(nodes: list, name: str) -> frozenset[int] | None:
    if not nodes:
        return None
    try:
        return parse_cpuset(str(nodes[0]))
    except CpusetError as exc:
        raise FieldError(f"{name}: {exc}") from None


def _memory(nodes: list, name: str) -> int:
    if not nodes:
        return 0
    element = nodes[0]
    return to_kib(element.text or "0", element.get("unit"), name)


def _pins_by(attribute: str) -> Callable[[list, str], dict[int, frozenset[int]]]:
    """Pin elements keyed by their `attribute` (vcpu, iothread) -> pCPUs."""
    def convert(nodes: list, name: str) -> dict[int, frozenset[int]]:
        pins: dict[int, frozenset[int]] = {}
        for element in nodes:
            key = _int(None)([element.get(attribute, "")], f"{name} {attribute}")
            cpus = _cpuset([element.get("cpuset", "")], f"{name} {key}")
            assert key is not None and cpus is not None
            pins[key] = cpus
        return pins
    return convert


_pins = _pins_by("vcpu")


def _memnodes(nodes: list, name: str) -> dict[int, frozenset[int]]:
    result = {}
    for element in nodes:
        cell = _int(None)([element.get("cellid", "")], f"{name} cellid")
        cpus = _cpuset([element.get("nodeset", "")], f"{name} {cell} nodeset")
        assert cell is not None and cpus is not None
        result[cell] = cpus
    return result


def _cells(nodes: list, name: str) -> list[tuple[int, frozenset[int], int]]:
    cells = []
    for index, element in enumerate(nodes):
        cell_id = _int(index)([element.get("id")] if element.get("id") is not None else [], f"{name} id")
        cpus = _cpuset([element.get("cpus", "")], f"{name} {cell_id} cpus") or frozenset()
        memory = to_kib(element.get("memory", "0"), element.get("unit"), f"{name} {cell_id} memory")
        assert cell_id is not None
        cells.append((cell_id, cpus, memory))
    return cells


def _page_kib(nodes: list, name: str) -> int | None:
    if not nodes:
        return None
    element = nodes[0]
    return to_kib(element.get("size", "0"), element.get("unit"), name)


def _present(nodes: list, name: str) -> bool:
    return bool(nodes)


def _attributes(nodes: list, name: str) -> dict[str, str]:
    return dict(nodes[0].attrib) if nodes else {}


def _labels(nodes: list, name: str) -> dict[str, str]:
    return {element.get("name", ""): element.text or "" for element in nodes if element.get("name")}


def _guests(nodes: list, name: str) -> tuple[str, ...]:
    return tuple(str(value) for value in nodes)


@dataclass(frozen=True)
class XmlField:
    name: str
    xpath: str
    convert: Callable[[list, str], Any]
    meaning: str


FIELDS: tuple[XmlField, ...] = (
    XmlField("guest", "/domain/name/text()", _text(""), "domain name"),
    XmlField("domain_type", "/domain/@type", _text("kvm"), "hypervisor type (kvm, qemu)"),
    XmlField("vcpus", "/domain/vcpu/text()", _int(0), "number of vCPUs"),
    XmlField("vcpu_cpuset", "/domain/vcpu/@cpuset", _cpuset, "default pCPUs of unpinned vCPUs"),
    XmlField("vcpupin", "/domain/cputune/vcpupin", _pins, "vCPU -> pCPUs"),
    XmlField("emulatorpin", "/domain/cputune/emulatorpin/@cpuset", _cpuset, "emulator threads' pCPUs"),
    XmlField("iothreadpin", "/domain/cputune/iothreadpin", _pins_by("iothread"), "IOThread -> pCPUs"),
    XmlField("memory_kib", "/domain/memory", _memory, "guest memory"),
    XmlField("mem_mode", "/domain/numatune/memory/@mode", _text("strict"), "NUMA memory policy"),
    XmlField("memory_nodeset", "/domain/numatune/memory/@nodeset", _cpuset, "host nodes backing memory"),
    XmlField("memnodes", "/domain/numatune/memnode", _memnodes, "guest cell -> host nodes"),
    XmlField("cells", "/domain/cpu/numa/cell", _cells, "guest NUMA cells (id, vCPUs, memory)"),
    XmlField("threads_per_core", "/domain/cpu/topology/@threads", _int(1), "guest SMT width"),
    XmlField("hugepages", "/domain/memoryBacking/hugepages", _present, "memory on hugepages"),
    XmlField("hugepage_kib", "/domain/memoryBacking/hugepages/page", _page_kib, "hugepage size"),
    XmlField("metadata", META, _present, "vmplacer metadata present"),
    XmlField("workload_class", f"{META}/vmplacer:workload_class/text()", _text(None), "workload class"),
    XmlField("policy", f"{META}/vmplacer:policy", _attributes, "cpu/thread/emulator/page policies"),
    XmlField("exclusive_cpus", f"{META}/vmplacer:exclusive_cpus/text()", _cpuset, "pCPUs the guest owns"),
    XmlField("score", f"{META}/vmplacer:score/text()", _float, "score when placed"),
    XmlField("labels", f"{META}/vmplacer:labels/vmplacer:label", _labels, "operator labels"),
    XmlField("affinity", f"{META}/vmplacer:affinity/@guest", _guests, "affinity peers"),
    XmlField("anti_affinity", f"{META}/vmplacer:anti_affinity/@guest", _guests, "anti-affinity peers"),
)


# FIELDS' XPaths compiled once: `tree.xpath(text)` compiles its expression on every call, most of the
# cost of reading a domain (and placing reads every new one). lxml serialises each evaluator's runs
# with a lock of its own, so threads may share them.
_COMPILED: tuple[tuple[str, etree.XPath, Callable[[list, str], Any]], ...] = tuple(
    (field.name, etree.XPath(field.xpath, namespaces=NS), field.convert) for field in FIELDS)


def read_fields(root: etree._Element) -> dict[str, Any]:
    """Evaluate every row of FIELDS against a parsed <domain>."""
    values: dict[str, Any] = {}
    tree = root.getroottree()
    for name, xpath, convert in _COMPILED:
        values[name] = convert(xpath(tree), name)
    return values
