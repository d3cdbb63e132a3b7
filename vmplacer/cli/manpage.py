"""`vmplacer manpage`: the vmplacer(1) manual page in roff, generated from the parser tree.

    vmplacer manpage > /usr/local/share/man/man1/vmplacer.1

Every command, sub-command and option with its help text, as `--help` gives them, so the page
never disagrees with this version; the systemd units name it (`Documentation=man:vmplacer(1)`).
"""

from __future__ import annotations

import argparse
import re

from vmplacer.cli.common import CliContext

SEE_ALSO_DOCS = ("operations.md", "placement.md", "rebalance.md", "protect.md", "profiler.md", "api.md")
USAGE_WIDTH = 72  # a usage block is printed as is (.nf): narrow enough for an 80-column man
DOCS_DIR = "/usr/share/doc/vmplacer"  # where docs/operations.md's Install copies the shipped docs
ENVIRONMENT = (
    ("VMPLACER_CONFIG", "the config file when --config is not given"),
    ("VMPLACER_LOG_FORMAT", "text or json: the log format when --log-format is not given"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "manpage", help="print the vmplacer(1) manual page (roff), generated from this version's commands",
        description="Print the vmplacer(1) manual page in roff: every command and option of this version. "
                    "Install it with `vmplacer manpage > /usr/local/share/man/man1/vmplacer.1`.")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.cli.main import build_parser

    print(manual_page(build_parser()), end="")
    return 0


def roff(text: str) -> str:
    """Plain text as roff body text: backslashes and hyphens escaped, no line starting a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    lines = [("\\&" + line) if line.startswith((".", "'")) else line for line in text.splitlines()]
    return "\n".join(lines)


def _flags(action: argparse.Action) -> str:
    value = ""
    if action.nargs != 0:
        metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                     else action.dest.upper())
        value = f" \\fI{roff(str(metavar if not isinstance(metavar, tuple) else ' '.join(metavar)))}\\fR"
    return ", ".join(f"\\fB{roff(flag)}\\fR" for flag in action.option_strings) + value


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {"default": action.default, "prog": "vmplacer", "choices": action.choices}
    return roff(re.sub(r"\s+", " ", text).strip())


def _options(parser: argparse.ArgumentParser, *, globals_too: bool) -> list[str]:
    from vmplacer.cli.global_options import GROUP_TITLE

    lines: list[str] = []
    for group in parser._action_groups:
        if group.title == GROUP_TITLE and not globals_too:
            continue
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS or isinstance(action, (argparse._SubParsersAction,
                                                                       argparse._HelpAction)):
                continue
            label = _flags(action) if action.option_strings else f"\\fI{roff(action.metavar or action.dest)}\\fR"
            lines += [".TP", label, _help(action) or "(no help text)"]
    return lines


def _children(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, help line) of each sub-command, each parser once (an alias shares its parser)."""
    found: list[tuple[str, argparse.ArgumentParser, str]] = []
    seen: set[int] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, child in action.choices.items():
                if id(child) not in seen:
                    seen.add(id(child))
                    found.append((name, child, helps.get(name, "")))
    return found


def _command_section(path: str, parser: argparse.ArgumentParser, help_line: str) -> list[str]:
    lines = [f'.SS "{roff(path)}"']
    if parser.description or help_line:
        lines.append(roff(re.sub(r"\s+", " ", parser.description or help_line).strip()))
    formatter = argparse.HelpFormatter(prog=parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    lines += [".PP", ".nf", roff(formatter.format_help().strip("\n")), ".fi"]
    lines += _options(parser, globals_too=False)
    for name, child, child_help in _children(parser):
        lines += _command_section(f"{path} {name}", child, child_help)
    return lines


def manual_page(parser: argparse.ArgumentParser) -> str:
    """The whole page: NAME, SYNOPSIS, DESCRIPTION, GLOBAL OPTIONS, COMMANDS (in --help's order),
    EXIT STATUS, ENVIRONMENT, SEE ALSO."""
    from vmplacer import __version__
    from vmplacer.cli.main import COMMAND_GROUPS

    commands = {name: (child, help_line) for name, child, help_line in _children(parser)}
    lines = [
        f'.TH VMPLACER 1 "" "vmplacer {roff(__version__)}" "User Commands"',
        ".SH NAME",
        "vmplacer \\- " + roff((parser.description or "").rstrip(".")),
        ".SH SYNOPSIS",
        ".B vmplacer",
        "[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIACTION\\fR] [\\fIARGUMENTS\\fR] [\\fIOPTIONS\\fR]",
        ".SH DESCRIPTION",
        roff(parser.description or ""),
        "The global options may come before or after the command. "
        + roff("`vmplacer COMMAND --help` shows a command's options, as this page does."),
        ".SH GLOBAL OPTIONS",
        *_options(parser, globals_too=True),
        ".SH COMMANDS",
    ]
    for title, names in COMMAND_GROUPS:
        lines.append(f'.SS "{roff(title.upper())}"')
        lines.append(", ".join(f"\\fB{roff(name)}\\fR" for name in names if name in commands))
        for name in names:
            if name in commands:
                lines += _command_section(f"vmplacer {name}", *commands[name])
    lines += [
        ".SH EXIT STATUS",
        ".TP", "0", "success",
        ".TP", "1", roff("a host, libvirt or the database failed"),
        ".TP", "2", roff("bad usage: the message names the option or value and the rule"),
        ".TP", "3", roff("a guest fits on no host (plan, place)"),
        ".SH ENVIRONMENT",
    ]
    for name, meaning in ENVIRONMENT:
        lines += [".TP", f"\\fB{name}\\fR", roff(meaning)]
    lines += [".SH SEE ALSO", roff(", ".join(f"{DOCS_DIR}/{name}" for name in SEE_ALSO_DOCS))]
    return "\n".join(lines) + "\n"
