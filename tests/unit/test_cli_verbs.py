"""Noun-verb spellings (`profile run`, `plans show`, `protect status`) and the older ones without
the verb reach the same handler with the same words; what is ambiguous or wrong exits 2 saying so."""

from __future__ import annotations

import pytest

from vmplacer.cli import profile
from vmplacer.cli.common import UsageError
from vmplacer.cli.main import build_parser, main
from vmplacer.cli.verbs import split_verb


@pytest.fixture
def dispatched(monkeypatch):
    """`vmplacer profile ARGS` → (the mode it ran, the VMs it was given), no host touched."""
    seen: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(profile, "run_profile", lambda args, ctx: seen.append(("run", list(args.vms))) or 0)
    monkeypatch.setattr(profile, "run_replay", lambda args, ctx: seen.append(("replay", list(args.vms))) or 0)
    monkeypatch.setattr(profile, "run_show", lambda args, ctx, vms: seen.append(("show", list(vms))) or 0)

    def run(*argv: str) -> tuple[str, list[str]]:
        assert main(["profile", *argv]) == 0
        return seen.pop()

    return run


@pytest.mark.parametrize("argv, expected", [
    ((), ("run", [])),
    (("run",), ("run", [])),
    (("web", "db"), ("run", ["web", "db"])),
    (("run", "web", "db"), ("run", ["web", "db"])),
    (("--host", "example", "web"), ("run", ["web"])),
    (("run", "show"), ("run", ["show"])),  # a VM named like an action, profiled
    (("run", "run", "replay"), ("run", ["run", "replay"])),
    (("show", "web"), ("show", ["web"])),
    (("show", "--run", "3", "web", "db"), ("show", ["web", "db"])),
    (("replay",), ("replay", [])),
])
def test_profile_with_and_without_the_verb(dispatched, argv, expected):
    assert dispatched(*argv) == expected


@pytest.mark.parametrize("argv, message", [
    (("profile", "show"), "profile show: name at least one VM (a VM named `show` is profiled with "
                          "`vmplacer profile run show`)"),
    (("profile", "replay", "web"), "profile replay: takes no arguments, got web"),
    (("plans", "show"), "plans show: give exactly one PLAN_ID, e.g. `vmplacer plans show 12`"),
    (("plans", "show", "1", "2"), "plans show: give exactly one PLAN_ID"),
    (("plans", "1", "2"), "plans show: give exactly one PLAN_ID"),
    (("plans", "cancel"), "plans cancel: give exactly one PLAN_ID"),
    (("plans", "list", "3"), "plans list: takes no arguments, got 3 (`vmplacer plans show 3` shows one plan)"),
    (("plans", "frob"), "PLAN_ID: must be a plan number (or an action: list, show, cancel), got 'frob'"),
    (("plans", "show", "3", "--limit", "5"), "--limit: only when listing plans (`plans list`)"),
    (("plans", "list", "--reason", "x"), "--reason: only with `plans cancel PLAN_ID`"),
])
def test_a_wrong_or_ambiguous_spelling_exits_2_saying_the_rule(capsys, monkeypatch, tmp_path, argv, message):
    monkeypatch.setenv("VMPLACER_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("VMPLACER_CONFIG", raising=False)
    assert main(list(argv)) == 2
    assert f"vmplacer: error: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("argv, what", [
    (("protect", "--host", "h"), "run"),
    (("protect", "run", "--host", "h"), "run"),
    (("protect", "status"), "status"),
])
def test_protect_with_and_without_the_verb(argv, what):
    assert build_parser(list(argv)).parse_args(list(argv)).what == what


def test_protect_with_an_unknown_action_exits_2_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["protect", "stats"])
    assert exited.value.code == 2
    assert "invalid choice: 'stats' (choose from 'run', 'status')" in capsys.readouterr().err


def test_split_verb_refuses_a_word_that_is_no_action_where_none_is_implied():
    with pytest.raises(UsageError, match=r"protect: 'x' is not an action \(one of run, status\)"):
        split_verb("protect", ["x"], ("run", "status"), bare="run", other=None)
