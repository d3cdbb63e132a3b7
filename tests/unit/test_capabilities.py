"""The libvirt capabilities reader: example host files, edge cases, errors, a real libvirt driver."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support import require
from vmplacer.adapters.capabilities import (
    CapabilitiesError,
    parse_capabilities,
    read_capabilities_file,
    read_capabilities_live,
)
from vmplacer.core.topology.host import DistanceClass

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "hosts"
SCHEMA = Path("/usr/share/libvirt/schemas/capability.rng")


def _load_script(name: str, path: Path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


gen = _load_script("gen_example_hosts", ROOT / "scripts" / "gen_example_hosts.py")
HOSTS = {host.file: host for host in (make() for make in gen.HOSTS)}


def caps(cells: str, cache: str = "", host_cpu: str = "<cpu><arch>x86_64</arch></cpu>") -> str:
    return (
        f"<capabilities><host>{host_cpu}<topology><cells num='9'>{cells}</cells></topology>"
        f"{cache}</host></capabilities>"
    )


# ----- the example hosts -------------------------------------------------------------------

def test_every_generated_host_is_committed_and_up_to_date():
    committed = {path.name for path in EXAMPLES.glob("*.xml")}
    assert committed == set(HOSTS)
    for file, host in HOSTS.items():
        assert (EXAMPLES / file).read_text() == gen.render(host), f"run scripts/gen_example_hosts.py ({file})"


def test_the_builtin_example_host_is_generated_valid_and_realistic():
    """The host vmplacer plans on without a config: 2 sockets, SMT, tens of GiB per node."""
    from vmplacer.config import EXAMPLE_CAPABILITIES

    host = gen.builtin_example()
    assert EXAMPLE_CAPABILITIES.read_text() == gen.render(host), "run scripts/gen_example_hosts.py"
    topology = read_capabilities_file(EXAMPLE_CAPABILITIES)
    assert len(topology.packages) == 2 and topology.smt == 2 and len(topology.nodes) == 2
    assert all(10 * 1024**2 <= node.memory_kib <= 128 * 1024**2 for node in topology.nodes.values())
    assert all({p.size_kib for p in node.hugepages} == {2048, 1048576} for node in topology.nodes.values())
    require(SCHEMA.exists(), f"{SCHEMA} missing (package libvirt-daemon)")
    from lxml import etree

    assert etree.RelaxNG(etree.parse(str(SCHEMA))).validate(etree.parse(str(EXAMPLE_CAPABILITIES)))


@pytest.mark.parametrize("file", sorted(HOSTS))
def test_example_validates_against_libvirts_schema(file):
    require(SCHEMA.exists(), f"{SCHEMA} missing (package libvirt-daemon)")
    from lxml import etree

    schema = etree.RelaxNG(etree.parse(str(SCHEMA)))
    document = etree.parse(str(EXAMPLES / file))
    assert schema.validate(document), schema.error_log.last_error
    # The check has teeth: a cell without its id is rejected.
    cell = document.find("host/topology/cells/cell")
    del cell.attrib["id"]
    assert not schema.validate(document)


@pytest.mark.parametrize("file", sorted(HOSTS))
def test_example_reads_back_as_generated(file):
    spec = HOSTS[file]
    topology = read_capabilities_file(EXAMPLES / file)
    assert topology.name == Path(file).stem
    assert sorted(topology.nodes) == [cell.id for cell in spec.cells]
    assert len(topology.packages) == spec.sockets
    assert topology.smt == spec.threads
    assert len(topology.cores) == spec.sockets * spec.dies * spec.cores
    for cell in spec.cells:
        node = topology.nodes[cell.id]
        assert node.memory_kib == node.free_kib == cell.memory_kib  # a file is an idle host
        assert node.distances == cell.distances
        assert {p.size_kib: p.total for p in node.hugepages} == {2048: cell.hugepages.get(2048, 0),
                                                                   1048576: cell.hugepages.get(1048576, 0)}
        assert topology.cpus_in_node(cell.id) == {c.id for c in cell.cpus}
        for cpu in cell.cpus:
            assert topology.siblings(cpu.id) == set(cpu.siblings)
            assert topology.cpus[cpu.id].package == cpu.socket
    banks = {level: [frozenset(b.cpus) for b in spec.banks if b.level == level] for level in (2, 3)}
    assert set(topology.llc_groups.values()) == set(banks[3])
    if banks[2]:
        assert set(topology.l2_groups.values()) == set(banks[2])
    else:  # no L2 banks: one L2 per core
        assert set(topology.l2_groups.values()) == {frozenset(core.cpus) for core in topology.cores}


def test_core_ids_repeating_per_die_still_give_distinct_cores():
    topology = read_capabilities_file(EXAMPLES / "opteron6378-4node.xml")
    assert len({cpu.core for cpu in topology.cpus.values()}) == 32
    assert topology.distance_class(0, 1) == DistanceClass.SAME_L2  # one Piledriver module
    assert topology.distance_class(0, 2) == DistanceClass.SAME_LLC
    assert topology.distance_class(0, 8) == DistanceClass.REMOTE_NODE  # other die, same package
    assert {topology.distance(0, other) for other in (1, 2, 3)} == {16}


# ----- edge cases ---------------------------------------------------------------------------

def test_cpu_with_only_an_id_is_offline_and_sparse_ids_are_kept():
    topology = parse_capabilities(caps(
        "<cell id='0'><memory unit='KiB'>1024</memory><cpus num='3'>"
        "<cpu id='0' socket_id='0' die_id='0' core_id='0' siblings='0,64'/>"
        "<cpu id='64' socket_id='0' die_id='0' core_id='0' siblings='0,64'/>"
        "<cpu id='100'/></cpus></cell>"
    ))
    assert sorted(topology.cpus) == [0, 64, 100]
    assert topology.online_cpus == {0, 64}
    assert topology.siblings(64) == {0, 64}
    assert topology.core_of(100).cpus == (100,)


def test_cell_without_cpus_and_memory_units():
    topology = parse_capabilities(caps(
        "<cell id='0'><memory unit='GiB'>2</memory><cpus num='1'>"
        "<cpu id='0' socket_id='0' die_id='0' core_id='0' siblings='0'/></cpus></cell>"
        "<cell id='3'><memory unit='MiB'>512</memory>"
        "<pages unit='KiB' size='4'>131072</pages><pages unit='MiB' size='2'>16</pages></cell>"
    ))
    assert topology.nodes[0].memory_kib == 2 * 1024 * 1024
    assert topology.nodes[3].memory_kib == 512 * 1024
    assert topology.cpus_in_node(3) == frozenset()
    assert [(p.size_kib, p.total) for p in topology.nodes[3].hugepages] == [(2048, 16)]
    assert topology.nodes_with_cpus() == (0,)


def test_without_cache_banks_l2_is_per_core_and_llc_per_package():
    cpus = "".join(
        f"<cpu id='{i}' socket_id='{i // 4}' die_id='0' core_id='{(i % 4) // 2}' "
        f"siblings='{i - i % 2}-{i - i % 2 + 1}'/>"
        for i in range(8)
    )
    topology = parse_capabilities(caps(f"<cell id='0'><cpus num='8'>{cpus}</cpus></cell>"))
    assert set(topology.l2_groups.values()) == {frozenset(c.cpus) for c in topology.cores}
    assert set(topology.llc_groups.values()) == {frozenset(range(4)), frozenset(range(4, 8))}
    assert topology.distance_class(0, 2) == DistanceClass.SAME_LLC
    assert topology.distance_class(0, 4) == DistanceClass.SAME_NODE


def test_single_hugepage_size_in_a_cell_is_compared_with_the_host_page_size():
    topology = parse_capabilities(caps(
        "<cell id='0'><pages unit='KiB' size='2048'>8</pages></cell>",
        host_cpu="<cpu><arch>x86_64</arch><pages unit='KiB' size='4'/></cpu>",
    ))
    assert [(p.size_kib, p.total) for p in topology.nodes[0].hugepages] == [(2048, 8)]


# ----- errors name the file, the line and the element ---------------------------------------

def test_malformed_file_names_the_file(tmp_path):
    bad = tmp_path / "broken.xml"
    bad.write_text("<capabilities><host>\n<topology>\n")
    with pytest.raises(CapabilitiesError, match=rf"{bad}: not well-formed XML at line 3, column 1: ") as caught:
        read_capabilities_file(bad)
    assert "(<string>" not in str(caught.value)


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ("<cell id='x'/>", r"line 1: /capabilities/host/topology/cells/cell: attribute id='x' is not an integer"),
        ("<cell id='0'/><cell id='0'/>", r"cell\[2\]: cell id 0 appears twice"),
        ("<cell id='0'><memory unit='parsec'>3</memory></cell>", r"cell/memory: unknown unit 'parsec'"),
        ("<cell id='0'><cpus num='1'><cpu id='0' socket_id='0' die_id='0' core_id='0' siblings='0-'/>"
         "</cpus></cell>", r"cpus/cpu: attribute siblings: bad CPU list element"),
        ("<cell id='0'><cpus num='1'><cpu id='1' socket_id='0' die_id='0' core_id='0'/></cpus></cell>"
         "<cell id='1'><cpus num='1'><cpu id='1' socket_id='0' die_id='0' core_id='1'/></cpus></cell>",
         r"CPU 1 is listed twice"),
        ("<cell id='0'><distances><sibling id='1'/></distances></cell>", r"missing attribute 'value'"),
    ],
)
def test_bad_elements_are_named(tmp_path, cells, message):
    path = tmp_path / "host.xml"
    path.write_text(caps(cells))
    with pytest.raises(CapabilitiesError, match=message) as info:
        read_capabilities_file(path)
    assert str(path) in str(info.value)


def test_capabilities_without_cells_are_refused():
    with pytest.raises(CapabilitiesError, match=r"no NUMA cells"):
        parse_capabilities("<capabilities><host><cpu><arch>x86_64</arch></cpu></host></capabilities>")
    with pytest.raises(CapabilitiesError, match=r"root element must be <capabilities>"):
        parse_capabilities("<domain/>")


def test_capabilities_error_is_a_value_error():
    assert issubclass(CapabilitiesError, ValueError)


# ----- a live connection -------------------------------------------------------------------

def test_live_reader_on_libvirts_test_driver():
    """A real libvirt driver in-process (no daemon): the live reader and the XML agree."""
    import libvirt

    conn = libvirt.open("test:///default")
    try:
        live = read_capabilities_live(conn, "test")
        from_xml = parse_capabilities(conn.getCapabilities(), "test")
        info = conn.getInfo()  # [model, memory MiB, cpus, MHz, nodes, sockets, cores, threads]
    finally:
        conn.close()
    assert live.cores == from_xml.cores
    assert len(live.cpus) == info[2]
    assert len(live.nodes) == info[4]
    # The test driver keeps no memory accounting: free = total.
    assert all(node.free_kib == node.memory_kib for node in live.nodes.values())


class _FakeConn:
    """Answers like qemu:///system on a host with sparse NUMA node ids (0 and 8)."""

    def __init__(self, xml: str, free_bytes: list[int], free_pages: dict[int, dict[int, int]],
                 unsupported: bool = False):
        self.xml, self.free_bytes, self.free_pages, self.unsupported = xml, free_bytes, free_pages, unsupported
        self.page_calls: list[tuple[list[int], int, int]] = []

    def getType(self) -> str:
        return "QEMU"

    def getCapabilities(self) -> str:
        return self.xml

    def getCellsFreeMemory(self, start: int, count: int) -> list[int]:
        if self.unsupported:
            raise _unsupported_error()
        return self.free_bytes[start:start + count]

    def getFreePages(self, sizes: list[int], start: int, count: int) -> dict[int, dict[int, int]]:
        self.page_calls.append((sizes, start, count))
        return {start: self.free_pages[start]}


