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
    (("protect", "--host", "h"), None),  # left out: the handler takes `run`, saying it is deprecated
    (("protect", "run", "--host", "h"), "run"),
    (("protect", "status"), "status"),
])
def test_protect_with_and_without_the_verb(argv, what):
    assert build_parser(list(argv)).parse_args(list(argv)).what == what


@pytest.mark.parametrize("argv, old, new", [
    (("profile", "web", "db"), "profile web db", "profile run web db"),
    (("profile",), "profile", "profile run"),
    (("profile", "--host", "example", "web"), "profile web", "profile run web"),
])
def test_profile_without_the_verb_says_once_it_is_deprecated(dispatched, capsys, argv, old, new):
    dispatched(*argv[1:])
    err = capsys.readouterr().err
    assert err.count("deprecated") == 1 and f"vmplacer: `{old}` is deprecated; use `{new}`\n" in err, err


@pytest.mark.parametrize("argv", [("run", "web"), ("show", "web"), ("replay",)])
def test_profile_with_the_verb_says_nothing_of_deprecation(dispatched, capsys, argv):
    dispatched(*argv)
    assert "deprecated" not in capsys.readouterr().err


@pytest.mark.parametrize("argv, code, old, new", [
    (("plans", "12"), 2, "plans 12", "plans show 12"),  # no plan 12 in a fresh database: exit 2, after the line
    (("plans",), 0, "plans", "plans list"),
    (("protect", "--host", "nowhere"), 2, "protect", "protect run"),
])
def test_the_older_spellings_work_and_say_once_they_are_deprecated(capsys, monkeypatch, tmp_path, argv, code,
                                                                    old, new):
    monkeypatch.setenv("VMPLACER_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("VMPLACER_CONFIG", raising=False)
    assert main(list(argv)) == code
    err = capsys.readouterr().err
    assert err.count("deprecated") == 1 and f"vmplacer: `{old}` is deprecated; use `{new}`\n" in err, err
    if argv[0] == "plans" and code == 2:
        assert "plan 12 does not exist" in err  # it did what `plans show 12` does
    if argv[0] == "protect":
        assert "--host 'nowhere': not a configured host" in err  # it went on as `protect run`


@pytest.mark.parametrize("argv", [("plans", "list"), ("plans", "show", "12")])
def test_the_noun_verb_spellings_say_nothing_of_deprecation(capsys, monkeypatch, tmp_path, argv):
    monkeypatch.setenv("VMPLACER_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("VMPLACER_CONFIG", raising=False)
    main(list(argv))
    assert "deprecated" not in capsys.readouterr().err


def test_a_word_with_control_characters_is_quoted_in_the_deprecation_line(dispatched, capsys):
    dispatched("we\x1b[2Jb")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "'we\\x1b[2Jb'" in err, err


def test_protect_with_an_unknown_action_exits_2_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["protect", "stats"])
    assert exited.value.code == 2
    assert "invalid choice: 'stats' (choose from 'run', 'status')" in capsys.readouterr().err


def test_split_verb_refuses_a_word_that_is_no_action_where_none_is_implied():
    with pytest.raises(UsageError, match=r"protect: 'x' is not an action \(one of run, status\)"):
        split_verb("protect", ["x"], ("run", "status"), bare="run", other=None)
