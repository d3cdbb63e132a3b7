"""Domain XML: render a placement (fresh or merged into a caller's XML), parse it back, validate.

- Writing: the elements vmplacer owns are rendered from templates/placement.xml.j2
  (Jinja2, autoescaped) and merged with lxml into the caller's base XML, or into
  templates/domain.xml.j2 for a guest that has none — one merge path for both.
  Everything else in the base (devices, metadata of others, cputune quotas,
  memoryBacking options, the CPU model) is kept.
- Reading: one table of XPaths (domain_xml_fields.FIELDS).
- Every document returned is validated against libvirt's RelaxNG schema.
- Input XML is parsed without DTDs, entities or network access.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from lxml import etree

from vmplacer.adapters.domain_xml_fields import NAMESPACE, FieldError, read_fields
from vmplacer.adapters.xml_errors import xml_problem
from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.placement.guest import NAME_RE, GuestSpec, page_size_text
from vmplacer.core.placement.guest_placement import GuestCell, Placement
from vmplacer.core.topology.host import HostTopology
from vmplacer.resources import resource_dir

DEFAULT_SCHEMA = Path("/usr/share/libvirt/schemas/domain.rng")
TEMPLATES_DIR = resource_dir("templates")
DOMAIN_TYPES = ("kvm", "qemu")
DEFAULT_HUGEPAGE_KIB = 2048  # x86 default when <hugepages/> names no size

# Top-level order libvirt itself writes; new elements are inserted in this order.
CANONICAL_ORDER = (
    "name", "uuid", "genid", "title", "description", "metadata", "maxMemory", "memory",
    "currentMemory", "blkiotune", "memtune", "memoryBacking", "vcpu", "vcpus", "iothreads",
    "iothreadids", "defaultiothread", "cputune", "numatune", "resource", "sysinfo",
    "bootloader", "bootloader_args", "os", "idmap", "features", "cpu", "clock",
    "on_poweroff", "on_reboot", "on_crash", "on_lockfailure", "pm", "perf", "devices",
    "seclabel", "keywrap", "launchSecurity",
)
# Owned whole: replaced. Owned in part: only these children are replaced.
OWNED_WHOLE = ("memory", "currentMemory", "vcpu", "numatune")
OWNED_CHILDREN = {
    "cputune": ("vcpupin", "emulatorpin", "iothreadpin"),
    "memoryBacking": ("hugepages",),
    "cpu": ("topology", "numa"),
}
# Attributes of a caller's <cpu><numa><cell> kept when the cell survives (e.g. memAccess for vhost-user).
KEPT_CELL_ATTRIBUTES = ("memAccess", "discard")
PLACEMENT_TAG = f"{{{NAMESPACE}}}placement"


class DomainXmlError(ValueError):
    """Domain XML that cannot be produced or read; the message names the guest and the problem."""


# ----- parsing input safely ---------------------------------------------------------------------
def _parser() -> etree.XMLParser:
    return etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                           huge_tree=False, remove_blank_text=True)


def parse_domain(xml_text: str | bytes, what: str = "domain XML") -> etree._Element:
    """Parse a <domain> document, refusing DTDs/entities (no XXE, no billion laughs)."""
    if isinstance(xml_text, str):
        xml_text = xml_text.encode("utf-8")
    try:
        root = etree.fromstring(xml_text, _parser())
    except etree.XMLSyntaxError as exc:
        raise DomainXmlError(f"{what}: {xml_problem(exc)}") from None
    if root.getroottree().docinfo.doctype:
        raise DomainXmlError(f"{what}: DOCTYPE declarations are not accepted")
    if root.tag != "domain":
        raise DomainXmlError(f"{what}: root element is <{root.tag}>, expected <domain>")
    return root


# ----- schema validation ---------------------------------------------------------------------------
@lru_cache(maxsize=4)
def _relaxng(path: str) -> etree.RelaxNG:
    try:
        return etree.RelaxNG(etree.parse(path))
    except OSError:
        raise DomainXmlError(
            f"libvirt's RelaxNG schema {path} is missing: install libvirt (libvirt-daemon or "
            "libvirt-clients ships /usr/share/libvirt/schemas) or set VMPLACER_DOMAIN_SCHEMA"
        ) from None
    except (etree.XMLSyntaxError, etree.RelaxNGParseError) as exc:
        raise DomainXmlError(f"libvirt's RelaxNG schema {path} cannot be loaded: {exc}") from None


def schema_path() -> Path:
    return Path(os.environ.get("VMPLACER_DOMAIN_SCHEMA") or DEFAULT_SCHEMA)


def validate_domain(root: etree._Element, guest: str) -> None:
    """Raise DomainXmlError unless `root` is valid against libvirt's domain.rng."""
    schema = _relaxng(os.environ.get("VMPLACER_DOMAIN_SCHEMA") or str(DEFAULT_SCHEMA))  # schema_path(), as text
    if not schema.validate(root):
        errors = "; ".join(f"line {e.line}: {e.message}" for e in schema.error_log) or "unknown error"
        raise DomainXmlError(f"domain XML for guest {guest} does not validate against {schema_path()}: {errors}")


