"""`vmplacer topology` through the real console script."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import clean_env, run_vmplacer
from vmplacer.adapters.capabilities import read_capabilities_file
from vmplacer.adapters.sysfs import read_sysfs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "hosts").glob("*.xml"))


def vmplacer(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_vmplacer(*args, env=clean_env(env), cwd=ROOT)


def _fixture_builder():
    name = "make_sysfs_fixtures"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "data" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def check_contract(data: dict) -> None:
    """The stable JSON shape other tools rely on."""
    assert {"nodes", "cores", "llc", "smt"} <= set(data)
    for node in data["nodes"]:
        assert {"id", "cpus", "memory_kib", "free_kib", "distances"} <= set(node)
        assert all(isinstance(k, str) and isinstance(v, int) for k, v in node["distances"].items())
    for core in data["cores"]:
        assert {"id", "node", "package", "cpus"} <= set(core)
    for group in data["llc"]:
        assert {"id", "cpus"} <= set(group)
    assert isinstance(data["smt"], int)
    for core in data["cores"]:
        assert {"die", "cluster", "kind"} <= set(core)
    for die in data["dies"]:
        assert {"id", "package", "cpus"} <= set(die)
    for cluster in data["clusters"]:
        assert {"id", "die", "cpus"} <= set(cluster)
    assert all(isinstance(node["memory_only"], bool) for node in data["nodes"])
    assert isinstance(data["memory_only_nodes"], list) and isinstance(data["warnings"], list)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_caps_json_for_each_example(path):
    result = vmplacer("topology", "--caps", str(path.relative_to(ROOT)), "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    check_contract(data)
    assert data == json.loads(json.dumps(read_capabilities_file(path).to_dict()))


@pytest.mark.parametrize("name", ["xeon-2s-sparse", "hybrid-adl", "memory-only-node"])
def test_sysfs_json(tmp_path, name):
    fixtures = _fixture_builder()
    root = fixtures.write_machine(fixtures.machines()[name], tmp_path)
    result = vmplacer("topology", "--sysfs", str(root), "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    check_contract(data)
    assert data == json.loads(json.dumps(read_sysfs(root, name=name).to_dict()))


def test_table_is_a_tree_per_node():
    path = ROOT / "examples" / "hosts" / "opteron6378-4node.xml"
    result = vmplacer("topology", "--caps", str(path), "--cores")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("host opteron6378-4node: 2 packages, 4 dies, 4 NUMA nodes, 32 cores")
    assert any(line.endswith("core 9 (package 0, die 1, L2 4 shared with core 8): 9") for line in lines)
    assert sum("node " in line and "memory 64 GiB" in line for line in lines) == 4
    assert sum("core " in line for line in lines) == 32
    assert any("L2 0 shared with core 1" in line for line in lines)
    assert any("hugepages: 2 MiB x 2048" in line for line in lines)


def test_table_marks_offline_isolated_and_memory_only(tmp_path):
    fixtures = _fixture_builder()
    xeon = fixtures.write_machine(fixtures.machines()["xeon-2s-sparse"], tmp_path)
    result = vmplacer("topology", "--sysfs", str(xeon), "--cores")
    assert result.returncode == 0, result.stderr
    assert "43 (offline)" in result.stdout and "4 (isolated)" in result.stdout, result.stdout
    memory_only = fixtures.write_machine(fixtures.machines()["memory-only-node"], tmp_path)
    result = vmplacer("topology", "--sysfs", str(memory_only), "--cores")
    assert result.returncode == 0, result.stderr
    assert "no CPUs (memory only)" in result.stdout


def test_missing_caps_file_exits_2_naming_the_file(tmp_path):
    missing = tmp_path / "nowhere.xml"
    result = vmplacer("topology", "--caps", str(missing))
    assert result.returncode == 2
    assert str(missing) in result.stderr


def test_malformed_caps_file_exits_2_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text("<capabilities><host><topology><cells num='1'>\n<cell id='one'/></cells>"
                   "</topology></host></capabilities>")
    result = vmplacer("topology", "--caps", str(bad), "--format", "json")
    assert result.returncode == 2
    assert f"{bad}: line 2:" in result.stderr and "cell" in result.stderr
    assert result.stdout == ""


def test_missing_sysfs_root_exits_2(tmp_path):
    result = vmplacer("topology", "--sysfs", str(tmp_path / "absent"))
    assert result.returncode == 2
    assert "absent" in result.stderr
    result = vmplacer("topology", "--sysfs", str(tmp_path))  # exists, but holds no sysfs
    assert result.returncode == 2
    assert "sys/devices/system/cpu" in result.stderr


def test_sources_are_mutually_exclusive():
    result = vmplacer("topology", "--caps", "a.xml", "--sysfs", "/")
    assert result.returncode == 2
    assert "not allowed with" in result.stderr


def test_this_machines_sysfs():
    result = vmplacer("topology", "--sysfs", "/", "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    check_contract(data)
    assert len({cpu for node in data["nodes"] for cpu in node["cpus"]}) >= os.cpu_count()


def test_default_host_and_unknown_host(tmp_path):
    """No option: the first configured host (built-in default: the example host, its domains on
    libvirt's test driver, no daemon)."""
    env = {"VMPLACER_DATA_DIR": str(tmp_path)}
    result = vmplacer("topology", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    check_contract(data)
    assert data["name"] == "example"
    assert len(data["nodes"]) == 2 and len(data["cores"]) == 32  # the example host, not the test driver's
    result = vmplacer("topology", "--host", "nosuch", env=env)
    assert result.returncode == 2
    assert "nosuch" in result.stderr and "example" in result.stderr


def test_unreachable_host_exits_1(tmp_path):
    config = tmp_path / "vmplacer.yaml"
    config.write_text(
        f"data_dir: {tmp_path}\nhosts:\n  - {{name: gone, uri: 'qemu+tcp://127.0.0.1:1/system'}}\n"
    )
    result = vmplacer("--config", str(config), "topology", "--host", "gone")
    assert result.returncode == 1, result.stderr
    assert "gone" in result.stderr


# ----- dies, clusters, memory-only nodes, warnings and broken trees -------------------------

@pytest.mark.parametrize(
    ("name", "summary"),
    [
        ("epyc-4die-llc", "host epyc-4die-llc: 1 package, 4 dies, 1 NUMA node, 16 cores, 32 pCPUs"),
        ("arm-clusters", "host arm-clusters: 1 package, 8 clusters, 2 NUMA nodes, 32 cores, 32 pCPUs"),
        ("arm-gpu-memory", "host arm-gpu-memory: 1 package, 3 NUMA nodes (2 memory only), 16 cores"),
        ("s390x-books", "host s390x-books: 8 packages, 1 NUMA node, 16 cores, 32 pCPUs"),
    ],
)
def test_table_shows_dies_clusters_and_memory_only_nodes(tmp_path, name, summary):
    fixtures = _fixture_builder()
    root = fixtures.write_machine(fixtures.machines()[name], tmp_path)
    result = vmplacer("topology", "--sysfs", str(root), "--cores")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(summary), result.stdout


def test_warnings_go_to_stderr_and_into_the_json(tmp_path):
    fixtures = _fixture_builder()
    root = fixtures.write_machine(fixtures.machines()["kvm-no-ids"], tmp_path)
    result = vmplacer("topology", "--sysfs", str(root), "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    check_contract(data)
    assert len(data["warnings"]) == 2
    for warning in data["warnings"]:
        assert f"vmplacer: warning: {warning}" in result.stderr
    assert "topology/core_id (and 7 more like it): missing" in result.stderr


def test_a_malformed_file_exits_2_naming_file_and_content_without_a_traceback(tmp_path):
    fixtures = _fixture_builder()
    root = fixtures.write_machine(fixtures.machines()["epyc-4die-llc"], tmp_path)
    bad = root / "sys" / "devices" / "system" / "cpu" / "cpu5" / "cache" / "index3" / "level"
    bad.write_text("L3\n\x00")
    result = vmplacer("topology", "--sysfs", str(root), "--format", "json")
    assert result.returncode == 2
    assert result.stderr == f"vmplacer: error: --sysfs: {bad}: expected an integer, found 'L3'\n"
    assert result.stdout == ""
