"""`vmplacer plan --rebalance`, `plans`, `apply`, `rebalance` and `eval rebalance` through the real
console script, against libvirt's built-in test driver and a SQLite database: JSON contract and
exit codes 0/1/2. (Moves on real guests: tests/integration/test_rebalance_live.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import require

ROOT = Path(__file__).resolve().parents[2]
VMPLACER = str(Path(sys.executable).with_name("vmplacer"))
E7600 = ROOT / "tests" / "data" / "interference" / "e7600_2core_pairs.csv"
MIXED = ROOT / "examples" / "requests" / "mixed.yaml"


@pytest.fixture
def config(tmp_path) -> Path:
    try:
        import libvirt  # noqa: F401
    except ImportError:
        require(False, "libvirt-python is not installed")
    path = tmp_path / "vmplacer.yaml"
    path.write_text(f"database_url: sqlite:///{tmp_path / 'vmplacer.db'}\ndata_dir: {tmp_path}\n"
                    "hosts:\n  - {name: t1, uri: \"test:///default\"}\n")
    return path


def vmplacer(config: Path | None, *args: str) -> tuple[int, dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VMPLACER_")}
    prefix = ["--config", str(config)] if config else []
    done = subprocess.run([VMPLACER, *prefix, *args], capture_output=True, text=True, env=env, timeout=120)
    try:
        data = json.loads(done.stdout) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        data = {"text": done.stdout}
    return done.returncode, data, done.stderr


def test_plan_store_show_apply_and_lifecycle(config):
    code, data, err = vmplacer(config, "plan", "--rebalance", "--all", "--format", "json")
    assert code == 0, err
    plan = data["plan"]
    assert data["status"] == "planned" and plan["state"] == "proposed" and plan["id"] == 1
    assert {"actions", "diff", "objective_before", "objective_after", "predicted_gain", "settings"} <= set(plan)
    assert plan["settings"]["min_gain"] == 0.05 and "notes" in plan["settings"]
    code, listed, _ = vmplacer(config, "plans", "--format", "json")
    assert code == 0 and [p["id"] for p in listed] == [1]
    code, shown, _ = vmplacer(config, "plans", "1", "--format", "json")
    assert shown["plan"]["id"] == 1 and shown["plan"]["state"] == "proposed"
    code, applied, err = vmplacer(config, "apply", "1", "--format", "json")
    assert code == 0, err
    assert applied["plan"]["state"] == "succeeded"
    code, _, err = vmplacer(config, "apply", "1")
    assert code == 2 and "plan 1 is succeeded" in err
    code, _, err = vmplacer(config, "apply", "99")
    assert code == 2 and "plan 99 does not exist" in err


def test_rebalance_run_reports_its_steps(config):
    code, report, err = vmplacer(config, "rebalance", "--profile-seconds", "0", "--format", "json")
    assert code == 0, err
    assert report["status"] == "nothing-to-do"
    assert [s["name"] for s in report["steps"]] == ["profile", "learn", "plan"]
    assert report["steps"][0]["status"] == "skipped"
    code, report, err = vmplacer(config, "rebalance", "--dry-run", "--profile-seconds", "0", "--no-migrate",
                                 "--max-actions", "3", "--format", "json")
    assert code == 0 and report["plan"]["settings"]["max_actions"] == 3
    assert report["plan"]["settings"]["allow_migration"] is False


@pytest.mark.parametrize("args, message", [
    (["plan", "--rebalance", "--host", "nope"], "--host 'nope': unknown host"),
    (["rebalance", "--host", "nope"], "--host 'nope': unknown host"),
    (["place", "--host", "nope", "--request", str(MIXED)], "--host 'nope': unknown host"),
    (["profile", "--host", "nope"], "--host 'nope': unknown host"),
    (["profile", "replay", "--host", "nope"], "--host 'nope': unknown host"),
    (["plan", "--rebalance", "--request", "x.yaml"], "--request: not used with --rebalance"),
    (["plan", "--all", "--request", "x.yaml"], "--all: only with --rebalance"),
    (["plan"], "--request: required"),
    (["rebalance", "--max-actions", "-1"], "--max-actions"),
    (["rebalance", "--profile-seconds", "-2"], "--profile-seconds"),
    (["rebalance", "--migration-timeout", "0"], "--migration-timeout"),
    (["rebalance", "--host", "t1", "--all"], "not allowed with argument"),
])
def test_bad_input_exits_2_naming_the_option(config, args, message):
    code, _, err = vmplacer(config, *args)
    assert code == 2, err
    assert message in err


def test_eval_rebalance_prints_one_case():
    code, row, err = vmplacer(None, "eval", "rebalance", "--pairs", str(E7600), "--seed", "1", "--rounds", "2",
                              "--format", "json")
    assert code == 0, err
    for key in ("matrix", "start", "hosts", "vms", "none", "seed_policy", "blind_spread", "vmplacer", "optimum"):
        assert key in row
    assert row["matrix"] == "e7600_2core_pairs.csv" and row["start"] == "siblings"
    assert row["optimum"] is not None and row["none"] <= row["optimum"]
    assert set(row["per_vm"]["vmplacer"]) == {f"vm{i}" for i in range(row["vms"])}
    code, _, err = vmplacer(None, "eval", "rebalance", "--pairs", str(E7600), "--shape", "1x2")
    assert code == 2 and "--shape" in err
    code, _, err = vmplacer(None, "eval", "rebalance", "--pairs", str(E7600), "--vms", "9")
    assert code == 2 and "--vms 9" in err