def _unsupported_error():
    import libvirt

    class Unsupported(libvirt.libvirtError):
        def get_error_code(self) -> int:
            return libvirt.VIR_ERR_NO_SUPPORT

    return Unsupported("this driver does not report free memory")


def _sparse_caps() -> str:
    cells = "".join(
        f"<cell id='{n}'><memory unit='KiB'>{1048576 * (n + 1)}</memory>"
        f"<pages unit='KiB' size='4'>1</pages><pages unit='KiB' size='2048'>100</pages>"
        f"<cpus num='1'><cpu id='{n}' socket_id='{n}' die_id='0' core_id='0' siblings='{n}'/></cpus></cell>"
        for n in (0, 8)
    )
    return caps(cells)


def test_live_free_memory_and_hugepages_map_to_sparse_node_ids():
    free_bytes = [512 * 1024 * 1024] + [0] * 7 + [2 * 1024**3]
    conn = _FakeConn(_sparse_caps(), free_bytes, {0: {2048: 40}, 8: {2048: 99}})
    topology = read_capabilities_live(conn, "sparse")
    assert topology.nodes[0].free_kib == 512 * 1024
    assert topology.nodes[8].free_kib == 2 * 1024 * 1024
    assert topology.nodes[0].hugepage_pool(2048).free == 40
    assert topology.nodes[8].hugepage_pool(2048).free == 99
    assert sorted(call[1] for call in conn.page_calls) == [0, 8]


def test_live_driver_without_free_memory_leaves_free_equal_total():
    conn = _FakeConn(_sparse_caps(), [], {0: {2048: 1}, 8: {2048: 2}}, unsupported=True)
    topology = read_capabilities_live(conn, "old")
    assert all(node.free_kib == node.memory_kib for node in topology.nodes.values())


def test_a_document_is_parsed_once_for_every_host_that_has_it(monkeypatch):
    import vmplacer.adapters.capabilities as capabilities

    text = (EXAMPLES / "xeon-e3-4c8t.xml").read_text()
    parses = []
    real = capabilities.parse_capabilities
    monkeypatch.setattr(capabilities, "parse_capabilities", lambda *a, **k: parses.append(1) or real(*a, **k))
    capabilities._shapes.clear()
    one = capabilities.parsed_once(text, "one", "a")
    two = capabilities.parsed_once(text, "two", "b")
    assert (one.name, two.name) == ("one", "two") and replace(one, name="x") == replace(two, name="x")
    assert capabilities.parsed_once(text, "one", "a").nodes is one.nodes
    assert len(parses) == 1
