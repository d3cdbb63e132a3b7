"""`vmplacer plan` with a request naming memory-only nodes, through the real console script.

The host is the capabilities fixture of an ARM machine with GPU memory (node 1)
and a CXL tier (node 2) beside its CPU node 0.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from lxml import etree

from tests.support import run_vmplacer
from tests.unit import sysfs_fixtures

ROOT = Path(__file__).resolve().parents[2]
CAPS = ROOT / "tests" / "data" / "capabilities" / "arm-gpu-memory.xml"


def plan(request: Path, *extra: str, caps: Path = CAPS) -> subprocess.CompletedProcess[str]:
    return run_vmplacer("plan", "--caps", str(caps), "--request", str(request), *extra)


def numatune(xml: str) -> tuple[tuple[str, str], list[tuple[str, str, str]]]:
    root = etree.fromstring(xml.encode())
    memory = root.find("numatune/memory")
    cells = [(m.get("cellid"), m.get("mode"), m.get("nodeset")) for m in root.findall("numatune/memnode")]
    return (memory.get("mode"), memory.get("nodeset")), cells


def two_sockets_with_cxl(directory: Path) -> Path:
    """Capabilities of 2 sockets x 8 cores (nodes 0, 1) with a CXL node attached to each (2 on socket 0,
    3 on socket 1), written by the fixture generator's model of libvirt."""
    fixtures = sysfs_fixtures.load()
    cpus = [fixtures.CpuSpec(id=i, node=i // 8, package=i // 8, core_id=i % 8, siblings=(i,), l2=(i,),
                             l3=tuple(range(i // 8 * 8, i // 8 * 8 + 8)), l2_id=i, l3_id=i // 8) for i in range(16)]
    rows = ((10, 21, 14, 24), (21, 10, 24, 14), (14, 24, 10, 26), (24, 14, 26, 10))
    nodes = [fixtures.NodeSpec(n, (32 if n < 2 else 64) * fixtures.GIB, (32 if n < 2 else 64) * fixtures.GIB, row)
             for n, row in enumerate(rows)]
    path = directory / "cxl-2s.xml"
    path.write_text(fixtures.libvirt_capabilities(fixtures.Machine("cxl-2s", cpus, nodes)))
    return path


def test_named_memory_nodes_are_bound_per_cell_in_the_rendered_xml(tmp_path):
    request = tmp_path / "tiered.yaml"
    request.write_text("""
guests:
  - {name: cxl-all, vcpus: 4, memory_mib: 204800, cpu_policy: dedicated, memory_node: 2}
  - {name: gpu, vcpus: 2, memory_mib: 8192, memory_node: 1, mem_mode: preferred}
  - {name: plain, vcpus: 2, memory_mib: 4096}
""")
    result = plan(request, "--format", "json")
    assert result.returncode == 0, result.stderr
    placements = {p["guest"]: p for p in json.loads(result.stdout)["placements"]}
    assert placements["cxl-all"]["memory_nodes"] == [2] and placements["cxl-all"]["nodes"] == [0]
    assert numatune(placements["cxl-all"]["xml"]) == (("strict", "2"), [("0", "strict", "2")])
    assert numatune(placements["gpu"]["xml"]) == (("preferred", "1"), [("0", "preferred", "1")])
    assert placements["plain"]["memory_nodes"] == [0]
    assert numatune(placements["plain"]["xml"]) == (("strict", "0"), [("0", "strict", "0")])
    # The table shows the vCPUs' node and the memory node apart.
    table = plan(request)
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("cxl-all "))
    cells = re.split(r"\s{2,}", row)  # a piped table: plain text, columns two spaces apart
    assert (cells[2], cells[5]) == ("0", "2")


def test_each_cell_is_bound_to_its_own_memory_node_near_its_vcpus(tmp_path):
    request = tmp_path / "cells.yaml"
    request.write_text("""
guests:
  - name: two-cells
    vcpus: 4
    memory_mib: 8192
    cpu_policy: dedicated
    numa_cpus: {0: "0-1", 1: "2-3"}
    numa_mem: {0: 4096, 1: 4096}
    memory_node: {0: 3, 1: 2}
""")
    result = plan(request, "--format", "json", caps=two_sockets_with_cxl(tmp_path))
    assert result.returncode == 0, result.stderr
    (placement,) = json.loads(result.stdout)["placements"]
    assert numatune(placement["xml"]) == (("strict", "2-3"), [("0", "strict", "3"), ("1", "strict", "2")])
    # vCPUs of cell 0 on socket 1 (where node 3 is attached), of cell 1 on socket 0.
    assert placement["nodes"] == [0, 1]
    assert all(len(pins) == 1 and (int(v) < 2) == (pins[0] >= 8) for v, pins in placement["vcpupin"].items())


def test_a_node_this_host_cannot_give_is_a_no_fit_naming_guest_field_and_rule(tmp_path):
    request = tmp_path / "bad-node.yaml"
    request.write_text("""
guests:
  - {name: on-cpu-node, vcpus: 2, memory_mib: 1024, memory_node: 0}
  - {name: missing, vcpus: 2, memory_mib: 1024, memory_node: 5}
  - {name: too-big, vcpus: 2, memory_mib: 102400, memory_node: 1}
  - {name: fits, vcpus: 2, memory_mib: 1024, memory_node: 1}
""")
    result = plan(request, "--format", "json")
    assert result.returncode == 3, result.stderr  # EXIT_NO_FIT
    data = json.loads(result.stdout)
    assert [p["guest"] for p in data["placements"]] == ["fits"]
    reasons = {e["guest"]: [(r["constraint"], r["where"], r["have"]) for r in e["reasons"]] for e in data["errors"]}
    assert reasons == {
        "on-cpu-node": [("memory-node", "memory_node 0 (cell 0)", "node 0 with CPUs 0-15 (memory-only here: 1-2)")],
        "missing": [("memory-node", "memory_node 5 (cell 0)", "nodes 0-2 (memory-only: 1-2)")],
        "too-big": [("memory", "memory_node 1 (cell 0)", "98304 MiB free")],
    }
    assert all(e["kind"] == "no-fit" for e in data["errors"])


def test_a_malformed_memory_node_exits_2_naming_file_guest_and_field(tmp_path):
    request = tmp_path / "malformed.yaml"
    request.write_text("""
guests:
  - {name: g1, vcpus: 2, memory_mib: 1024, memory_node: {0: 1}}
  - {name: g2, vcpus: 2, memory_mib: 1024, numa_nodes: 1, memory_node: {0: -3}}
""")
    result = plan(request)
    assert result.returncode == 2
    assert "guest #0 (g1): field memory_node: per-cell nodes need the guest's cells fixed" in result.stderr
    assert "guest #1 (g2): field memory_node.0: must be a host NUMA node id 0..1023" in result.stderr
    assert result.stderr.count("malformed.yaml") == 2
