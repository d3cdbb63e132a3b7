"""`vmplacer topology`'s compact default: one line per NUMA node, in 80 columns, plain text in a
pipe; `--cores` for the per-core tree; cache sizes read from capabilities and sysfs."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
from pathlib import Path

import pytest

from tests.support import VMPLACER, clean_env, run_vmplacer
from tests.unit.test_topology_cli import _fixture_builder
from vmplacer.adapters.capabilities import read_capabilities_file
from vmplacer.adapters.sysfs import read_sysfs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "hosts").glob("*.xml"))
XEON = ROOT / "examples" / "hosts" / "xeon-2s-56c-smt2.xml"
BOX_DRAWING = re.compile("[\u2500-\u257f]")


def vmplacer(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_vmplacer(*args, env=clean_env(env), cwd=ROOT)


def on_a_terminal(*args: str, columns: int = 80) -> str:
    """What `vmplacer ARGS` prints on a terminal `columns` wide (a pseudo-terminal)."""
    leader, follower = pty.openpty()
    env = clean_env({"COLUMNS": str(columns), "LINES": "50", "TERM": "xterm"})
    process = subprocess.Popen([VMPLACER, *args], stdout=follower, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            process.kill()
            raise AssertionError("vmplacer printed nothing for 60 s")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=60) == 0, process.stderr.read()
    text = b"".join(chunks).decode()
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r\n", "\n")


def test_the_two_socket_host_is_one_line_per_node():
    result = vmplacer("topology", "--caps", str(XEON))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "host xeon-2s-56c-smt2: 2 packages, 2 nodes, 56 cores, 112 pCPUs, SMT-2"
    assert lines[1].split() == ["node", "pCPUs", "cores", "LLC", "memory", "free", "hugepages"]
    rows = [line.split() for line in lines[2:4]]
    assert rows[0] == ["0", "0-27,56-83", "28x2", "L3", "38.5", "MiB", "192", "GiB", "192", "GiB",
                       "8192x2M,", "32x1G"]
    assert rows[1] == ["1", "28-55,84-111", "28x2", "L3", "38.5", "MiB", "192", "GiB", "192", "GiB",
                       "8192x2M,", "16x1G"]
    assert lines[4] == "caches: L3 38.5 MiB per 28 cores; L2 per core (size not reported)"
    assert lines[5:] == ["node distances:", "node   0   1", "  0:  10  21", "  1:  21  10"]


def test_piped_output_is_plain_text_in_80_columns_for_every_example_host():
    for path in EXAMPLES:
        result = vmplacer("topology", "--caps", str(path))
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert max(map(len, lines)) <= 80, (path.name, result.stdout)
        assert not BOX_DRAWING.search(result.stdout) and "|" not in result.stdout and "+-" not in result.stdout
        assert all(line == line.rstrip() for line in lines)
        nodes = len(read_capabilities_file(path).nodes)
        table = lines[2:2 + nodes]
        assert [int(line.split()[0]) for line in table] == list(range(nodes)), path.name


@pytest.mark.parametrize("name", ["xeon-2s-sparse", "memory-only-node", "hybrid-adl", "epyc-4die-llc",
                                  "arm-clusters", "s390x-books", "kvm-no-ids"])
def test_recorded_machines_fit_80_columns_and_say_what_is_special(tmp_path, name):
    fixtures = _fixture_builder()
    root = fixtures.write_machine(fixtures.machines()[name], tmp_path)
    result = vmplacer("topology", "--sysfs", str(root))
    assert result.returncode == 0, result.stderr
    assert max(map(len, result.stdout.splitlines())) <= 80, result.stdout
    topology = read_sysfs(root, name=name)
    if name == "xeon-2s-sparse":
        assert "(1 offline)" in result.stdout.splitlines()[0]
        assert "offline pCPUs: 43" in result.stdout and "isolated pCPUs: 4-5,36-37" in result.stdout
        assert "1024x2M (1000 free), 4x1G" in result.stdout
    if name == "memory-only-node":
        row = next(line.split() for line in result.stdout.splitlines() if line.split()[:1] == ["1"])
        assert row == ["1", "-", "-", "-", "256", "GiB", "256", "GiB", "-"]
    if name == "hybrid-adl":
        assert "8x2+4x1" in result.stdout
    if name == "epyc-4die-llc":
        assert "4x L3 32 MiB" in result.stdout and "L3 32 MiB per 4 cores" in result.stdout
    assert str(len(topology.nodes)) + (" node" if len(topology.nodes) == 1 else " nodes") in result.stdout


def test_on_an_80_column_terminal_every_line_fits():
    for path in (XEON, ROOT / "examples" / "hosts" / "numa16-256c.xml"):
        text = on_a_terminal("topology", "--caps", str(path))
        lines = text.splitlines()
        assert max(map(len, lines)) <= 80, text
        assert any("0-27,56-83" in line or "0-15,256-271" in line for line in lines), text
        assert "L3" in text


def test_cores_keeps_the_per_core_tree():
    result = vmplacer("topology", "--caps", str(XEON), "--cores")
    assert result.returncode == 0, result.stderr
    cores = [line for line in result.stdout.splitlines() if "core " in line and "(package" in line]
    assert len(cores) == 56
    assert any(line.endswith("core 0 (package 0): 0, 56") for line in cores)


def test_cores_with_json_is_refused_naming_the_flag():
    result = vmplacer("topology", "--caps", str(XEON), "--cores", "--format", "json")
    assert result.returncode == 2
    assert "--cores" in result.stderr and result.stdout == ""


def test_json_carries_cache_sizes_from_capabilities_and_sysfs(tmp_path):
    data = json.loads(vmplacer("topology", "--caps", str(XEON), "--format", "json").stdout)
    assert [(g["level"], g["size_kib"], len(g["cpus"])) for g in data["llc"]] == [(3, 39424, 56), (3, 39424, 56)]
    assert {g["size_kib"] for g in data["l2"]} == {None}  # the file has no level-2 banks
    opteron = read_capabilities_file(ROOT / "examples" / "hosts" / "opteron6378-4node.xml")
    assert set(opteron.l2_kib.values()) == {2048} and len(opteron.l2_kib) == 16
    fixtures = _fixture_builder()
    root = fixtures.write_machine(fixtures.machines()["xeon-2s-sparse"], tmp_path)
    topology = read_sysfs(root, name="sparse")
    assert topology.llc_level == 3 and set(topology.llc_kib.values()) == {32768}
    assert set(topology.l2_kib.values()) == {1280} and len(topology.l2_kib) == len(topology.l2_groups)
