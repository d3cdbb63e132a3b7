"""`vmplacer config check` and `vmplacer config show` through the real console script."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.support import clean_env, run_vmplacer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vmplacer.yaml"


def run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_vmplacer(*args, env=clean_env({"VMPLACER_DATA_DIR": str(tmp_path), **(env or {})}))


def test_check_says_ok_for_the_example_file(tmp_path):
    result = run(tmp_path, "config", "check", "--config", str(EXAMPLE))
    assert (result.returncode, result.stdout) == (0, "ok\n"), result.stderr
    assert run(tmp_path, "--config", str(EXAMPLE), "config", "check").stdout == "ok\n"  # the global option too
    assert run(tmp_path, "config", "check", env={"VMPLACER_CONFIG": str(EXAMPLE)}).stdout == "ok\n"


def test_check_without_a_file_checks_the_built_in_defaults(tmp_path):
    result = run(tmp_path, "config", "check")
    assert result.returncode == 0 and result.stdout == "ok\n" and "built-in defaults" in result.stderr


def test_check_reports_every_problem_and_exits_2(tmp_path):
    config = tmp_path / "vmplacer.yaml"
    config.write_text("hosts:\n  - {name: 'bad name', uri: 'ftp://x'}\nprofiler: {t_m_ms: -1}\n"
                      "api: {listen: 'a:1'}\napi: {listen: nowhere}\nbogus: 1\n")
    result = run(tmp_path, "config", "check", "--config", str(config))
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[-1] == "vmplacer: 6 problems in the config"
    for fragment in ("line 5, column 1: duplicate key 'api' (first at line 4)", "key 'hosts[0].name'",
                     "key 'hosts[0].uri'", "key 'profiler.t_m_ms'", "key 'api.listen'", "key 'bogus'"):
        assert sum(fragment in line and str(config) in line for line in lines) == 1, (fragment, lines)


def test_other_commands_report_every_config_problem_one_per_line(tmp_path):
    config = tmp_path / "vmplacer.yaml"
    config.write_text("profiler: {t_m_ms: -1}\napi: {listen: nowhere}\n")
    result = run(tmp_path, "--config", str(config), "hosts")
    assert result.returncode == 2
    assert [line.split(": key ")[1].split(":")[0] for line in result.stderr.splitlines()] == [
        "'profiler.t_m_ms'", "'api.listen'"]
    assert all(line.startswith("vmplacer: error: ") for line in result.stderr.splitlines())


def test_show_prints_the_effective_config_with_defaults_and_it_reads_back(tmp_path):
    config = tmp_path / "vmplacer.yaml"
    config.write_text("hosts:\n  - {name: h1, uri: 'qemu:///system'}\nretention: {plans: 12h}\n")
    result = run(tmp_path, "--config", str(config), "config", "show",
                 env={"VMPLACER_DATABASE_URL": "postgresql://vm:s3cret@db:5432/vmplacer"})
    assert result.returncode == 0, result.stderr
    document = yaml.safe_load(result.stdout)
    assert document["data_dir"] == str(tmp_path)
    assert document["database_url"] == "postgresql+psycopg://vm:***@db:5432/vmplacer"
    assert "s3cret" not in result.stdout
    (host,) = document["hosts"]
    assert (host["name"], host["cpu_allocation_ratio"], host["connect_timeout_s"]) == ("h1", 4.0, 30.0)
    assert document["retention"] == {"plans": "12h", "profiles": "90d", "audit": "180d", "jobs": "7d"}
    assert document["protect"]["budget_window_s"] == 300.0
    again = tmp_path / "shown.yaml"
    again.write_text(result.stdout)
    assert run(tmp_path, "config", "check", "--config", str(again)).stdout == "ok\n"
    as_json = run(tmp_path, "--config", str(config), "config", "show", "--format", "json")
    assert json.loads(as_json.stdout)["hosts"][0]["name"] == "h1"


def test_show_of_a_bad_file_exits_2_with_its_problems(tmp_path):
    config = tmp_path / "vmplacer.yaml"
    config.write_text("api: {listen: nowhere}\n")
    result = run(tmp_path, "--config", str(config), "config", "show")
    assert result.returncode == 2 and "key 'api.listen'" in result.stderr and result.stdout == ""


def test_check_holds_every_duration_to_one_convention(tmp_path):
    """A bare number is seconds only on a key named `..._s`; every duration key takes s, m, h, d."""
    config = tmp_path / "vmplacer.yaml"
    config.write_text("retention: {plans: 30, jobs: 7d}\nplacement: {model_refresh: '60'}\n"
                      "protect: {interval_s: 2, budget_window_s: 1d}\n")
    result = run(tmp_path, "config", "check", "--config", str(config))
    assert result.returncode == 2 and result.stdout == ""
    problems = [line for line in result.stderr.splitlines() if ": key '" in line]
    assert problems == [
        f"vmplacer: error: {config}: key 'retention.plans': a duration needs a unit (s, m, h, d), got 30",
        f"vmplacer: error: {config}: key 'placement.model_refresh': a duration needs a unit (s, m, h, d), got '60'",
    ], result.stderr
    config.write_text("retention: {plans: 30d, jobs: 12h}\nplacement: {model_refresh: 1d}\n"
                      "protect: {interval_s: 2, budget_window_s: 1d}\nweb: {session_idle_s: 90m}\n")
    result = run(tmp_path, "--config", str(config), "config", "show")
    assert result.returncode == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["retention"]["jobs"] == "12h" and shown["placement"]["model_refresh"] == "1d"
    assert shown["protect"]["interval_s"] == 2 and shown["protect"]["budget_window_s"] == 86_400
