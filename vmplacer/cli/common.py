"""Shared CLI plumbing: exit codes, errors, `--format table|json` output.

Every command module exposes `register(subparsers)`; its handler takes
`(args, ctx)` and returns an exit code. Errors raised as `UsageError` exit 2
(bad input), `OperationalError` exit 1 (a host, the database, libvirt failed).
A guest that does not fit is neither: `plan` and `place` exit 3 (EXIT_NO_FIT),
having still planned or placed every guest that fits.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmplacer.core.durations import duration_seconds

EXIT_OK = 0
EXIT_OPERATIONAL = 1
EXIT_USAGE = 2
EXIT_NO_FIT = 3  # some guest fits on no host: an answer about capacity, not a failure of vmplacer


class UsageError(Exception):
    """Bad input from the operator: exit 2, message names the field."""


class OperationalError(Exception):
    """The world failed (host unreachable, database down): exit 1."""


@dataclass
class CliContext:
    """Lazily built settings and services, so `vmplacer --help` never touches a host."""

    config_path: str | None
    _settings: Any = None
    _container: Any = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def settings(self) -> Any:
        if self._settings is None:
            from vmplacer.config import ConfigError, load_settings

            try:
                self._settings = load_settings(self.config_path)
            except ConfigError as exc:
                raise UsageError(str(exc)) from exc
        return self._settings

    @property
    def container(self) -> Any:
        if self._container is None:
            from vmplacer.bootstrap import Container

            self._container = Container(self.settings)
        return self._container


def add_format_argument(parser: argparse.ArgumentParser, *, inherited: bool = False) -> None:
    """`--format table|json`. `inherited`: the parser is a sub-command's (`hosts disable`) whose parent
    takes --format too: unset here, it leaves the parent's value (`hosts --format json disable X`)."""
    parser.add_argument(
        "--format",
        choices=("table", "json"),
        default=argparse.SUPPRESS if inherited else "table",
        help="output format (default: table)",
    )


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def emit(args: argparse.Namespace, data: Any, render_table: Callable[[Any], None]) -> None:
    """Print `data` as JSON or through `render_table`, as `--format` asks."""
    if getattr(args, "format", "table") == "json":
        print_json(data)
    else:
        render_table(data)


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A rich table on a terminal, plain aligned text otherwise (stable for scripts and tests)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if value is None else str(value) for value in row))
    Console(width=200).print(table)


def resolve_host(ctx: CliContext, name: str | None, alternatives: str = "") -> str:
    """The configured host `--host NAME` names, or the first one when it is omitted."""
    known = [host.name for host in ctx.settings.hosts]
    if not known:
        hint = f", or pass {alternatives}" if alternatives else ""
        raise UsageError(f"no host configured: add one to the config file{hint}")
    if name is None:
        return known[0]
    if name not in known:
        raise UsageError(f"--host {name!r}: unknown host (configured: {', '.join(known)})")
    return name


def resolve_hosts(ctx: CliContext, names: Sequence[str] | None) -> list[str]:
    """The configured hosts a repeated `--host NAME` names (each once), or every configured host."""
    known = [host.name for host in ctx.settings.hosts]
    if not known:
        raise UsageError("no host configured: add one to the config file")
    if not names:
        return known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--host {unknown[0]!r}: unknown host (configured: {', '.join(known)})")
    return list(dict.fromkeys(names))


def parse_duration(text: str, option: str, default_unit: str, *, days: bool = False) -> float:
    """Seconds from '10ms', '2.5s', '500us', '1m', '1h' (and '30d' with `days`); a bare
    number is in `default_unit`."""
    seconds = duration_seconds(text, default_unit, days=days)
    if seconds is None:
        examples = "12h, 30d, 90m, 3600" if days else "10ms, 0.5s, 2m, 1h"
        raise UsageError(f"{option}: {text!r} is not a duration (e.g. {examples})")
    return seconds


def operator_name() -> str:
    """Who acts from this shell, as user@machine, for audit entries and plan messages."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
