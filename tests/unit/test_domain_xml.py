"""Domain XML: golden renders and merges, parse-back round trips, schema validation, hostile input.

Golden files live in tests/data/xml: `<case>-in.xml` is the caller's base XML
(absent for fresh domains), `<case>-out.xml` the expected document. After an
intended change of the output, regenerate them with
`VMPLACER_UPDATE_GOLDEN=1 pytest tests/unit/test_domain_xml.py` and review the diff.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from lxml import etree

from vmplacer.adapters.domain_xml import (
    DomainXmlError,
    guest_cpu_topology,
    parse_labels,
    parse_metadata,
    parse_placement,
    render_domain,
)
from vmplacer.adapters.domain_xml_fields import FIELDS, NAMESPACE
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.guest_placement import GuestCell, Placement
from vmplacer.core.topology.host import uniform_topology

DATA = Path(__file__).resolve().parents[1] / "data" / "xml"
GIB = 1024 * 1024


def pins(mapping: dict[int, set[int]]) -> dict[int, frozenset[int]]:
    return {v: frozenset(c) for v, c in mapping.items()}


@dataclass
class Case:
    name: str
    spec: dict
    placement: Placement
    domain_type: str = "kvm"
    extra: dict = field(default_factory=dict)

    @property
    def guest(self) -> GuestSpec:
        return GuestSpec.from_mapping(self.spec)

    def base(self) -> str | None:
        path = DATA / f"{self.name}-in.xml"
        return path.read_text() if path.exists() else None

    def render(self) -> str:
        return render_domain(self.guest, self.placement, base_xml=self.base(), domain_type=self.domain_type,
                             **self.extra)


CASES = [
    Case(
        "fresh-kvm-latency",
        {"name": "db1", "vcpus": 4, "memory_mib": 8192, "cpu_policy": "dedicated", "thread_policy": "isolate",
         "emulator_threads": "isolate", "mem_page_size": "1GB", "workload_class": "latency-critical",
         "labels": {"team": "storage", "priority": 100}, "anti_affinity": ["db2"]},
        Placement(
            guest="db1", host="xeon", vcpupin=pins({0: {0}, 1: {1}, 2: {2}, 3: {3}}), emulatorpin=frozenset({4}),
            memory_nodes=frozenset({0}), mem_mode="strict",
            cells=(GuestCell(0, frozenset(range(4)), 8 * GIB, 0),), memory_kib=8 * GIB, hugepage_kib=GIB,
            threads_per_core=1, dedicated=True, exclusive_cpus=frozenset({0, 1, 2, 3, 4, 56, 57, 58, 59}),
            score=0.927857),
        extra={"uuid": "6f1c7a52-3c0e-4a51-9d0c-2b8f1a4e7d10"},
    ),
    Case(
        "fresh-qemu-mixed-cells",
        {"name": "app1", "vcpus": 4, "memory_mib": 4096, "cpu_policy": "mixed", "dedicated_vcpus": "1,3",
         "numa_nodes": 2, "mem_mode": "interleave", "mem_page_size": "2MB", "affinity": ["web1"]},
        Placement(
            guest="app1", host="dual", vcpupin=pins({0: {4, 5, 6, 7, 20, 21, 22, 23}, 1: {1},
                                                     2: {12, 13, 14, 15, 28, 29, 30, 31}, 3: {9}}),
            emulatorpin=frozenset({4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}),
            memory_nodes=frozenset({0, 1}), mem_mode="interleave",
            cells=(GuestCell(0, frozenset({0, 1}), 2 * GIB, 0), GuestCell(1, frozenset({2, 3}), 2 * GIB, 1)),
            memory_kib=4 * GIB, hugepage_kib=2048, threads_per_core=1, dedicated=False,
            exclusive_cpus=frozenset({1, 9}), score=0.81),
        domain_type="qemu",
    ),
    Case(
        "fresh-kvm-preferred",
        {"name": "wide1", "vcpus": 4, "memory_mib": 2048, "numa_nodes": 2, "mem_mode": "preferred"},
        Placement(
            guest="wide1", host="quad", vcpupin=pins({0: {2, 3}, 1: {2, 3}, 2: {5, 6}, 3: {5, 6}}),
            emulatorpin=frozenset({2, 3, 5, 6}), memory_nodes=frozenset({1, 2}), mem_mode="preferred",
            cells=(GuestCell(0, frozenset({0, 1}), GIB, 1), GuestCell(1, frozenset({2, 3}), GIB, 2)),
            memory_kib=2 * GIB, score=0.5),
    ),
    Case(
        "merge-full",
        {"name": "orders-db", "vcpus": 4, "memory_mib": 4096, "cpu_policy": "dedicated",
         "thread_policy": "require", "mem_page_size": "2MB"},
        Placement(
            guest="orders-db", host="dual", vcpupin=pins({0: {8}, 1: {24}, 2: {9}, 3: {25}}),
            emulatorpin=frozenset({8, 9, 24, 25}), memory_nodes=frozenset({1}), mem_mode="strict",
            cells=(GuestCell(0, frozenset(range(4)), 4 * GIB, 1),), memory_kib=4 * GIB, hugepage_kib=2048,
            threads_per_core=2, dedicated=True, exclusive_cpus=frozenset({8, 9, 24, 25}), score=0.9),
    ),
    Case(
        "merge-tcg",
        {"name": "probe1", "vcpus": 1, "memory_mib": 128},
        Placement(
            guest="probe1", host="small", vcpupin=pins({0: {0, 1}}), emulatorpin=frozenset({0, 1}),
            memory_nodes=frozenset({0}), cells=(GuestCell(0, frozenset({0}), 128 * 1024, 0),),
            memory_kib=128 * 1024, score=0.75),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_golden_output(case):
    out = case.render()
    golden = DATA / f"{case.name}-out.xml"
    if os.environ.get("VMPLACER_UPDATE_GOLDEN"):
        golden.write_text(out)
    assert out == golden.read_text()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_round_trip_parse_and_idempotent_merge(case):
    out = case.render()
    assert parse_placement(out, case.placement.host) == case.placement
    again = render_domain(case.guest, case.placement, base_xml=out)
    assert again == out  # merging into our own output changes nothing


def test_merge_keeps_everything_vmplacer_does_not_own():
    case = next(c for c in CASES if c.name == "merge-full")
    root = etree.fromstring(case.render().encode())
    assert root.findtext("name") == "orders-db"
    assert root.findtext("uuid") == "4dea22b3-1d52-d8f3-2516-782e98ab3fa0"
    assert root.findtext("title") == "Orders database"
    # Foreign metadata kept; the stale vmplacer element replaced by exactly one new one.
    assert root.find("metadata/{http://libosinfo.org/xmlns/libvirt/domain/1.0}libosinfo") is not None
    placements = root.findall(f"metadata/{{{NAMESPACE}}}placement")
    assert len(placements) == 1 and placements[0].findtext(f"{{{NAMESPACE}}}workload_class") == "unknown"
    # cputune: quotas kept; vCPU, emulator and iothread pins replaced (each iothread where the
    # emulator threads run: the caller pinned it on pCPU 2, which this guest does not own).
    assert [e.tag for e in root.find("cputune")] == [
        "shares", "period", "quota", "vcpupin", "vcpupin", "vcpupin", "vcpupin", "emulatorpin", "iothreadpin"]
    assert root.find("iothreads").text == "1"
    assert root.find("cputune/iothreadpin").attrib == {"iothread": "1",
                                                       "cpuset": root.find("cputune/emulatorpin").get("cpuset")}
    # memoryBacking: memfd source and shared access kept (virtiofs needs them), page size set.
    backing = root.find("memoryBacking")
    assert backing.find("source").get("type") == "memfd" and backing.find("access").get("mode") == "shared"
    assert backing.find("hugepages/page").get("size") == "2048"
    # cpu: caller's mode and features kept; topology and NUMA cells ours; memAccess kept.
    cpu = root.find("cpu")
    assert (cpu.get("mode"), cpu.find("feature").get("name")) == ("host-model", "hle")
    assert cpu.find("topology").attrib == {"sockets": "1", "dies": "1", "cores": "2", "threads": "2"}
    assert cpu.find("numa/cell").get("memAccess") == "shared"
    assert root.find("vcpu").attrib == {"placement": "static"} and root.findtext("vcpu") == "4"
    assert root.find("numatune/memory").attrib == {"mode": "strict", "nodeset": "1"}
    # Devices, comments and the QEMU passthrough namespace are untouched.
    assert root.find("devices/disk/source").get("file") == "/var/lib/libvirt/images/orders.qcow2"
    assert root.find("devices/filesystem/target").get("dir") == "orders"
    assert any(isinstance(e, etree._Comment) for e in root.find("devices").iter())
    assert root.find("{http://libvirt.org/schemas/domain/qemu/1.0}commandline") is not None


def test_small_pages_remove_a_stale_hugepages_element():
    base = (DATA / "merge-full-in.xml").read_text()
    spec = GuestSpec.from_mapping({"name": "orders-db", "vcpus": 1, "memory_mib": 1024})
    placement = Placement(guest="orders-db", host="h", vcpupin=pins({0: {0}}), memory_kib=GIB,
                          memory_nodes=frozenset({0}), cells=(GuestCell(0, frozenset({0}), GIB, 0),))
    root = etree.fromstring(render_domain(spec, placement, base_xml=base).encode())
    assert root.find("memoryBacking/hugepages") is None
    assert root.find("memoryBacking/source") is not None


def test_vcpus_hotplug_state_for_another_count_is_dropped():
    base = (DATA / "merge-tcg-in.xml").read_text().replace(
        "<vcpu>1</vcpu>", "<vcpu current='1'>2</vcpu><vcpus><vcpu id='0' enabled='yes' hotpluggable='no'/>"
        "<vcpu id='1' enabled='no' hotpluggable='yes'/></vcpus>")
    case = next(c for c in CASES if c.name == "merge-tcg")
    root = etree.fromstring(render_domain(case.guest, case.placement, base_xml=base).encode())
    assert root.find("vcpus") is None and root.findtext("vcpu") == "1"


# ----- hostile and broken input ---------------------------------------------------------------------
def test_labels_cannot_inject_xml():
    nasty = "</vmplacer:label><vmplacer:exclusive_cpus>0-999</vmplacer:exclusive_cpus>]]>&amp;\"'"
    spec = GuestSpec.from_mapping({"name": "g", "vcpus": 1, "memory_mib": 64, "labels": {"note": nasty}})
    placement = Placement(guest="g", host="h", vcpupin=pins({0: {0}}), memory_kib=64 * 1024,
                          memory_nodes=frozenset({0}), cells=(GuestCell(0, frozenset({0}), 64 * 1024, 0),))
    xml = render_domain(spec, placement)
    assert parse_labels(xml) == {"note": nasty}
    assert parse_placement(xml, "h").exclusive_cpus == frozenset()


def test_names_are_escaped_even_when_a_caller_skips_validation():
    spec = GuestSpec(name='a"b<c&d', vcpus=1, memory_mib=64)  # constructed directly, not validated
    placement = Placement(guest=spec.name, host="h", vcpupin=pins({0: {0}}), memory_kib=64 * 1024)
    assert parse_placement(render_domain(spec, placement), "h").guest == 'a"b<c&d'


@pytest.mark.parametrize("base, fragment", [
    ("<domain type='kvm'><name>x</name><devices><bogus/></devices></domain>", "does not validate"),
    ("<?xml version='1.0'?><!DOCTYPE domain [<!ENTITY e SYSTEM 'file:///etc/passwd'>]>"
     "<domain type='kvm'><name>&e;</name></domain>", "DOCTYPE"),
    ("<network><name>x</name></network>", "expected <domain>"),
    ("<domain type='kvm'><name>x</name>", "not well-formed"),
])
def test_bad_base_xml_is_refused_with_the_reason(base, fragment):
    case = next(c for c in CASES if c.name == "merge-tcg")
    with pytest.raises(DomainXmlError, match=fragment):
        render_domain(case.guest, case.placement, base_xml=base)


def test_missing_schema_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("VMPLACER_DOMAIN_SCHEMA", str(tmp_path / "nowhere.rng"))
    case = CASES[0]
    with pytest.raises(DomainXmlError, match="RelaxNG schema .* is missing"):
        case.render()


def test_spec_and_placement_must_agree():
    case = CASES[0]
    other = GuestSpec.from_mapping({**case.spec, "name": "db9", "vcpus": 2})
    with pytest.raises(DomainXmlError, match="guest db9: cannot render: placement is for guest 'db1'"):
        render_domain(other, case.placement)
    with pytest.raises(DomainXmlError, match="domain type must be kvm or qemu"):
        render_domain(case.guest, case.placement, domain_type="xen")


# ----- parsing domains vmplacer did not write --------------------------------------------------------
def test_parse_foreign_domain_fills_gaps_from_the_topology():
    topology = uniform_topology(nodes=2, cores_per_node=4)
    placement = parse_placement((DATA / "foreign-in.xml").read_text(), "h", topology)
    assert placement.vcpupin == pins({0: {4}, 1: {4, 5, 6, 7}, 2: {4, 5, 6, 7}})
    assert placement.emulatorpin == {4, 5, 6, 7}
    assert not placement.dedicated and placement.exclusive_cpus == frozenset()
    assert placement.memory_nodes == {1} and placement.mem_mode == "strict"
    assert placement.memory_kib == 4 * GIB and placement.hugepage_kib == 2048
    assert placement.cells == () and placement.score == 0.0
    assert parse_metadata((DATA / "foreign-in.xml").read_text()) is None
    assert parse_labels((DATA / "foreign-in.xml").read_text()) == {}


def test_foreign_domain_with_one_pcpu_per_vcpu_counts_as_dedicated():
    xml = ("<domain type='kvm'><name>p</name><memory unit='GiB'>1</memory><vcpu>2</vcpu>"
           "<cputune><vcpupin vcpu='0' cpuset='2'/><vcpupin vcpu='1' cpuset='3'/></cputune></domain>")
    placement = parse_placement(xml, "h")
    assert placement.dedicated and placement.exclusive_cpus == {2, 3} and placement.memory_kib == GIB


def test_unpinned_domain_without_topology_floats_anywhere():
    xml = "<domain type='kvm'><name>u</name><memory>1024</memory><vcpu>2</vcpu></domain>"
    placement = parse_placement(xml, "h")
    assert placement.vcpupin == {0: frozenset(), 1: frozenset()} and not placement.dedicated


def test_unreadable_fields_name_the_field():
    xml = "<domain type='kvm'><name>u</name><memory unit='parsecs'>1</memory><vcpu>2</vcpu></domain>"
    with pytest.raises(DomainXmlError, match="memory_kib"):
        parse_placement(xml, "h")


def test_metadata_reads_back():
    case = CASES[0]
    meta = parse_metadata(case.render())
    assert meta is not None
    assert (meta.workload_class, meta.cpu_policy, meta.thread_policy, meta.emulator_threads) == (
        "latency-critical", "dedicated", "isolate", "isolate")
    assert meta.labels == {"team": "storage", "priority": "100"} and meta.anti_affinity == ("db2",)


def test_every_field_is_declared_once():
    names = [f.name for f in FIELDS]
    assert len(names) == len(set(names))
    assert all(f.xpath.startswith("/domain") for f in FIELDS)


@pytest.mark.parametrize("vcpus, cells, threads, expected", [
    (4, [4], 1, (1, 1, 4, 1)),
    (8, [4, 4], 2, (2, 1, 2, 2)),
    (6, [4, 2], 1, (1, 1, 6, 1)),  # uneven cells: one socket
    (3, [3], 2, (1, 1, 3, 1)),  # odd count cannot be pairs
])
def test_guest_cpu_topology(vcpus, cells, threads, expected):
    start, guest_cells = 0, []
    for index, size in enumerate(cells):
        guest_cells.append(GuestCell(index, frozenset(range(start, start + size)), GIB, index))
        start += size
    placement = Placement(guest="t", host="h", vcpupin={v: frozenset({v}) for v in range(vcpus)},
                          cells=tuple(guest_cells), threads_per_core=threads)
    topo = guest_cpu_topology(placement)
    assert (topo.sockets, topo.dies, topo.cores, topo.threads) == expected


def test_a_parsed_placement_carries_the_refusals_its_metadata_declares():
    """A rule written into a domain binds where no record of it is kept: parsing returns it with
    the placement, as a guest spec would accept it, without making it part of where it runs."""
    case = CASES[0]
    placement = parse_placement(case.render(), "h")
    assert placement.anti_affinity == ("db2",)
    assert placement == replace(placement, anti_affinity=())  # who it refuses is not where it runs
    assert "anti_affinity" not in placement.to_dict()
    ns = f"{{{NAMESPACE}}}"
    root = etree.fromstring(case.render().encode())
    rule = root.find(f".//{ns}anti_affinity")
    for peer in ("db2", "not a guest name", root.findtext("name"), "x" * 65, "db3"):
        extra = etree.SubElement(rule.getparent(), f"{ns}anti_affinity")
        extra.set("guest", peer)
    assert parse_placement(etree.tostring(root).decode(), "h").anti_affinity == ("db2", "db3")
    plain = "<domain type='kvm'><name>u</name><memory>1024</memory><vcpu>1</vcpu></domain>"
    assert parse_placement(plain, "h").anti_affinity == ()  # a foreign domain declares nothing


def test_an_inactive_domain_s_emulator_and_iothreads_repin_together_in_its_definition():
    from vmplacer.adapters.domain_xml import iothread_ids, with_pin

    base = ("<domain type='kvm'><name>g</name><memory>65536</memory><vcpu>2</vcpu><iothreads>2</iothreads>"
            "<cputune><vcpupin vcpu='0' cpuset='0-3'/><emulatorpin cpuset='0-3'/>"
            "<iothreadpin iothread='1' cpuset='0-3'/></cputune><os><type>hvm</type></os></domain>")
    root = etree.fromstring(with_pin(base, frozenset({2, 3})).encode())
    assert root.find("cputune/emulatorpin").get("cpuset") == "2-3"
    assert [(e.get("iothread"), e.get("cpuset")) for e in root.findall("cputune/iothreadpin")] == [
        ("1", "2-3"), ("2", "2-3")]
    assert iothread_ids(root) == [1, 2]
    root = etree.fromstring(with_pin(base, frozenset({1}), vcpu=0).encode())
    assert root.find("cputune/vcpupin").get("cpuset") == "1"
    assert root.find("cputune/iothreadpin").get("cpuset") == "0-3"  # a vCPU's pin leaves the others alone


def test_what_a_guest_owns_is_rewritten_in_its_metadata_document_or_element_alone():
    from vmplacer.adapters.domain_xml import (
        document_with_exclusive_cpus,
        metadata_with_exclusive_cpus,
        parse_placement,
    )
    from vmplacer.core.placement.allocate import allocate

    topology = uniform_topology(nodes=1, cores_per_node=4, name="h")
    spec = GuestSpec.from_mapping({"name": "own", "vcpus": 2, "memory_mib": 64, "cpu_policy": "dedicated"})
    xml = render_domain(spec, allocate(topology, spec), domain_type="qemu")
    moved = document_with_exclusive_cpus(xml, frozenset({2, 3}))
    assert moved is not None and parse_placement(moved, "h").exclusive_cpus == {2, 3}
    # libvirt's virDomainGetMetadata hands out the element without its namespace
    bare = ('<placement version="1"><workload_class>unknown</workload_class>'
            '<exclusive_cpus>0-1</exclusive_cpus></placement>')
    assert "<exclusive_cpus>5,7</exclusive_cpus>" in metadata_with_exclusive_cpus(bare, frozenset({5, 7}))
    # a foreign domain (no vmplacer metadata) says nothing of what it owns: left alone
    foreign = "<domain type='qemu'><name>f</name><memory>65536</memory><vcpu>1</vcpu></domain>"
    assert document_with_exclusive_cpus(foreign, frozenset({1})) is None
    with pytest.raises(DomainXmlError, match="root element"):
        metadata_with_exclusive_cpus("<other/>", frozenset({1}))
