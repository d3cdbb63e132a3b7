"""Global options read the same before and after the command, at every depth of the grammar."""

from __future__ import annotations

import pytest

from vmplacer.cli.global_options import GLOBAL_OPTIONS, command_parsers
from vmplacer.cli.main import build_parser, command_in, main


def parse(*argv: str):
    return build_parser(list(argv)).parse_args(list(argv))


@pytest.mark.parametrize("argv", [
    ("--config", "c.yaml", "hosts"),
    ("hosts", "--config", "c.yaml"),
    ("hosts", "--config=c.yaml"),
    ("hosts", "disable", "h1", "--reason", "r", "--config", "c.yaml"),
    ("db", "upgrade", "--config", "c.yaml"),
    ("config", "check", "--config", "c.yaml"),
    ("plan", "--request", "r.yaml", "--config", "c.yaml"),
    ("plans", "cancel", "3", "--config", "c.yaml"),
])
def test_config_is_read_before_and_after_the_command(argv):
    assert parse(*argv).config == "c.yaml"


def test_after_the_command_wins_over_before():
    assert parse("--config", "before.yaml", "hosts", "--config", "after.yaml").config == "after.yaml"
    assert parse("--config", "before.yaml", "hosts", "disable", "h1", "--reason", "r",
                 "--config", "after.yaml").config == "after.yaml"


def test_unset_after_the_command_keeps_the_value_before_it():
    args = parse("--config", "before.yaml", "-vv", "hosts", "enable", "h1")
    assert (args.config, args.verbose) == ("before.yaml", 2)


def test_neither_gives_the_defaults():
    args = parse("hosts")
    assert (args.config, args.verbose) == (None, 0)


@pytest.mark.parametrize("argv, verbose", [
    (("-v", "hosts"), 1),
    (("hosts", "-v"), 1),
    (("hosts", "-vv"), 2),
    (("reconcile", "--verbose", "--dry-run"), 1),
    (("-vvv", "hosts", "-v"), 4),  # before and after add up
    (("-v", "hosts", "-v", "disable", "h1", "--reason", "r", "-v"), 3),  # at every depth
    (("--verbose", "plans", "cancel", "3", "-vv"), 3),
])
def test_verbose_counts_before_and_after_the_command(argv, verbose):
    assert parse(*argv).verbose == verbose


def test_version_after_the_command_prints_it_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("vmplacer ")


def test_every_parser_of_the_tree_takes_every_global_option():
    parser = build_parser()
    flags = {flag for option in GLOBAL_OPTIONS for flag in option.flags}
    children = command_parsers(parser)
    assert len(children) > 20  # commands and their sub-commands: the walk reaches below the top
    for child in children:
        missing = flags - set(child._option_string_actions)
        assert not missing, f"{child.prog}: no {', '.join(sorted(missing))}"


def test_the_command_is_found_after_global_options_that_take_values():
    assert command_in(["--config", "hosts", "plan", "--config", "x"]) == "plan"
    assert command_in(["-v", "--config=plan", "hosts"]) == "hosts"


def test_an_unknown_global_option_after_the_command_is_still_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["reconcile", "--confg-file", "x"])
    assert exited.value.code == 2
    assert "--confg-file" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (("hosts", "--typo", "x"), "--typo"),
    (("hosts", "-q", "x"), "-q"),
    (("--typo", "x"), "--typo"),
])
def test_an_unknown_option_before_a_word_is_named_not_the_word(capsys, argv, flag):
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {flag}" in err and "invalid choice" not in err, err


def test_a_wrong_action_word_alone_is_still_named(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["hosts", "bogus"])
    assert exited.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err
