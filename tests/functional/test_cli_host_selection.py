"""The host selection convention through the real console script, on the built-in example host."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tests.support import clean_env, run_vmplacer

ROOT = Path(__file__).resolve().parents[2]
MIXED = str(ROOT / "examples" / "requests" / "mixed.yaml")


def plan(*hosts: str) -> dict:
    env = clean_env({"VMPLACER_DATA_DIR": tempfile.mkdtemp(prefix="vmplacer-hosts-")})
    done = run_vmplacer("plan", "--request", MIXED, *hosts, "--format", "json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_all_hosts_all_host_and_the_default_plan_alike_with_one_host():
    by_default = plan()
    assert by_default["hosts"] == ["example"] and len(by_default["placements"]) == 8
    assert plan("--all-hosts") == by_default
    assert plan("--all") == by_default
    assert plan("--host", "example") == by_default
