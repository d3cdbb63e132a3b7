"""What every command prints, through the real console script: timestamps in JSON as ISO 8601
UTC, one spelling for absent values and booleans, and database errors that say what to do."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support import clean_env, require, run_vmplacer

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer(*args, env=clean_env({"VMPLACER_DATA_DIR": str(tmp_path)}))


@pytest.fixture
def config(tmp_path) -> Path:
    require(importlib.util.find_spec("libvirt") is not None, "libvirt-python is not installed")
    path = tmp_path / "vmplacer.yaml"
    path.write_text(f"database_url: sqlite:///{tmp_path / 'vmplacer.db'}\ndata_dir: {tmp_path}\n"
                    "hosts:\n  - {name: t1, uri: \"test:///default\"}\n")
    return path


def test_plans_json_timestamps_are_iso_8601_utc(config):
    from tests.functional.test_rebalance_cli import _store

    plan_id = _store(config)
    listing = run_vmplacer("--config", str(config), "plans", "list", "--format", "json")
    assert listing.returncode == 0, listing.stderr
    (row,) = json.loads(listing.stdout)
    assert ISO_UTC.match(row["created_at"]), row
    shown = run_vmplacer("--config", str(config), "plans", "show", str(plan_id), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    assert ISO_UTC.match(json.loads(shown.stdout)["plan"]["created_at"])


def test_token_list_json_timestamps_are_iso_8601_utc(tmp_path):
    assert run(tmp_path, "token", "create", "dash", "--scope", "read").returncode == 0
    listing = run(tmp_path, "token", "list", "--format", "json")
    assert listing.returncode == 0, listing.stderr
    (token,) = json.loads(listing.stdout)
    assert ISO_UTC.match(token["created_at"]) and token["last_used_at"] is None
    table = run(tmp_path, "token", "list").stdout
    assert token["created_at"] in table and "never" in table


def test_hosts_table_says_yes_and_dash_not_python_values(tmp_path):
    result = run(tmp_path, "hosts")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "example" in line and "test:///" in line)
    assert "yes" in row and "None" not in row and "True" not in row
    assert re.split(r"\s{2,}", row)[5] == "-"  # no maintenance (a piped table: columns two spaces apart)


def test_a_command_on_a_database_without_schema_says_to_upgrade(tmp_path):
    result = run(tmp_path, "profile", "show", "x")
    assert result.returncode == 1
    assert "no schema yet" in result.stderr and "vmplacer db upgrade" in result.stderr
    assert "SELECT" not in result.stderr and "[SQL" not in result.stderr and "sqlalche.me" not in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_database_with_an_older_schema_says_which_and_to_upgrade(tmp_path):
    assert run(tmp_path, "db", "upgrade", "0001").returncode == 0
    result = run(tmp_path, "profile", "show", "x")
    assert result.returncode == 1
    assert "revision 0001" in result.stderr and "vmplacer db upgrade" in result.stderr
    assert "SELECT" not in result.stderr


@pytest.mark.parametrize("action", ["downgrade", "upgrade"])
def test_an_unknown_revision_is_bad_input_naming_where_the_known_ones_are(tmp_path, action):
    result = run(tmp_path, "db", action, "zzz")
    assert result.returncode == 2
    assert "'zzz': not a known schema revision" in result.stderr
    assert "vmplacer db history" in result.stderr and "newer vmplacer" not in result.stderr


def test_unknown_revision_text_is_quoted_and_bounded(tmp_path):
    result = run(tmp_path, "db", "downgrade", "x\x1b[2J" + "y" * 500)
    assert result.returncode == 2
    assert "\x1b" not in result.stderr and len(result.stderr) < 400


def test_db_history_lists_known_revisions_and_marks_the_current_one(tmp_path):
    assert run(tmp_path, "db", "upgrade").returncode == 0
    result = run(tmp_path, "db", "history", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert rows[0]["revision"] == "0001" and rows[0]["description"]
    assert [r["revision"] for r in rows if r["current"]] == [rows[-1]["revision"]]


def test_db_upgrade_says_the_revision_the_database_is_at(tmp_path):
    from vmplacer.adapters.db.migrate import head_revision

    head = head_revision()
    assert f"at revision {head}" in run(tmp_path, "db", "upgrade").stdout
    older = run(tmp_path, "db", "upgrade", "0003")  # an older target changes nothing
    assert older.returncode == 0 and f"at revision {head}" in older.stdout
