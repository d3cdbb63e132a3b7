"""`--columns` on commands that print several tables, or one table per action, through the real
console script on a real SQLite database: `plans show`, `protect status`, `profile show`,
`eval rank` and `db prune` show the columns named of their main table, in that order, with the
values their JSON holds, and leave the other tables whole; a name the action's table lacks, or an
action with no main table (`profile replay`, `protect run`, `protect status --plot`), exits 2
before anything runs, naming the option and the columns there are."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.functional.test_cli_columns import _cells, _vmplacer, config  # noqa: F401 - the module's fixture
from tests.functional.web_support import DEDICATED
from vmplacer.adapters.protect_history import ProtectHistory
from vmplacer.cli.common import column_key
from vmplacer.cli.db import PRUNE_COLUMNS
from vmplacer.cli.eval import RANK_COLUMNS
from vmplacer.cli.profile import RESULT_COLUMNS, SHOW_COLUMNS
from vmplacer.cli.protect import PROTECTED_COLUMNS
from vmplacer.cli.rebalance import PLAN_ACTION_COLUMNS, PLANS_COLUMNS
from vmplacer.config import EXAMPLE_HOST_NAME

DATA = Path(__file__).resolve().parents[1] / "data"
PAIRS = DATA / "interference" / "exynos4412_arm_pairs.csv"
PROFILES = DATA / "profiles" / "synthetic_counter_profiles.csv"


@pytest.fixture(scope="module")
def protected(config: Path) -> Path:  # noqa: F811 - the fixture imported above
    """The config, with one round of the protection loop recorded for the example host."""
    data_dir = Path(yaml.safe_load(config.read_text())["data_dir"])
    ProtectHistory.in_data_dir(data_dir).append({
        "host": EXAMPLE_HOST_NAME, "at": time.time(),
        "budget": {"share": 0.004, "max_share": 0.02, "window_s": 60.0}, "pace": {"interval_s": 5.0, "samples": 5},
        "guests": {"db": {"ratio": 0.71, "floor": 0.8, "state": "throttling", "throttles_applied": 2,
                          "below_floor_s": 12.0},
                   "web": {"ratio": 0.93, "floor": 0.8, "state": "ok", "throttles_applied": 0,
                           "below_floor_s": 0.0}}})
    return config


def _fmt(value: Any) -> str:
    return "-" if value in (None, "") else str(value)


# command, the columns asked for (in that order), the main table's headers, the JSON's rows, and
# each row's cells as the table writes them, in that order
CASES: list[tuple[tuple[str, ...], str, tuple[str, ...], Callable[[Any], list[dict[str, Any]]],
                  Callable[[dict[str, Any]], list[str]]]] = [
    (("plans", "show", "1"), "guest,index,gain", PLAN_ACTION_COLUMNS, lambda data: data["plan"]["actions"],
     lambda a: [_fmt(a["guest"]), str(a["index"]), f"{a['predicted_gain']:+.3f}"]),
    (("protect", "status"), "state,guest,zeta-zetab", PROTECTED_COLUMNS, lambda data: data["guests"],
     lambda g: [g["state"], g["guest"], f"{g['ratio']:.2f}"]),
    (("profile", "show", DEDICATED), "n,series", SHOW_COLUMNS,
     lambda data: [{"n": data["vms"][DEDICATED][kind]["n"], "series": label}
                   for kind, label in (("zeta", "ζ (shared)"), ("zeta_b", "ζb (frozen)"))],
     lambda r: [str(r["n"]), r["series"]]),
    (("eval", "rank", "--pairs", str(PAIRS), "--profiles", str(PROFILES)), "spearman,score", RANK_COLUMNS,
     lambda data: [{"score": t, **data[t]} for t in ("sensitivity", "interference")],
     lambda r: [str(r["spearman"]), r["score"]]),
    (("db", "prune", "--dry-run"), "rows,kind", PRUNE_COLUMNS,
     lambda data: [{"kind": k, "n": n} for k, n in data["counts"].items()], lambda r: [str(r["n"]), r["kind"]]),
]


@pytest.mark.parametrize(("command", "columns", "headers", "rows_of", "cells_of"), CASES,
                         ids=[" ".join(case[0][:2]) for case in CASES])
def test_the_main_table_shows_the_columns_named_in_that_order(protected, command, columns, headers, rows_of,
                                                              cells_of):
    listed = _vmplacer(protected, *command, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    rows = rows_of(data)
    assert rows, f"the control: {' '.join(command)} lists something"
    shown = _vmplacer(protected, *command, "-o", "wide", "--columns", columns)
    assert shown.returncode == 0, shown.stderr
    by_key = {column_key(h): h for h in headers}
    lines = shown.stdout.splitlines()
    (at,) = [i for i, line in enumerate(lines) if _cells(line) == [by_key[n] for n in columns.split(",")]]
    table = [_cells(line) for line in lines[at + 1:at + 1 + len(rows)]]
    assert table == [cells_of(r) for r in rows]


def test_the_other_tables_stay_whole(protected):
    shown = _vmplacer(protected, "protect", "status", "-o", "wide", "--columns", "guest")
    assert shown.returncode == 0, shown.stderr
    lines = [_cells(line) for line in shown.stdout.splitlines()]
    assert ["guest"] in lines
    assert ["host", "frozen share", "budget", "window", "next round in", "samples"] in lines
    assert ["host", "guest", "share", "libvirt shows", "before", "protects", "age", "plan"] in lines
    plan = _vmplacer(protected, "plans", "show", "1", "-o", "wide", "--columns", "state")
    assert plan.returncode == 0, plan.stderr
    assert ["state"] in [_cells(line) for line in plan.stdout.splitlines()]
    assert ["guest", "host", "pinning before", "pinning after", "predicted perf"] in [
        _cells(line) for line in plan.stdout.splitlines()]


@pytest.mark.parametrize(("command", "headers"), [
    (("plans", "list"), PLANS_COLUMNS),
    (("plans", "show", "1"), PLAN_ACTION_COLUMNS),
    (("plans", "cancel", "1"), PLAN_ACTION_COLUMNS),
    (("profile", "show", DEDICATED), SHOW_COLUMNS),
    (("profile", "run"), RESULT_COLUMNS),
    (("protect", "status"), PROTECTED_COLUMNS),
    (("db", "prune"), PRUNE_COLUMNS),
], ids=["plans list", "plans show", "plans cancel", "profile show", "profile run", "protect status", "db prune"])
def test_a_column_the_actions_table_lacks_exits_2_naming_its_columns(protected, command, headers):
    done = _vmplacer(protected, *command, "--columns", "guest,no-such-column")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    valid = ", ".join(column_key(h) for h in headers)
    assert "--columns: unknown column" in done.stderr and f"(columns: {valid})" in done.stderr, done.stderr
    assert "no-such-column" in done.stderr
    if command[1] == "cancel":  # refused before it acted
        listed = json.loads(_vmplacer(protected, "plans", "show", "1", "-o", "json").stdout)
        assert listed["plan"]["state"] == "proposed"


@pytest.mark.parametrize(("command", "takers"), [
    (("profile", "replay"), "`profile run`, `profile show`"),
    (("protect", "run", "--host", EXAMPLE_HOST_NAME, "--once"), "`protect status`"),
], ids=["profile replay", "protect run"])
def test_an_action_without_a_main_table_refuses_columns(protected, command, takers):
    done = _vmplacer(protected, *command, "--columns", "guest")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert f"--columns: `{' '.join(command[:2])}` prints no single main table" in done.stderr, done.stderr
    assert f"(--columns applies to {takers})" in done.stderr


def test_columns_is_refused_with_a_plot_and_with_json(protected, tmp_path):
    done = _vmplacer(protected, "protect", "status", "--plot", str(tmp_path / "p.png"), "--columns", "guest")
    assert done.returncode == 2 and "--columns: applies to the tables of `protect status`, not to --plot" in done.stderr
    assert not (tmp_path / "p.png").exists()
    done = _vmplacer(protected, "plans", "show", "1", "-o", "json", "--columns", "guest")
    assert done.returncode == 2 and "argument --columns: applies to table and wide output, not to json" in done.stderr


def test_help_lists_each_actions_columns(protected):
    done = _vmplacer(protected, "plans", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "list: " + ", ".join(column_key(h) for h in PLANS_COLUMNS) in text
    assert "show: " + ", ".join(column_key(h) for h in PLAN_ACTION_COLUMNS) in text
