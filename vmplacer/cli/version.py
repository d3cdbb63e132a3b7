"""`vmplacer version`."""

from __future__ import annotations

import argparse

from vmplacer import __version__
from vmplacer.cli.common import CliContext, add_format_argument, emit


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("version", help="print the version")
    add_format_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    emit(args, {"version": __version__}, lambda data: print(f"vmplacer {data['version']}"))
    return 0
