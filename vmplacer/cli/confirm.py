"""`--yes`: commands that undo or delete operator state ask first.

On a terminal the command asks a y/N question (the default is No); anywhere else (a script,
a timer, a pipe) nothing can answer, so it needs `--yes` and exits 2 without it. Either way a
command that is not confirmed changes nothing and exits 2. The question is asked after the
command's input was checked, so a typo is still reported as such, and before anything changes.
"""

from __future__ import annotations

import argparse
import sys

from vmplacer.cli.common import UsageError

YES_HELP = ("do it without asking (needed when stdin is not a terminal; on a terminal a y/N "
            "question asks first, and anything but y leaves everything as it is, exit 2)")


def add_yes_argument(parser: argparse.ArgumentParser, help_text: str = YES_HELP) -> None:
    parser.add_argument("-y", "--yes", action="store_true", help=help_text)


def confirm(args: argparse.Namespace, command: str, what: str) -> None:
    """Return when the operator confirmed `what` (e.g. "migrate the database back to 0005"):
    `--yes`, or y on a terminal. Otherwise exit 2 (UsageError) naming `--yes`; nothing changed."""
    if getattr(args, "yes", False):
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{command}: would {what}; stdin is not a terminal, so nothing can confirm it: "
                         "add --yes to do it (nothing changed)")
    sys.stderr.write(f"vmplacer: {command} will {what}. Continue? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError(f"{command}: not confirmed, nothing changed (--yes skips the question)")
