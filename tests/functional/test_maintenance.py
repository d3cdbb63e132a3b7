"""Hosts in maintenance: the store on SQLite and PostgreSQL, and `vmplacer hosts disable|enable`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from tests.support import require, run_vmplacer
from vmplacer.adapters.db.maintenance import SqlMaintenanceStore
from vmplacer.adapters.db.models import AuditRow, HostRow


def _audit(sessions) -> list[tuple[str, str, str | None]]:
    with sessions() as session:
        return [(r.action, r.actor, r.host) for r in session.scalars(select(AuditRow).order_by(AuditRow.id))
                if r.action.startswith("maintenance")]


def test_start_keeps_the_first_record_and_end_clears_it(sessions):
    store = SqlMaintenanceStore(sessions)
    assert store.current() == {}
    first, changed = store.start("h1", "qemu:///system", by="ops@a", reason="BIOS update")
    assert changed and first.host == "h1" and first.reason == "BIOS update" and first.since.tzinfo is not None
    again, changed = store.start("h1", "qemu:///system", by="ops@b", reason="something else")
    assert not changed and again == first, "the first reason and time stay"
    assert set(store.current()) == {"h1"} and store.get("h2") is None
    assert "in maintenance since" in first.describe() and "ops@a: BIOS update" in first.describe()
    assert store.end("h1", by="ops@c") == first
    assert store.end("h1", by="ops@c") is None and store.end("never-seen", by="ops@c") is None
    assert store.current() == {}
    assert _audit(sessions) == [("maintenance-start", "ops@a", "h1"), ("maintenance-end", "ops@c", "h1")]
    with sessions() as session:  # the host row stays (placements and leases refer to hosts by it)
        assert session.scalar(select(HostRow.uri).where(HostRow.name == "h1")) == "qemu:///system"


@pytest.fixture
def cli_config(tmp_path) -> Path:
    try:
        import libvirt  # noqa: F401
    except ImportError:
        require(False, "libvirt-python is not installed")
    path = tmp_path / "vmplacer.yaml"
    path.write_text(f"database_url: sqlite:///{tmp_path / 'vmplacer.db'}\ndata_dir: {tmp_path}\n"
                    "hosts:\n  - {name: t1, uri: \"test:///default\", domain_type: qemu}\n"
                    "  - {name: t2, uri: \"test:///default\", domain_type: qemu}\n")
    return path


def _cli(config: Path, *args: str) -> tuple[int, dict | list, str, str]:
    done = run_vmplacer("--config", str(config), *args)
    try:
        data = json.loads(done.stdout) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        data = {}
    return done.returncode, data, done.stdout, done.stderr


def test_cli_disable_list_enable(cli_config):
    code, data, _, err = _cli(cli_config, "hosts", "disable", "t2", "--reason", "DIMM replacement",
                              "--format", "json")
    assert code == 0, err
    assert data["changed"] is True and data["maintenance"]["reason"] == "DIMM replacement"
    assert "@" in data["maintenance"]["by"]
    code, listed, _, err = _cli(cli_config, "hosts", "--format", "json")
    assert code == 0, err
    by_name = {h["name"]: h for h in listed}
    assert by_name["t1"]["maintenance"] is None
    assert by_name["t2"]["maintenance"]["reason"] == "DIMM replacement"
    code, _, text, err = _cli(cli_config, "hosts")
    assert code == 0 and "DIMM replacement" in text, err
    code, _, text, _ = _cli(cli_config, "hosts", "disable", "t2", "--reason", "again")
    assert code == 0 and text.startswith("already: host t2 is in maintenance") and "DIMM replacement" in text
    code, data, _, err = _cli(cli_config, "hosts", "enable", "t2", "--format", "json")
    assert code == 0 and data["changed"] is True and data["was"]["reason"] == "DIMM replacement", err
    code, _, text, _ = _cli(cli_config, "hosts", "enable", "t2")
    assert code == 0 and "it was not in maintenance" in text


@pytest.mark.parametrize("args, message", [
    (["disable", "nope", "--reason", "x"], "HOST 'nope': unknown host (configured: t1, t2)"),
    (["disable", "t1", "--reason", "  "], "--reason: must not be empty"),
    (["disable", "t1"], "the following arguments are required: --reason"),
    (["enable", "nope"], "HOST 'nope': unknown host"),
])
def test_cli_bad_input_exits_2_and_changes_nothing(cli_config, args, message):
    code, _, _, err = _cli(cli_config, "hosts", *args)
    assert code == 2 and message in err, err
    code, listed, _, _ = _cli(cli_config, "hosts", "--format", "json")
    assert all(h["maintenance"] is None for h in listed)


@pytest.mark.parametrize("args, message", [
    (["rebalance", "--drain", "nope"], "--drain 'nope': unknown host (configured: t1, t2)"),
    (["rebalance", "--reason", "x"], "--reason: only with --drain HOST"),
    (["rebalance", "--drain", "t1", "--no-migrate"], "--no-migrate: a drain is made of live migrations"),
    (["rebalance", "--drain", "t1", "--share"], "--share: does not apply to a drain"),
    (["rebalance", "--drain", "t1", "--batch-hosts", "4"], "--batch-hosts: only when the run shares its hosts"),
    (["rebalance", "--drain", "t1", "--host", "t2"], "host t1 to drain is not among the hosts of this run"),
    (["plan", "--rebalance", "--drain", "nope"], "--drain 'nope': unknown host"),
])
def test_cli_drain_bad_input_exits_2(cli_config, args, message):
    code, _, _, err = _cli(cli_config, *args)
    assert code == 2 and message in err, err


def test_cli_drain_dry_run_changes_nothing_and_names_who_stays(cli_config):
    """The test driver's one domain shows on both hosts (one libvirt underneath): it is held
    still ("runs on two hosts"), so the drain names it and exits 1 without acting."""
    code, data, _, err = _cli(cli_config, "plan", "--rebalance", "--drain", "t1", "--format", "json")
    assert code == 0, err
    assert data["plan"]["settings"]["notes"]["drain"] == "t1" and data["plan"]["state"] == "empty"
    assert any(n.startswith("guest test: ") and "stays on t1" in n for n in data["notes"]), data["notes"]
    code, listed, _, _ = _cli(cli_config, "hosts", "--format", "json")
    assert all(h["maintenance"] is None for h in listed), "a dry run leaves maintenance alone"
    code, data, _, err = _cli(cli_config, "rebalance", "--drain", "t1", "--yes", "--reason", "kernel update",
                              "--profile-seconds", "0", "--format", "json")
    assert code == 1, err
    assert "host t1 is in maintenance" in err and "kernel update" in err
    assert any("stays on t1" in n for n in data["notes"])
    code, listed, _, _ = _cli(cli_config, "hosts", "--format", "json")
    assert {h["name"]: (h["maintenance"] or {}).get("reason") for h in listed} == {"t1": "kernel update", "t2": None}


def test_cli_place_refuses_a_host_in_maintenance_unless_told(cli_config):
    request = cli_config.parent / "guests.yaml"
    request.write_text("guests:\n  - {name: g1, vcpus: 1, memory_mib: 64}\n")
    code, _, _, err = _cli(cli_config, "hosts", "disable", "t1", "--reason", "PSU swap")
    assert code == 0, err
    code, data, _, err = _cli(cli_config, "place", "--host", "t1", "--request", str(request), "--format", "json")
    # a host in maintenance takes no guest: an answer about capacity (exit 3), each guest refused
    assert code == 3, err
    assert [(e["guest"], e["kind"], e["refused"][0]["kind"]) for e in data["errors"]] == [("g1", "no-fit", "maintenance")]
    assert "host t1 is in maintenance" in data["errors"][0]["message"] and "PSU swap" in data["errors"][0]["message"]
    code, _, out, err = _cli(cli_config, "place", "--host", "t1", "--request", str(request))
    assert code == 3 and "host t1 is in maintenance" in err and "PSU swap" in err, (out, err)
    # the dry run says the same, with the same exit code
    code, planned, _, err = _cli(cli_config, "plan", "--host", "t1", "--request", str(request), "--format", "json")
    assert code == 3 and planned["errors"] == data["errors"] and planned["placements"] == [], (planned, err)
    assert planned["refused_hosts"] == data["refused_hosts"] and planned["refused_hosts"][0]["kind"] == "maintenance"
    code, data, _, err = _cli(cli_config, "place", "--host", "t1", "--request", str(request),
                              "--ignore-maintenance", "--format", "json")
    assert "in maintenance" not in err
    # past the check, the placement engine decides: the test driver's memory is full (exit 3)
    assert code == 3 and data["errors"][0]["kind"] == "no-fit", (data, err)


def test_cli_hosts_still_lists_hosts_when_the_database_is_down(tmp_path):
    try:
        import libvirt  # noqa: F401
    except ImportError:
        require(False, "libvirt-python is not installed")
    config = tmp_path / "vmplacer.yaml"
    config.write_text("database_url: postgresql+psycopg://nobody@127.0.0.1:1/none\n"
                      f"data_dir: {tmp_path}\nhosts:\n  - {{name: t1, uri: \"test:///default\"}}\n")
    code, listed, _, err = _cli(config, "hosts", "--format", "json")
    assert code == 1 and "maintenance states unknown: database" in err, err
    assert [(h["name"], h["reachable"], h["maintenance"]) for h in listed] == [("t1", True, None)]


def test_cli_hosts_still_lists_hosts_when_the_schema_is_from_a_newer_version(tmp_path):
    try:
        import libvirt  # noqa: F401
    except ImportError:
        require(False, "libvirt-python is not installed")
    import sqlite3

    config = tmp_path / "vmplacer.yaml"
    config.write_text(f"data_dir: {tmp_path}\nhosts:\n  - {{name: t1, uri: \"test:///default\"}}\n")
    code, _, _, err = _cli(config, "db", "upgrade")
    assert code == 0, err
    with sqlite3.connect(tmp_path / "vmplacer.db") as connection:
        connection.execute("UPDATE alembic_version SET version_num = '9999'")
    code, listed, _, err = _cli(config, "hosts", "--format", "json")
    assert code == 1 and "maintenance states unknown: database" in err and "9999" in err, err
    assert "Traceback" not in err
    assert [(h["name"], h["reachable"]) for h in listed] == [("t1", True)]
    # every other command that needs the database says so in one line, without a traceback
    for command in (("plans",), ("hosts", "disable", "t1", "--reason", "x"), ("reconcile",)):
        code, _, _, err = _cli(config, *command)
        assert code == 1 and "vmplacer: failed: database " in err and "9999" in err, (command, err)
        assert "Traceback" not in err, (command, err)
