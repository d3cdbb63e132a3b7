"""`vmplacer protect` through the real console script: bad input exits 2 naming the option; one
round on libvirt's test driver (no CPU bandwidth control there) exits 0 and says why it left the
guest alone."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support import clean_env, run_vmplacer


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer("protect", *args, env=clean_env({"VMPLACER_DATA_DIR": str(tmp_path)}))


@pytest.mark.parametrize(("args", "message"), [
    (("--host", "nope", "--once"), "--host 'nope': not a configured host"),
    (("--host", "example", "--rounds", "0"), "--rounds: must be at least 1"),
    (("--host", "example", "--samples", "0"), "--samples: must be 1..100"),
    (("--host", "example", "--t-m-ms", "0"), "--t-m-ms: must be 100 us..1 s"),
    (("--host", "example", "--interval", "soon"), "--interval"),
    (("--host", "example", "--interval", "0.1s"), "--interval: must be 200 ms..1 h"),
    (("--host", "example", "--scope", " "), "--scope: a glob must not be empty"),
])
def test_bad_input_exits_2_naming_the_option(tmp_path, args, message):
    result = run(tmp_path, *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_one_round_on_the_test_driver(tmp_path):
    result = run(tmp_path, "--host", "example", "--once", "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["host"] == "example" and report["verdicts"] == [] and report["steps"] == []
    assert any("CPU bandwidth unreadable" in note and "not supported" in note for note in report["notes"])
    assert report["budget"]["max_share"] == 0.02 and report["pace"]["interval_s"] == 2.0
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", report["at"])  # ISO 8601 UTC, as every command's JSON
    table = run(tmp_path, "--host", "example", "--once")
    assert table.returncode == 0 and "budget 2.00 %" in table.stdout, table.stdout + table.stderr


def test_the_loop_needs_a_host(tmp_path):
    result = run(tmp_path, "--once")
    assert result.returncode == 2 and "--host: required" in result.stderr


def test_status_lists_the_ledger(tmp_path):
    from vmplacer.adapters.db import migrate
    from vmplacer.adapters.db.engine import make_engine, make_session_factory
    from vmplacer.adapters.db.throttles import SqlThrottleLedger
    from vmplacer.core.placement.bandwidth import CpuBandwidth, throttled_to

    url = f"sqlite:///{tmp_path / 'vmplacer.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    SqlThrottleLedger(make_session_factory(engine)).note("example", "test", throttled_to(0.4), CpuBandwidth(),
                                                         protects="web", plan_id=3)
    engine.dispose()
    empty = run(tmp_path, "status", "--host", "example", "--format", "json")
    assert empty.returncode == 0, empty.stderr
    (row,) = json.loads(empty.stdout)["throttles"]
    assert (row["guest"], row["share"], row["protects"], row["plan_id"]) == ("test", 0.4, "web", 3)
    assert "not supported" in row["live_share"]  # the test driver has no CPU bandwidth control
    table = run(tmp_path, "status")
    assert table.returncode == 0 and "throttles vmplacer set" in table.stdout and "web" in table.stdout
    assert run(tmp_path, "status", "--host", "nope").returncode == 2


def recorded_rounds(tmp_path: Path) -> None:
    """Rounds as the loop records them: web below its floor, then held while batch is throttled."""
    import time

    from vmplacer.adapters.protect_history import ProtectHistory

    history = ProtectHistory.in_data_dir(tmp_path)
    now = time.time()
    for i, (ratio, share, state) in enumerate([(0.5, 0.9, "below"), (0.6, 0.8, "below"), (0.82, 0.8, "held")]):
        history.append({"host": "example", "at": now - 10 + i * 2, "shares": {"batch": share},
                        "budget": {"max_share": 0.02, "window_s": 300.0, "spent_s": 0.5, "share": 0.011},
                        "pace": {"interval_s": 2.0, "samples": 5, "reason": "acted"},
                        "guests": {"web": {"ratio": ratio, "ratio_raw": ratio, "floor": 0.8, "state": state,
                                           "throttles_applied": min(i + 1, 2), "below_floor_s": 2.0 * i}}})


def test_status_shows_each_protected_guest_and_the_freeze_budget(tmp_path):
    recorded_rounds(tmp_path)
    result = run(tmp_path, "status", "--host", "example", "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    (guest,) = data["guests"]
    assert (guest["guest"], guest["ratio"], guest["floor"], guest["state"]) == ("web", 0.82, 0.8, "held")
    assert (guest["throttles_applied"], guest["below_floor_s"]) == (2, 4.0)
    (loop,) = data["loops"]
    assert (loop["freeze_share"], loop["freeze_budget"]) == (0.011, 0.02)
    table = run(tmp_path, "status")
    assert table.returncode == 0 and "protected guests" in table.stdout and "freeze budget" in table.stdout
    assert "0.82" in table.stdout and "1.10 %" in table.stdout


def test_status_plot_draws_a_png_from_the_recorded_rounds(tmp_path):
    recorded_rounds(tmp_path)
    out = tmp_path / "protect.png"
    result = run(tmp_path, "status", "--host", "example", "--plot", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "2 series over 3 rounds" in result.stdout
    assert run(tmp_path, "status", "--plot", str(tmp_path / "x.svg")).returncode == 2
    nothing = run(tmp_path, "status", "--host", "example", "--plot", str(out), "--since", "1s")
    assert nothing.returncode == 1 and "nothing to plot" in nothing.stderr