# ----- rendering --------------------------------------------------------------------------------------
@lru_cache(maxsize=4)
def _environment(directory: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        auto_reload=False,  # templates ship with vmplacer: no stat of the file on every render
    )


def _template(name: str, templates_dir: Path | None) -> jinja2.Template:
    # a string, not a Path: this runs twice per rendered domain
    directory = str(templates_dir) if templates_dir else os.environ.get("VMPLACER_TEMPLATES") or str(TEMPLATES_DIR)
    try:
        return _environment(directory).get_template(name)
    except jinja2.TemplateNotFound:
        raise DomainXmlError(f"template {name} not found in {directory}") from None


@dataclass(frozen=True)
class GuestCpuTopology:
    sockets: int
    dies: int
    cores: int
    threads: int


def guest_cpu_topology(placement: Placement) -> GuestCpuTopology:
    """<cpu><topology>: one socket per guest cell when cells are even; threads mirror the host pairs."""
    vcpus = placement.vcpus
    threads = placement.threads_per_core if placement.threads_per_core > 0 else 1
    if vcpus % threads:
        threads = 1
    cells = max(1, len(placement.cells))
    if vcpus % (cells * threads) == 0 and all(len(c.vcpus) == vcpus // cells for c in placement.cells):
        return GuestCpuTopology(cells, 1, vcpus // (cells * threads), threads)
    return GuestCpuTopology(1, 1, vcpus // threads, threads)


def _check_consistent(spec: GuestSpec, placement: Placement) -> None:
    problems = []
    if placement.guest != spec.name:
        problems.append(f"placement is for guest {placement.guest!r}")
    if sorted(placement.vcpupin) != list(range(spec.vcpus)):
        problems.append(f"placement pins vCPUs {sorted(placement.vcpupin)}, guest has 0-{spec.vcpus - 1}")
    if any(not cpus for cpus in placement.vcpupin.values()):
        problems.append("a vCPU is pinned to no pCPU")
    if placement.memory_kib != spec.memory_mib * 1024:
        problems.append(f"placement has {placement.memory_kib} KiB, guest asks {spec.memory_mib * 1024}")
    if problems:
        raise DomainXmlError(f"guest {spec.name}: cannot render: " + "; ".join(problems))


def _placement_context(spec: GuestSpec, placement: Placement) -> dict[str, Any]:
    cells = placement.cells or (GuestCell(0, frozenset(placement.vcpupin), placement.memory_kib,
                                          min(placement.memory_nodes, default=0)),)
    memory_nodes = placement.memory_nodes or frozenset(c.memory_host_node for c in cells)
    top_nodes = memory_nodes
    if placement.mem_mode == "preferred" and len(memory_nodes) > 1:
        # libvirt/QEMU accept one node for a preferred default policy; cells keep their own.
        top_nodes = frozenset({min(cells, key=lambda c: c.id).memory_host_node})
    return {
        "namespace": NAMESPACE,
        "memory_kib": placement.memory_kib,
        "vcpus": placement.vcpus,
        "vcpupin": [{"vcpu": v, "cpuset": format_cpuset(c)} for v, c in sorted(placement.vcpupin.items())],
        "emulatorpin": format_cpuset(placement.emulatorpin),
        "mem_mode": placement.mem_mode,
        "memory_nodeset": format_cpuset(top_nodes),
        "cells": [{"id": c.id, "cpus": format_cpuset(c.vcpus), "memory_kib": c.memory_kib,
                   "memory_node": c.memory_host_node} for c in sorted(cells, key=lambda c: c.id)],
        "cell_ids": format_cpuset(c.id for c in cells),
        "hugepage_kib": placement.hugepage_kib,
        "topology": guest_cpu_topology(placement),
        "meta": {
            "workload_class": spec.workload_class,
            "cpu_policy": spec.cpu_policy,
            "thread_policy": spec.thread_policy,
            "emulator_threads": spec.emulator_threads,
            "mem_page_size": page_size_text(spec.mem_page_size),
            "dedicated_vcpus": format_cpuset(spec.dedicated_vcpus),
            "exclusive_cpus": format_cpuset(placement.exclusive_cpus),
            "score": f"{placement.score:.6f}",
            "labels": sorted(spec.labels.items()),
            "affinity": spec.affinity,
            "anti_affinity": spec.anti_affinity,
        },
    }


def render_domain(
    spec: GuestSpec,
    placement: Placement,
    *,
    base_xml: str | None = None,
    domain_type: str = "kvm",
    arch: str = "x86_64",
    uuid: str | None = None,
    templates_dir: Path | None = None,
) -> str:
    """Domain XML for `spec` placed as `placement`, validated against libvirt's schema.

    With `base_xml`, only the elements vmplacer owns are replaced; the rest of
    the caller's document is kept. Without it, a minimal domain of
    `domain_type` ('kvm', or 'qemu' where hardware virtualization is missing).
    """
    return domain_text(render_domain_tree(spec, placement, base_xml=base_xml, domain_type=domain_type, arch=arch,
                                          uuid=uuid, templates_dir=templates_dir))


def domain_text(root: etree._Element) -> str:
    """The document libvirt is given for a rendered tree (render_domain_tree)."""
    return etree.tostring(root, encoding="unicode") + "\n"


def render_domain_tree(
    spec: GuestSpec,
    placement: Placement,
    *,
    base_xml: str | None = None,
    domain_type: str = "kvm",
    arch: str = "x86_64",
    uuid: str | None = None,
    templates_dir: Path | None = None,
) -> etree._Element:
    """render_domain's validated, indented tree, before it becomes text: a caller that holds the
    document to a policy too (bootstrap.container.render) walks this tree instead of parsing the text
    back, then takes domain_text(tree)."""
    _check_consistent(spec, placement)
    if base_xml is None:
        if domain_type not in DOMAIN_TYPES:
            raise DomainXmlError(f"guest {spec.name}: domain type must be kvm or qemu, got {domain_type!r}")
        skeleton = _template("domain.xml.j2", templates_dir).render(
            name=spec.name, domain_type=domain_type, arch=arch, uuid=uuid,
            memory_kib=placement.memory_kib)
        root = parse_domain(skeleton, f"template domain.xml.j2 for guest {spec.name}")
    else:
        root = parse_domain(base_xml, f"base XML of guest {spec.name}")
    owned_text = _template("placement.xml.j2", templates_dir).render(**_placement_context(spec, placement))
    try:
        owned = etree.fromstring(owned_text.encode("utf-8"), _parser())
    except etree.XMLSyntaxError as exc:  # a template bug, never caller input (autoescaped)
        raise DomainXmlError(f"guest {spec.name}: placement template produced bad XML: {exc}") from None
    merge_owned(root, owned, spec.name)
    _pin_iothreads(root, placement.emulatorpin)
    validate_domain(root, spec.name)
    etree.indent(root, space="  ")
    return root


def iothread_ids(root: etree._Element) -> list[int]:
    """The domain's IOThread ids: those `<iothreadids>` lists, else 1..`<iothreads>`."""
    listed = [int(e.get("id")) for e in root.findall("iothreadids/iothread") if (e.get("id") or "").isdigit()]
    if listed:
        return sorted(listed)
    count = (root.findtext("iothreads") or "").strip()
    return list(range(1, int(count) + 1)) if count.isdigit() else []


def _pin_iothreads(root: etree._Element, emulator: frozenset[int]) -> None:
    """Every IOThread runs where the guest's emulator threads run (core/placement/isolation.py: off the
    pCPUs other guests own): a caller's own iothread pins are replaced, as its vCPU pins are."""
    cputune = root.find("cputune")
    ids = iothread_ids(root)
    if not emulator or not ids or cputune is None:
        return
    for iothread in ids:
        _insert_child(cputune, etree.Element("iothreadpin", iothread=str(iothread), cpuset=format_cpuset(emulator)))


# ----- merging ----------------------------------------------------------------------------------------
def _insert_ranked(parent: etree._Element, child: etree._Element, ranks: dict[str, int]) -> None:
    """Insert `child` after the last child that ranks at or before it (unranked children and
    comments stay where they are; an unranked child goes after every ranked one)."""
    rank = ranks.get(child.tag, len(ranks))
    position = 0
    for index, existing in enumerate(parent):
        other = ranks.get(existing.tag) if isinstance(existing.tag, str) else None
        if other is not None and other <= rank:
            position = index + 1
    parent.insert(position, child)


_CANONICAL_RANK = {tag: rank for rank, tag in enumerate(CANONICAL_ORDER)}


def _insert_canonical(root: etree._Element, element: etree._Element) -> None:
    """Insert a new top-level element where libvirt would write it."""
    _insert_ranked(root, element, _CANONICAL_RANK)


def _replace_whole(root: etree._Element, new: etree._Element) -> None:
    old = root.find(new.tag)
    for extra in root.findall(new.tag)[1:]:
        root.remove(extra)
    if old is not None:
        root.replace(old, new)
    else:
        _insert_canonical(root, new)


def _merge_children(root: etree._Element, new: etree._Element, owned: tuple[str, ...]) -> None:
    """Replace the owned children of one element; keep its attributes and other children."""
    target = root.find(new.tag)
    created = target is None
    if target is None:
        target = etree.Element(new.tag)
    kept_cells = {}
    if new.tag == "cpu":
        for cell in target.findall("numa/cell"):
            kept_cells[cell.get("id")] = {k: cell.get(k) for k in KEPT_CELL_ATTRIBUTES if cell.get(k)}
    for child in list(target):
        if isinstance(child.tag, str) and child.tag in owned:
            target.remove(child)
    for child in list(new):
        if new.tag == "cpu" and child.tag == "numa":
            for cell in child.findall("cell"):
                for key, value in kept_cells.get(cell.get("id"), {}).items():
                    cell.set(key, value)
        _insert_child(target, child)
    if len(target) == 0 and not target.attrib and (target.text or "").strip() == "" and new.tag != "cpu":
        if not created:
            root.remove(target)
        return
    if created:
        _insert_canonical(root, target)


# Child order libvirt writes inside the partly owned elements.
_CHILD_ORDER = {
    "cputune": ("shares", "global_period", "global_quota", "period", "quota", "emulator_period",
                "emulator_quota", "iothread_period", "iothread_quota", "vcpupin", "emulatorpin",
                "iothreadpin", "vcpusched", "iothreadsched", "emulatorsched", "cachetune", "memorytune"),
    "memoryBacking": ("hugepages", "nosharepages", "locked", "source", "access", "allocation", "discard"),
    "cpu": ("model", "vendor", "topology", "cache", "maxphysaddr", "feature", "numa"),
}


_CHILD_RANK = {parent: {tag: rank for rank, tag in enumerate(order)} for parent, order in _CHILD_ORDER.items()}


def _insert_child(parent: etree._Element, child: etree._Element) -> None:
    _insert_ranked(parent, child, _CHILD_RANK.get(parent.tag, {}))


def merge_owned(root: etree._Element, owned: etree._Element, guest: str) -> None:
    """Put vmplacer's elements into `root` (a <domain>), leaving the rest alone."""
    name = root.find("name")
    if name is None:
        name = etree.Element("name")
        _insert_canonical(root, name)
    name.text = guest
    vcpus_element = root.find("vcpus")
    new_vcpu = owned.find("vcpu")
    if vcpus_element is not None and new_vcpu is not None and \
            len(vcpus_element.findall("vcpu")) != int(new_vcpu.text or 0):
        root.remove(vcpus_element)  # per-vCPU hotplug state for a different count
    for tag in OWNED_WHOLE:
        element = owned.find(tag)
        if element is not None:
            _replace_whole(root, element)
    for tag, children in OWNED_CHILDREN.items():
        element = owned.find(tag)
        if element is not None:
            _merge_children(root, element, children)
    meta = owned.find(PLACEMENT_TAG)
    if meta is not None:
        metadata = root.find("metadata")
        if metadata is None:
            metadata = etree.Element("metadata")
            _insert_canonical(root, metadata)
        for old in metadata.findall(PLACEMENT_TAG):
            metadata.remove(old)
        metadata.append(meta)
    etree.cleanup_namespaces(root)


# ----- parsing back -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlacementMetadata:
    """What vmplacer stored in <metadata> (None when the domain was not placed by vmplacer)."""

    workload_class: str
    cpu_policy: str
    thread_policy: str
    emulator_threads: str
    mem_page_size: str
    labels: dict[str, str]
    affinity: tuple[str, ...]
    anti_affinity: tuple[str, ...]


def _fields(xml_text: str, what: str) -> dict[str, Any]:
    root = parse_domain(xml_text, what)
    try:
        return read_fields(root)
    except FieldError as exc:
        raise DomainXmlError(f"{what}: {exc}") from None


def parse_metadata(xml_text: str) -> PlacementMetadata | None:
    values = _fields(xml_text, "domain XML")
    if not values["metadata"]:
        return None
    policy = values["policy"]
    return PlacementMetadata(
        workload_class=values["workload_class"] or "unknown",
        cpu_policy=policy.get("cpu", "shared"),
        thread_policy=policy.get("thread", "prefer"),
        emulator_threads=policy.get("emulator", "share"),
        mem_page_size=policy.get("mem_page_size", "small"),
        labels=values["labels"],
        affinity=values["affinity"],
        anti_affinity=values["anti_affinity"],
    )


def parse_labels(xml_text: str) -> dict[str, str]:
    """The operator labels vmplacer stored (empty for foreign domains)."""
    return dict(_fields(xml_text, "domain XML")["labels"])


def parse_placement(xml_text: str, host: str, topology: HostTopology | None = None) -> Placement:
    """The Placement a (live or defined) domain describes.

    Works for domains vmplacer did not place: unpinned vCPUs take the
    <vcpu cpuset> default, else every online pCPU of `topology` (empty when
    unknown, meaning "anywhere"). Without vmplacer metadata, a domain whose
    vCPUs each sit alone on a distinct pCPU counts as dedicated.
    """
    return _placement(_fields(xml_text, f"domain XML on host {host}"), host, topology)


def parse_placement_and_labels(xml_text: str, host: str) -> tuple[Placement, dict[str, str]]:
    """`parse_placement` (no topology) and `parse_labels` from one parse of the document."""
    values = _fields(xml_text, f"domain XML on host {host}")
    return _placement(values, host, None), dict(values["labels"])


def _placement(values: dict[str, Any], host: str, topology: HostTopology | None) -> Placement:
    guest = values["guest"] or "<unnamed>"
    vcpus = values["vcpus"] or len(values["vcpupin"])
    fallback = values["vcpu_cpuset"]
    if fallback is None:
        fallback = topology.online_cpus if topology is not None else frozenset()
    vcpupin = {v: values["vcpupin"].get(v, fallback) for v in range(vcpus)}
    memnodes: dict[int, frozenset[int]] = values["memnodes"]
    memory_nodes = set(values["memory_nodeset"] or ())
    for nodes in memnodes.values():
        memory_nodes |= nodes
    cells = []
    for cell_id, cell_vcpus, memory in values["cells"]:
        node = _cell_node(cell_id, cell_vcpus, memnodes, memory_nodes, vcpupin, topology)
        cells.append(_apart_from_vcpus(GuestCell(cell_id, cell_vcpus, memory, node), vcpupin, topology))
    page = values["hugepage_kib"]
    if values["hugepages"] and page is None:
        page = _default_hugepage(topology)
    metadata = values["metadata"]
    policy = values["policy"]
    exclusive = values["exclusive_cpus"] or frozenset()
    if metadata:
        dedicated = policy.get("cpu") == "dedicated" or values["workload_class"] == "latency-critical"
    else:
        singles = [next(iter(c)) for c in vcpupin.values() if len(c) == 1]
        dedicated = vcpus > 0 and len(singles) == vcpus and len(set(singles)) == vcpus
    if not exclusive and dedicated:
        exclusive = frozenset(c for pins in vcpupin.values() for c in pins)
    return Placement(
        guest=guest,
        host=host,
        vcpupin=vcpupin,
        emulatorpin=values["emulatorpin"] or frozenset(),
        memory_nodes=frozenset(memory_nodes),
        mem_mode=values["mem_mode"],
        cells=tuple(sorted(cells, key=lambda c: c.id)),
        memory_kib=values["memory_kib"],
        hugepage_kib=page,
        threads_per_core=values["threads_per_core"] or 1,
        dedicated=dedicated,
        exclusive_cpus=exclusive,
        score=values["score"] or 0.0,
        anti_affinity=_refused(values["anti_affinity"], guest) if metadata else (),
        iothreadpin=values["iothreadpin"],
    )


def _refused(names: tuple[str, ...], guest: str) -> tuple[str, ...]:
    """The anti-affinity peers a domain's metadata names, as a guest spec would accept them
    (valid guest names, not itself, each once): anything else names no guest vmplacer places."""
    kept: list[str] = []
    for name in names:
        if NAME_RE.match(name) and name != guest and name not in kept:
            kept.append(name)
    return tuple(kept)


def _cell_node(cell_id: int, cell_vcpus: frozenset[int], memnodes: dict[int, frozenset[int]],
               memory_nodes: set[int], vcpupin: dict[int, frozenset[int]],
               topology: HostTopology | None) -> int:
    """The host node behind a guest cell: its memnode, else the only memory node, else its pCPUs."""
    if memnodes.get(cell_id):
        return min(memnodes[cell_id])
    if len(memory_nodes) == 1:
        return next(iter(memory_nodes))
    if topology is not None:
        nodes = sorted({topology.cpus[c].node for v in cell_vcpus for c in vcpupin.get(v, ())
                        if c in topology.cpus})
        if nodes:
            return nodes[0]
    return -1


def _apart_from_vcpus(cell: GuestCell, vcpupin: dict[int, frozenset[int]],
                      topology: HostTopology | None) -> GuestCell:
    """A cell whose memory node is memory-only: its vCPUs' node as `host_node`, the memory node apart.

    Without the topology a memory-only node cannot be told from a CPU node; the
    cell then keeps the memory node as its node, which accounts memory the same.
    """
    if topology is None or cell.host_node not in topology.memory_only_nodes:
        return cell
    nodes = sorted({topology.cpus[c].node for v in cell.vcpus for c in vcpupin.get(v, ()) if c in topology.cpus})
    if len(nodes) != 1:
        return cell
    return replace(cell, host_node=nodes[0], memory_node=cell.host_node)


def _default_hugepage(topology: HostTopology | None) -> int:
    if topology is not None:
        sizes = sorted({p.size_kib for n in topology.nodes.values() for p in n.hugepages if p.size_kib > 4})
        if sizes:
            return sizes[0]
    return DEFAULT_HUGEPAGE_KIB


# ----- pins of a defined domain ----------------------------------------------------------------------
def with_pin(xml_text: str, cpus: frozenset[int], vcpu: int | None = None) -> str:
    """The domain document with one vCPU's pins (`vcpu`) or the emulator's and its IOThreads'
    (None) set to `cpus`: how an inactive domain's pins change (libvirt's pin calls need a
    cpumap the size of the host it runs on, which a defined-only domain of a modelled host does
    not have)."""
    root = parse_domain(xml_text, "domain XML read back from libvirt")
    cputune = root.find("cputune")
    if cputune is None:
        cputune = etree.Element("cputune")
        _insert_canonical(root, cputune)
    cpuset = format_cpuset(cpus)
    if vcpu is None:
        element = cputune.find("emulatorpin")
        if element is None:
            element = etree.Element("emulatorpin")
            _insert_child(cputune, element)
        for old in cputune.findall("iothreadpin"):
            cputune.remove(old)
        _pin_iothreads(root, cpus)
    else:
        element = next((e for e in cputune.findall("vcpupin") if e.get("vcpu") == str(vcpu)), None)
        if element is None:
            element = etree.Element("vcpupin", vcpu=str(vcpu))
            _insert_child(cputune, element)
    element.set("cpuset", cpuset)
    return etree.tostring(root, encoding="unicode")



def _own_exclusive(placement: etree._Element, cpus: frozenset[int]) -> None:
    namespace = etree.QName(placement).namespace  # libvirt hands the element out without its namespace
    tag = f"{{{namespace}}}exclusive_cpus" if namespace else "exclusive_cpus"
    element = placement.find(tag)
    if element is None:
        element = etree.SubElement(placement, tag)
    element.text = format_cpuset(cpus) if cpus else ""


def document_with_exclusive_cpus(xml_text: str, cpus: frozenset[int]) -> str | None:
    """The domain document saying, in its vmplacer metadata, that the guest owns `cpus`
    exclusively; None when it has no vmplacer metadata (a foreign domain: what it owns is read
    from its pins). A repin of a dedicated guest moves what it owns, and the metadata is what
    every later read of the host believes."""
    root = parse_domain(xml_text, "domain XML read back from libvirt")
    placement = root.find(f"metadata/{PLACEMENT_TAG}")
    if placement is None:
        return None
    _own_exclusive(placement, cpus)
    return etree.tostring(root, encoding="unicode")


def metadata_with_exclusive_cpus(element_xml: str, cpus: frozenset[int]) -> str:
    """`document_with_exclusive_cpus` for the vmplacer metadata element alone (what libvirt's
    virDomainGetMetadata returns, without its namespace, and virDomainSetMetadata takes)."""
    try:
        placement = etree.fromstring(element_xml.encode("utf-8"), _parser())
    except etree.XMLSyntaxError as exc:
        raise DomainXmlError(f"vmplacer metadata read back from libvirt: not well-formed XML: {exc}") from None
    if etree.QName(placement).localname != "placement":
        raise DomainXmlError(f"vmplacer metadata read back from libvirt: root element is <{placement.tag}>")
    _own_exclusive(placement, cpus)
    return etree.tostring(placement, encoding="unicode")
