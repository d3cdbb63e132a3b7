"""One convention for the hosts a command acts on: `--host NAME` / `--all-hosts` (`--all` as
before), never both, and every command's --help says what it takes without either."""

from __future__ import annotations

import argparse

import pytest

from vmplacer.cli.common import HOST_DEFAULTS
from vmplacer.cli.global_options import command_parsers
from vmplacer.cli.main import build_parser, main

# Each command acting on hosts, and what it takes without --host / --all-hosts.
DEFAULTS = {
    "vmplacer plan": "first", "vmplacer place": "first", "vmplacer topology": "first", "vmplacer profile": "first",
    "vmplacer rebalance": "all", "vmplacer reconcile": "all", "vmplacer placements": "all",
    "vmplacer protect": "required",
}
# Where several hosts are one run: --host repeats and --all-hosts exists.
FLEET = {"vmplacer plan", "vmplacer place", "vmplacer rebalance", "vmplacer reconcile"}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return parser._option_string_actions


def _host_parsers() -> dict[str, argparse.ArgumentParser]:
    return {p.prog: p for p in command_parsers(build_parser()) if "--host" in _options(p)}


def test_the_commands_acting_on_hosts_are_the_ones_listed():
    assert set(_host_parsers()) == set(DEFAULTS)


@pytest.mark.parametrize("prog", sorted(DEFAULTS))
def test_host_help_says_the_default(prog):
    parser = _host_parsers()[prog]
    assert HOST_DEFAULTS[DEFAULTS[prog]] in _options(parser)["--host"].help
    if "--all-hosts" in _options(parser):
        assert HOST_DEFAULTS[DEFAULTS[prog]] in _options(parser)["--all-hosts"].help


@pytest.mark.parametrize("prog", sorted(FLEET))
def test_fleet_commands_repeat_host_and_spell_all_hosts_both_ways(prog):
    options = _options(_host_parsers()[prog])
    assert options["--host"].nargs is None and isinstance(options["--host"], argparse._AppendAction)
    assert options["--all-hosts"] is options["--all"]


@pytest.mark.parametrize("command", ["plan", "place", "rebalance", "reconcile", "placements"])
def test_all_hosts_and_all_read_alike(command):
    extra = ["--request", "r.yaml"] if command in ("plan", "place") else []
    for spelling in ("--all-hosts", "--all"):
        argv = [command, *extra, spelling]
        args = build_parser(argv).parse_args(argv)
        assert args.all is True and not args.host


@pytest.mark.parametrize("argv", [
    ["reconcile", "--host", "a", "--all-hosts"],
    ["plan", "--request", "r.yaml", "--all", "--host", "a"],
    ["placements", "--all-hosts", "--host", "a"],
])
def test_host_and_all_hosts_together_exit_2_naming_both(capsys, argv):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "not allowed with argument" in err and "--host" in err


def test_repeated_host_keeps_every_name():
    argv = ["rebalance", "--host", "a", "--host", "b"]
    assert build_parser(argv).parse_args(argv).host == ["a", "b"]
