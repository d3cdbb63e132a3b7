"""The CLI skeleton through the real console script: exit codes 0/1/2, --format json."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support import clean_env, run_vmplacer

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # Never the machine's default data directory: what an earlier run left there is not this test's.
    full_env = clean_env({"VMPLACER_DATA_DIR": tempfile.mkdtemp(prefix="vmplacer-cli-"), **(env or {})})
    return run_vmplacer(*args, env=full_env)


def test_help_lists_commands():
    result = run("--help")
    assert result.returncode == 0
    for command in ("version", "db", "hosts"):
        assert command in result.stdout


def test_version_json():
    result = run("version", "--format", "json")
    assert result.returncode == 0
    from vmplacer import __version__

    assert json.loads(result.stdout) == {"version": __version__}


def test_unknown_command_is_usage_error():
    assert run("frobnicate").returncode == 2


@pytest.mark.parametrize(
    ("content", "key"),
    [
        ("hosts:\n  - {name: a, uri: 'qemu:///system'}\nbogus: 1\n", "bogus"),
        ("hosts:\n  - {name: a, uri: 'ftp://x'}\n", "hosts[0].uri"),
    ],
)
def test_config_errors_exit_2_naming_the_key(tmp_path, content, key):
    config = tmp_path / "vmplacer.yaml"
    config.write_text(content)
    result = run("--config", str(config), "hosts")
    assert result.returncode == 2
    assert key in result.stderr
    result = run("hosts", "--config", str(config))  # a global option after the command reads alike
    assert result.returncode == 2
    assert key in result.stderr
    result = run("hosts", env={"VMPLACER_CONFIG": str(config)})
    assert result.returncode == 2
    assert key in result.stderr


def test_unreadable_config_exits_2(tmp_path):
    config = tmp_path / "secret.yaml"
    config.write_text("hosts: []\n")
    result = run("--config", str(tmp_path / "missing.yaml"), "hosts")
    assert result.returncode == 2 and "missing.yaml" in result.stderr
    config.chmod(0)
    result = run("--config", str(config), "hosts")
    # root reads mode-0 files; then the empty host list is what is refused, by key
    assert result.returncode == 2
    assert "secret.yaml" in result.stderr


def test_hosts_with_builtin_defaults_answers(tmp_path):
    result = run("hosts", "--format", "json", env={"VMPLACER_DATA_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    hosts = json.loads(result.stdout)
    assert hosts[0]["name"] == "example" and hosts[0]["reachable"] is True
    assert hosts[0]["driver"] == "TEST" and hosts[0]["builtin_example"] is True


def test_hosts_reports_unreachable_host_and_exits_1(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"data_dir: {tmp_path}\nhosts:\n  - {{name: gone, uri: 'qemu+tcp://127.0.0.1:1/system'}}\n")
    result = run("--config", str(config), "hosts", "--format", "json")
    assert result.returncode == 1
    entry = json.loads(result.stdout)[0]
    assert entry["reachable"] is False and "gone" in entry["error"]


def test_db_upgrade_and_current(tmp_path):
    env = {"VMPLACER_DATA_DIR": str(tmp_path)}
    result = run("db", "upgrade", env=env)
    assert result.returncode == 0, result.stderr
    current = json.loads(run("db", "current", "--format", "json", env=env).stdout)
    assert current["current"] == current["head"] is not None
    assert (tmp_path / "vmplacer.db").exists()


def test_hosts_format_before_the_action_is_kept(tmp_path):
    """`hosts --format json disable HOST` answers in JSON, as `hosts disable HOST --format json` does."""
    env = {"VMPLACER_DATA_DIR": str(tmp_path)}
    done = run("hosts", "--format", "json", "disable", "example", "--reason", "kernel update", env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["host"] == "example" and data["changed"] is True
    assert data["maintenance"]["reason"] == "kernel update"
    done = run("hosts", "--format", "json", "enable", "example", env=env)
    assert done.returncode == 0 and json.loads(done.stdout)["was"]["reason"] == "kernel update", done.stderr
    done = run("hosts", "enable", "example", "--format", "json", env=env)  # after the action, as before
    assert json.loads(done.stdout)["changed"] is False
    done = run("hosts", "--format", "json", "enable", "example", "--format", "table", env=env)
    assert done.stdout.startswith("host example is in service"), done.stdout
