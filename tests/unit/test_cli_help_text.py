"""Every command, sub-command, option and positional of `vmplacer` says what it is in --help."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from vmplacer.cli.main import build_parser

# Hidden on purpose: older spellings kept for scripts, each with a successor that --help shows.
HIDDEN = {("vmplacer protect", "--t-m-ms")}


def _walk(parser: argparse.ArgumentParser) -> Iterator[tuple[argparse.ArgumentParser, argparse.Action]]:
    for action in parser._actions:
        yield parser, action
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield from _walk(child)


def _name(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else (action.metavar or action.dest)


def test_every_action_of_every_parser_has_help_text():
    missing, hidden = [], []
    for parser, action in _walk(build_parser()):
        where = (parser.prog, _name(action))
        if action.help == argparse.SUPPRESS:
            if where not in HIDDEN:
                hidden.append(where)
        elif not (action.help or "").strip():
            missing.append(where)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if not (choice.help or "").strip():
                    missing.append((parser.prog, choice.dest))
    assert not missing, f"no help text: {missing}"
    assert not hidden, f"hidden from --help (add to HIDDEN only for an older spelling): {hidden}"


def test_the_walk_reaches_every_depth():
    progs = {parser.prog for parser, _action in _walk(build_parser())}
    assert {"vmplacer", "vmplacer plans", "vmplacer hosts disable", "vmplacer db upgrade"} <= progs


def test_top_help_lists_every_command_once_in_a_group():
    from vmplacer.cli.main import COMMAND_GROUPS, COMMANDS

    grouped = [name for _title, names in COMMAND_GROUPS for name in names]
    assert sorted(grouped) == sorted(COMMANDS)
    text = build_parser([]).format_help()
    for title, names in COMMAND_GROUPS:
        section = text[text.index(f"\n{title}:\n"):]
        section = section[:section.index("\n\n")]
        assert [line.split()[0] for line in section.splitlines()[2:] if line.startswith("  ") and
                not line.startswith("   ")] == list(names)
