"""`--columns` on every command that lists records as one table, through the real console script
on a real SQLite database: hosts, token list, plans list, db history, model show and reconcile
each show the columns named, in that order, with the values their JSON holds, and refuse an
unknown name (exit 2, the valid names listed). Host: the built-in example host (libvirt's test
driver); the database holds recorded guests, a stored plan, learned profiles and a token."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.functional.test_api_helpers import make_container
from tests.functional.web_support import record_guests, store_plan, store_profiles
from tests.support import clean_env, run_vmplacer
from vmplacer.cli.common import column_key
from vmplacer.config import EXAMPLE_HOST_NAME

TOKEN = "columns-reader"


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("columns")
    url = f"sqlite:///{directory / 'vmplacer.db'}"
    container = make_container(url, directory, None)
    try:
        record_guests(container, EXAMPLE_HOST_NAME)
        store_plan(container, EXAMPLE_HOST_NAME)
        store_profiles(container, EXAMPLE_HOST_NAME)
        container.token_store.create(TOKEN, "read")
    finally:
        container.close()
    path = directory / "vmplacer.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(directory), "database_url": url}))
    return path


def _vmplacer(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer("--config", str(config), *args, env=clean_env(drop=("VMPLACER_", "COLUMNS", "LINES")))


def _cells(line: str) -> list[str]:
    """A line of a `wide` table: its cells, two or more blanks apart."""
    return re.split(r"\s{2,}", line.strip())


# command, the columns asked for (in that order), the JSON's rows, and each row's cells as the
# table writes them, in that order
CASES: list[tuple[tuple[str, ...], str, Callable[[Any], list[dict[str, Any]]], Callable[[dict[str, Any]], list[str]]]] = [
    (("hosts",), "reachable,name", lambda data: data,
     lambda r: ["yes" if r["reachable"] else "no", r["name"]]),
    (("token", "list"), "scope,name", lambda data: data, lambda r: [r["scope"], r["name"]]),
    (("plans", "list", "--all"), "actions,state,id", lambda data: data,
     lambda r: [str(r["actions"]), r["state"], str(r["id"])]),
    (("db", "history"), "current,revision", lambda data: data,
     lambda r: ["yes" if r["current"] else "no", r["revision"]]),
    (("model", "show"), "interference-mean-loss-caused,model-key", lambda data: data["guests"],
     lambda r: [f"{r['interference']:.3f}", r["guest"]]),
    # reconcile's findings: the recorded guests libvirt's test driver does not run (nothing changed)
    (("reconcile", "--dry-run"), "kind,guest,host",
     lambda data: [f for host in data["hosts"] for f in host["findings"]],
     lambda r: [r["kind"], r["guest"], r["host"]]),
]


def _headers(command: tuple[str, ...]) -> tuple[str, ...]:
    from vmplacer.cli.db import HISTORY_COLUMNS
    from vmplacer.cli.hosts import HOSTS_COLUMNS
    from vmplacer.cli.model import MODEL_COLUMNS
    from vmplacer.cli.rebalance import PLANS_COLUMNS
    from vmplacer.cli.reconcile import RECONCILE_COLUMNS
    from vmplacer.cli.token import TOKEN_COLUMNS

    return {"hosts": HOSTS_COLUMNS, "token": TOKEN_COLUMNS, "plans": PLANS_COLUMNS, "db": HISTORY_COLUMNS,
            "model": MODEL_COLUMNS, "reconcile": RECONCILE_COLUMNS}[command[0]]


@pytest.mark.parametrize(("command", "columns", "rows_of", "cells_of"), CASES,
                         ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_a_table_shows_the_columns_named_in_that_order(config, command, columns, rows_of, cells_of):
    listed = _vmplacer(config, *command, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    rows = rows_of(json.loads(listed.stdout))
    assert rows, f"the control: {' '.join(command)} lists something"
    shown = _vmplacer(config, *command, "-o", "wide", "--columns", columns)
    assert shown.returncode == 0, shown.stderr
    headers = {column_key(h): h for h in _headers(command)}
    lines = shown.stdout.splitlines()
    (at,) = [i for i, line in enumerate(lines) if _cells(line) == [headers[n] for n in columns.split(",")]]
    table = lines[at + 1:at + 1 + len(rows)]
    assert [_cells(line) for line in table] == [cells_of(r) for r in rows]


@pytest.mark.parametrize("command", [c[0] for c in CASES], ids=lambda v: " ".join(v))
def test_an_unknown_column_exits_2_naming_the_valid_ones(config, command):
    done = _vmplacer(config, *command, "--columns", "name,no-such-column")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    valid = ", ".join(column_key(h) for h in _headers(command))
    assert "argument --columns: unknown column" in done.stderr and f"(columns: {valid})" in done.stderr, done.stderr
