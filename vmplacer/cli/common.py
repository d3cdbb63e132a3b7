"""Shared CLI plumbing: exit codes, errors, `-o table|wide|json|yaml` output.

Every command module exposes `register(subparsers)`; its handler takes
`(args, ctx)` and returns an exit code. Errors raised as `UsageError` exit 2
(bad input), `OperationalError` exit 1 (a host, the database, libvirt failed).
A guest that does not fit is neither: `plan` and `place` exit 3 (EXIT_NO_FIT),
having still planned or placed every guest that fits.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from vmplacer.core.durations import duration_seconds, format_seconds, is_bare_number
from vmplacer.core.text import iso_utc

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK = 0
EXIT_OPERATIONAL = 1
EXIT_USAGE = 2
EXIT_NO_FIT = 3  # some guest fits on no host: an answer about capacity, not a failure of vmplacer
# A parser attribute naming its nargs="*" positional whose words may also follow options (verbs.words_anywhere).
WORDS_ANYWHERE = "words_anywhere"


class UsageError(Exception):
    """Bad input from the operator: exit 2, message names the field."""


class OperationalError(Exception):
    """The world failed (host unreachable, database down): exit 1."""


class DatabaseError(OperationalError):
    """The database failed, or has no schema (or an older one) yet: exit 1. The message is made
    where the command's context is known (`database_problem`), never the driver's SQL dump."""

    def __init__(self, cause: Exception, doing: str = ""):
        self.cause = cause
        self.doing = doing  # e.g. "upgrade failed", put before the problem
        super().__init__(database_problem(cause, doing=doing) or str(cause).splitlines()[0])


_MISSING_SCHEMA = (
    re.compile(r"no such (table|column): ([\w.]+)"),  # SQLite
    re.compile(r"(relation|column) \"([\w.]+)\"(?: of relation \"[\w.]+\")? does not exist"),  # PostgreSQL
)


def _missing_schema_part(message: str) -> str | None:
    """'table profile_runs' when the driver says a table (or column) the schema has is not there."""
    for pattern in _MISSING_SCHEMA:
        found = pattern.search(message)
        if found:
            kind = "table" if found.group(1) == "relation" else found.group(1)
            return f"{kind} {found.group(2)}"
    return None


def _driver_message(exc: BaseException) -> str:
    """The driver's own first line (no SQL, no parameters, no background link), bounded."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    first = text.splitlines()[0] if text else exc.__class__.__name__
    first = re.sub(r"^\((?:[\w.]+)\) ", "", first)  # SQLAlchemy's "(sqlite3.OperationalError) " prefix
    return first if len(first) <= 200 else first[:200] + "…"


def database_problem(exc: BaseException, ctx: CliContext | None = None, doing: str = "") -> str | None:
    """A database that cannot be used, in one line naming what to do: no schema yet or an older
    one (`vmplacer db upgrade`), a schema revision this version does not know (a newer vmplacer
    migrated it), or the driver's own first line. None for anything that is not a database error."""
    from alembic.util.exc import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    where = "database"
    if ctx is not None and ctx._container is not None:
        try:
            where = f"database {ctx._container.database_name()}"
        except Exception:  # noqa: BLE001 - the name only decorates the message
            pass
    prefix = f"{where}: {doing}: " if doing else f"{where}: "
    if isinstance(exc, CommandError):
        return (f"{prefix}{_driver_message(exc)} (the database's schema revision is not one this vmplacer "
                "knows: a newer vmplacer may have migrated it; `vmplacer db current` shows the database's "
                "revision, `vmplacer db history` the ones this vmplacer knows)")
    if not isinstance(exc, SQLAlchemyError):
        return None
    missing = _missing_schema_part(_driver_message(exc))
    if missing is not None:
        known, current, head = _revisions(ctx)
        if not known:
            return (f"{prefix}the database's schema is missing or older than this vmplacer ({missing} is "
                    "missing): run `vmplacer db upgrade` (docs/operations.md, Upgrade)")
        if current is None:
            return (f"{prefix}the database has no schema yet ({missing} is missing): "
                    "run `vmplacer db upgrade` (docs/operations.md, Upgrade)")
        if current != head:
            return (f"{prefix}the database's schema is at revision {current}, this vmplacer needs {head} "
                    f"({missing} is missing): run `vmplacer db upgrade` (docs/operations.md, Upgrade)")
        return f"{prefix}{missing} is missing although the schema is at revision {head}: restore the backup"
    return f"{prefix}{exc.__class__.__name__}: {_driver_message(exc)}"


def _revisions(ctx: CliContext | None) -> tuple[bool, str | None, str | None]:
    """(whether the database said, its schema revision, the newest this code knows)."""
    if ctx is None or ctx._container is None:
        return False, None, None
    try:
        current, head = ctx._container.schema_revisions()
    except Exception:  # noqa: BLE001 - then the message says what to do without the revision
        return False, None, None
    return True, current, head


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


OUTPUT_STYLES = ("table", "wide", "json", "yaml")
STRUCTURED = ("json", "yaml")  # the same data for programs; table and wide are for reading
_LEGACY_FORMATS = ("table", "json")  # what --format took before -o/--output, kept as it was


def add_format_argument(parser: argparse.ArgumentParser, *, inherited: bool = False,
                        columns: Sequence[str] = (), tables: Mapping[str, Sequence[str]] | None = None,
                        command: str = "") -> None:
    """`-o/--output table|wide|json|yaml` (and `--format table|json`, as scripts wrote it before).
    `inherited`: the parser is a sub-command's (`hosts disable`) whose parent takes the option
    too: unset here, it leaves the parent's value (`hosts --format json disable X`). `columns`:
    the headers of the command's table, which `--columns` then selects from (checked at parse
    time, so a placement never runs to have its output refused). `tables`: for a command whose
    actions print different tables (`plans list`, `plans show`), each action's main table, the
    one `--columns` selects from; checked by `select_columns` once the action is known, before
    it runs; an action not named here refuses `--columns`. `command` names it in messages."""
    default = argparse.SUPPRESS if inherited else "table"
    parser.add_argument("-o", "--output", dest="format", choices=OUTPUT_STYLES, default=default,
                        action=_OutputStyle,
                        help="table: fitted to the terminal, a long value wrapped in its column (or one "
                        "record per block of `key: value` lines), never cut; wide: one line per row, "
                        "unwrapped (for grep and awk); json or yaml: the same data for programs "
                        "(default: table)")
    parser.add_argument("--format", dest="format", choices=_LEGACY_FORMATS, default=default,
                        action=_OutputStyle, help="table or json: the same as -o")
    if columns:
        parser.add_argument("--columns", metavar="A,B,...", type=_column_selection(columns),
                            default=None, action=_ColumnSelection,
                            help="the table's columns to show, in this order (table and wide output): "
                            + ", ".join(column_key(c) for c in columns))
        parser.set_defaults(table_columns=tuple(columns))
    elif tables:
        parser.add_argument("--columns", metavar="A,B,...", type=_column_names, default=None,
                            action=_ColumnSelection,
                            help="the columns of the main table to show, in this order (table and wide output; "
                            "other tables stay whole): "
                            + "; ".join(f"{action}: " + ", ".join(column_key(c) for c in headers)
                                        for action, headers in tables.items()))
        parser.set_defaults(column_tables={action: tuple(headers) for action, headers in tables.items()},
                            column_command=command or parser.prog.removeprefix("vmplacer ").strip())


class _OutputStyle(argparse.Action):
    """Stores the style; json or yaml with --columns is refused whichever came first."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values in STRUCTURED and getattr(namespace, "columns", None):
            parser.error(f"argument --columns: applies to table and wide output, not to {values} output")
        setattr(namespace, self.dest, values)


class _ColumnSelection(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        style = getattr(namespace, "format", "table")
        if style in STRUCTURED:
            parser.error(f"argument --columns: applies to table and wide output, not to {style} output")
        setattr(namespace, self.dest, values)


def column_key(header: str) -> str:
    """How an operator names a column: `memory nodes` is memory-nodes, `node(s)` nodes, `ζb p50`
    zetab-p50 (in letters a keyboard has), `#` index."""
    spelt = header.lower().replace("(s)", "s").replace("ζ", "zeta")
    return "index" if spelt == "#" else re.sub(r"[^0-9a-z]+", "-", spelt).strip("-")


def _column_selection(columns: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """An argparse `type=` reading `a,b,c` into headers of `columns`; an unknown name is refused
    with the valid ones listed (exit 2)."""
    by_key = {column_key(c): c for c in columns}

    def read(text: str) -> tuple[str, ...]:
        names = [name.strip() for name in text.split(",")]
        if not any(names) or not all(names):
            raise argparse.ArgumentTypeError(f"{text!r}: name the columns, comma-separated "
                                             f"(columns: {', '.join(by_key)})")
        unknown = [name for name in names if column_key(name) not in by_key]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown column{'s' if len(unknown) > 1 else ''} {', '.join(repr(n) for n in unknown)} "
                f"(columns: {', '.join(by_key)})")
        return tuple(dict.fromkeys(by_key[column_key(name)] for name in names))

    read.__name__ = "columns"
    return read


def _column_names(text: str) -> tuple[str, ...]:
    """`a,b,c` as names, checked against a table only once the action is known (select_columns)."""
    names = tuple(name.strip() for name in text.split(","))
    if not any(names) or not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: name the columns, comma-separated")
    return names


_column_names.__name__ = "columns"


def select_columns(args: argparse.Namespace, action: str) -> None:
    """For a command whose actions print different tables (add_format_argument's `tables`): hold
    `--columns` to the main table of `action` (exit 2 naming the option and that table's columns),
    or refuse it where `action` has no main table to select from. Call it before the action runs."""
    tables: Mapping[str, tuple[str, ...]] = getattr(args, "column_tables", None) or {}
    names = getattr(args, "columns", None)
    if not tables or names is None:
        return
    command = getattr(args, "column_command", "")
    headers = tables.get(action)
    if headers is None:
        takers = ", ".join(f"`{command} {name}`" for name in tables)
        raise UsageError(f"argument --columns: `{command} {action}` prints no single main table to choose "
                         f"columns of (--columns applies to {takers})")
    by_key = {column_key(c): c for c in headers}
    unknown = [name for name in names if column_key(name) not in by_key]
    if unknown:
        raise UsageError(f"argument --columns: unknown column{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(repr(n) for n in unknown)} for `{command} {action}` "
                         f"(columns: {', '.join(by_key)})")
    args.columns = tuple(dict.fromkeys(by_key[column_key(name)] for name in names))
    args.table_columns = headers


def structured(args: argparse.Namespace) -> bool:
    """Whether the output is data for a program (json, yaml) rather than text to read."""
    return getattr(args, "format", "table") in STRUCTURED


# Keys whose values are moments: epoch seconds (as the stores keep them) or datetimes become ISO 8601.
_MOMENT_KEYS = frozenset({"at", "since", "until", "now"})
ABSENT = "-"


def _is_moment_key(key: Any) -> bool:
    return isinstance(key, str) and (key in _MOMENT_KEYS or key.endswith("_at"))


def _moment(value: Any) -> Any:
    """A timestamp value as ISO 8601 UTC; anything that is not one stays as it is."""
    if isinstance(value, datetime):
        return iso_utc(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return iso_utc(value)
    if isinstance(value, str):
        try:
            return iso_utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            return value
    return value


def json_ready(data: Any) -> Any:
    """`data` with every timestamp as ISO 8601 UTC (`2026-11-27T23:54:29Z`): the stores keep
    epoch seconds or datetimes, and a script reading any command's JSON gets one spelling."""
    if isinstance(data, dict):
        return {key: _moment(value) if _is_moment_key(key) and value is not None else json_ready(value)
                for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_ready(value) for value in data]
    if isinstance(data, datetime):
        return iso_utc(data)
    return data


def print_json(data: Any) -> None:
    json.dump(json_ready(data), sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def yaml_text(data: Any) -> str:
    """`data` in YAML, exactly what the JSON says (the same values: through JSON first)."""
    import yaml

    class BlockDumper(yaml.SafeDumper):
        """safe_dump's, with text of several lines (a domain's XML) as a `|` block."""

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    BlockDumper.add_representer(str, text)
    plain = json.loads(json.dumps(json_ready(data), sort_keys=False, default=str))
    return yaml.dump(plain, Dumper=BlockDumper, sort_keys=False, allow_unicode=True, default_flow_style=False)


def print_yaml(data: Any) -> None:
    sys.stdout.write(yaml_text(data))


@dataclass(frozen=True)
class _Rendering:
    """How print_table lays out the tables a command prints: the style, and the columns
    `--columns` chose of the command's own table (`declared`: its headers)."""

    style: str = "table"
    declared: tuple[str, ...] = ()
    chosen: tuple[str, ...] | None = None


_rendering: ContextVar[_Rendering] = ContextVar("vmplacer_rendering", default=_Rendering())


def emit(args: argparse.Namespace, data: Any, render_table: Callable[[Any], None]) -> None:
    """Print `data` as JSON or YAML, or through `render_table` (table or wide), as -o asks."""
    style = getattr(args, "format", "table")
    if style == "json":
        print_json(data)
    elif style == "yaml":
        print_yaml(data)
    else:
        chosen = getattr(args, "columns", None)
        if chosen and getattr(args, "column_tables", None) and not getattr(args, "table_columns", None):
            raise RuntimeError("--columns of a command of several tables was not checked (select_columns)")
        token = _rendering.set(_Rendering(style, tuple(getattr(args, "table_columns", ()) or ()), chosen))
        try:
            render_table(data)
        finally:
            _rendering.reset(token)


PIPED_WIDTH = 1000  # columns of a table written to a pipe or file: never wrapped, unless $COLUMNS says


def console() -> Console:
    """Where tables and trees go: a terminal as wide as it is, with box drawing; a pipe or a
    file as plain ASCII, not wrapped, without colour (what scripts, grep and logs want)."""
    import os

    from rich.console import Console

    if sys.stdout.isatty():
        return Console(highlight=False)
    columns = os.environ.get("COLUMNS", "")
    return Console(width=int(columns) if columns.isdigit() and int(columns) > 0 else PIPED_WIDTH,
                   highlight=False, color_system=None, emoji=False)


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A table, as the output style asks: `table` fits the terminal (a long value
    wraps inside its column, or the table becomes one `key: value` block per row), and never cuts
    a value; piped or into a file it is plain aligned text, one line per row, unless $COLUMNS
    gives a width to fit; `wide` is always plain aligned text, one line per row."""
    rendering = _rendering.get()
    if rendering.chosen and tuple(columns) == rendering.declared:
        picked = [list(columns).index(name) for name in rendering.chosen]
        columns = [columns[i] for i in picked]
        rows = [[row[i] for i in picked] for row in rows]
    cells = [[cell(value) for value in row] for row in rows]
    sys.stdout.write(render_table(title, columns, cells, style=rendering.style))


def plain_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The text of a table without box drawing: each column as wide as its widest cell (in
    terminal cells: `→` and `ζ` are one, wide characters two), two spaces apart, no trailing
    blanks; a line break inside a cell becomes a space so that a row stays one line."""
    from rich.cells import cell_len

    lines = [[" ".join(str(text).splitlines()) for text in line] for line in (list(columns), *rows)]
    widths = [max(cell_len(line[i]) if i < len(line) else 0 for line in lines) for i in range(len(columns))]
    out = [title] if title else []
    for line in lines:
        padded = [text + " " * (widths[i] - cell_len(text)) for i, text in enumerate(line)]
        out.append("  ".join(padded).rstrip())
    return "\n".join(out) + "\n"


MIN_COLUMN = 8  # cells narrower than this fold too often to read: then one block per record
NEARLY = 4  # a column this few cells short of its widest cell is given them before the others share


def fit_width() -> int | None:
    """The width a `table` must fit: the terminal's; piped or into a file, $COLUMNS when it is
    set (`COLUMNS=80 vmplacer plan | less`), else none (one line per row, as scripts read it)."""
    import os

    if sys.stdout.isatty():
        return console().width
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def render_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]], *,
                 style: str = "table", width: int | None = None, boxed: bool | None = None) -> str:
    """The text of a table in `style`. `wide`, or `table` with no width to fit: plain aligned
    text, one line per row. `table` in `width` columns (default: fit_width), the first layout
    that fits: as it is; each column at least MIN_COLUMN wide (or its widest cell) with long
    values wrapped, a word longer than its column folded, and rows set apart; one `key: value`
    block per row. No character of a value is ever left out: only the blanks where a value
    wraps become line breaks. `boxed` (default: on a terminal): rich's box drawing, as long as
    the table fits with it; else columns two blanks apart, as piped."""
    if style == "wide":
        return plain_table(title, columns, rows)
    width = fit_width() if width is None else width
    if width is None:
        return plain_table(title, columns, rows)
    boxed = sys.stdout.isatty() if boxed is None else boxed
    full = [max([_widest_line(text) for text in (header, *(row[i] for row in rows))])
            for i, header in enumerate(columns)]
    # wrapping, a header may take two lines: its longest word is what it needs
    natural = [max([_widest_line(text) for text in (*header.split(), *(row[i] for row in rows))])
               for i, header in enumerate(columns)]
    least = [min(w, MIN_COLUMN) for w in natural]
    box_frame = 3 * len(columns) + 1  # a padding blank either side of each cell, a rule between and around
    gaps = 2 * (len(columns) - 1)  # unboxed: two blanks between columns
    if boxed and sum(full) + box_frame <= width:
        return _rich_table(title, columns, rows, width, full, boxed=True, wrapped=False)
    if boxed and sum(least) + box_frame <= width:
        return _rich_table(title, columns, rows, width, _shares(natural, least, width - box_frame), boxed=True,
                           wrapped=True)
    if sum(full) + gaps <= width:
        return plain_table(title, columns, rows)
    if sum(least) + gaps <= width:
        return _rich_table(title, columns, rows, width, _shares(natural, least, width - gaps),
                           boxed=False, wrapped=True)
    return record_blocks(title, columns, rows, width)


def _shares(natural: Sequence[int], least: Sequence[int], room: int) -> list[int]:
    """Each column's width: its least; then the columns a few cells short of their widest cell
    whole (`preferred` is not worth folding); then of the room left a share in proportion to
    what each still lacks (a column never gets more than it needs)."""
    widths = list(least)
    left = room - sum(widths)
    for i in sorted(range(len(widths)), key=lambda i: natural[i] - widths[i]):
        lack = natural[i] - widths[i]
        if 0 < lack <= NEARLY and lack <= left:
            widths[i] += lack
            left -= lack
    lacking = [n - w for n, w in zip(natural, widths)]
    total = sum(lacking)
    if total <= 0 or left <= 0:
        return widths
    for i, lack in enumerate(lacking):
        widths[i] += min(lack, left * lack // total)
    left = room - sum(widths)
    for i in sorted(range(len(widths)), key=lambda i: widths[i] - natural[i]):  # most lacking first
        grant = min(natural[i] - widths[i], left)
        widths[i] += grant
        left -= grant
    return widths


def _widest_line(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in str(text).splitlines()), default=0)


def _rich_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]], width: int,
                widths: Sequence[int], *, boxed: bool, wrapped: bool) -> str:
    """rich's table in `width` columns, each column as wide as `widths` says, every cell
    folded rather than cut (overflow="fold").
    Boxed, a rule between rows when cells wrap; unboxed, a blank line: a row's lines read as one."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    out = io.StringIO()
    # markup off: a value is data, never `[bold]`; on a terminal the colours the terminal says it has
    target = Console(file=out, width=width, highlight=False, emoji=False, markup=False, force_terminal=boxed,
                     color_system="auto" if boxed else None, legacy_windows=False)
    if boxed:
        table = Table(title=title, box=box.HEAVY_HEAD, show_lines=wrapped)
    else:
        table = Table(title=title, box=None, pad_edge=False, padding=(0, 1), show_header=True,
                      title_justify="left", header_style=None, title_style=None)
    for header, column_width in zip(columns, widths):
        table.add_column(header, overflow="fold", no_wrap=False, width=column_width)
    for number, row in enumerate(rows):
        if number and wrapped and not boxed:
            table.add_row(*("" for _ in columns))
        table.add_row(*row)
    target.print(table)
    text = out.getvalue()
    return text if boxed else "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def print_line(text: str) -> None:
    """A line of text beside a table, held to the width the table fits (`table` style: wrapped
    at blanks, the rest of it indented two more than the line); as it is in `wide` style or with
    no width to fit."""
    from rich.cells import cell_len

    width = fit_width() if _rendering.get().style == "table" else None
    if width is None or cell_len(text) <= width:
        print(text)
        return
    words = text.lstrip(" ")
    lead = " " * min(len(text) - len(words), max(width - MIN_COLUMN, 0))
    indent = " " * min(len(lead) + 2, max(width - MIN_COLUMN, 0))
    first = fold(words, width - len(lead))[0]
    rest = fold(words[len(first):].lstrip(" "), max(width - len(indent), MIN_COLUMN))
    print(lead + f"\n{indent}".join([first, *rest]))


def record_blocks(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> str:
    """One block per row, `key: value` lines with the keys aligned, a blank line between
    blocks: what a table too wide for `width` becomes. A value longer than its line wraps onto
    lines indented under it (folded inside a word longer than the line)."""
    from rich.cells import cell_len

    key_width = max(cell_len(header) for header in columns) + 2
    room = max(width - key_width, MIN_COLUMN)
    out = fold(title, width) if title else []
    for number, row in enumerate(rows):
        if number or title:
            out.append("")
        for header, value in zip(columns, row):
            lines = fold(str(value), room) or [""]
            out.append(f"{header}:".ljust(key_width - cell_len(header) + len(header)) + lines[0])
            out.extend((" " * key_width + line).rstrip() for line in lines[1:])
    return "\n".join(line.rstrip() for line in out) + "\n"


def fold(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` terminal cells: broken at blanks where it can be, a
    word longer than a line folded across lines; a line break in `text` stays one."""
    from rich.cells import cell_len

    lines: list[str] = []
    for paragraph in text.splitlines() or [""]:
        line = ""
        for word in paragraph.split(" "):
            joined = f"{line} {word}" if line else word
            if cell_len(joined) <= width:
                line = joined
                continue
            if line:
                lines.append(line)
            line = ""
            for char in word:  # a word longer than the line: folded, never cut
                if cell_len(line + char) > width:
                    lines.append(line)
                    line = ""
                line += char
        lines.append(line)
    return lines


def cell(value: Any) -> str:
    """One spelling per kind of value in every table: absent (None or empty) is '-', a boolean
    yes/no, a moment ISO 8601 UTC; the rest as str() writes it."""
    if value is None or value == "":
        return ABSENT
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return iso_utc(value)
    return str(value)


# What a command that acts on hosts takes without --host or --all-hosts, as its --help says it.
HOST_DEFAULTS = {
    "first": "the first configured host",
    "all": "every configured host",
    "required": "none, --host is required",
}


def add_host_selection(parser: argparse.ArgumentParser, *, default: str, verb: str = "act on",
                       repeatable: bool = True, all_hosts: bool = True, default_note: str = "",
                       host_note: str = "") -> argparse._MutuallyExclusiveGroup:
    """The one way a command names the hosts it acts on: `--host NAME` (repeatable where several
    hosts make sense) or `--all-hosts` (also spelled `--all`, as before), never both. `default`
    (a key of HOST_DEFAULTS) is what the command takes without either, said in the help of both
    options; `default_note` says why, or what differs by mode; `host_note` adds to --host's help. The group is returned so a command
    can add other, exclusive sources of hosts (`--caps`)."""
    said = HOST_DEFAULTS[default] + (f" ({default_note})" if default_note else "")
    neither = "without --host or --all-hosts" if all_hosts else "without --host"
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--host", metavar="NAME", action="append" if repeatable else "store",
                       help=f"{verb} this configured host{' (repeatable)' if repeatable else ''}{host_note}; "
                            f"{neither}: {said}")
    if all_hosts:
        group.add_argument("--all-hosts", "--all", dest="all", action="store_true",
                           help=f"{verb} every configured host ({neither}: {HOST_DEFAULTS[default]})")
    return group


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


DURATION_EXAMPLES = "500us, 10ms, 2.5s, 10m, 1h"
_UNIT_NAMES = {"s": "seconds", "ms": "milliseconds"}


def _duration_or_problem(text: str, default_unit: str | None, days: bool) -> float | str:
    """Seconds, or what is wrong with `text` (without the option's name)."""
    seconds = duration_seconds(text, default_unit, days=days)
    if seconds is not None:
        return seconds
    if default_unit is None and is_bare_number(text):
        number = str(text).strip()
        if days:  # an age: 30 alone reads as days to a person and as seconds to a program
            return (f"{text!r} has no unit: write one of s, m, h, d, e.g. {number}d or {number}h (a bare "
                    "number is refused here: read as seconds it would keep almost nothing)")
        return (f"{text!r} has no unit: write one, e.g. {number}ms or {number}s (a bare number is refused "
                "here: it meant milliseconds before; read as seconds it would be 1000 times longer)")
    examples = ("12h, 30d, 90m, " + ("3600s" if default_unit is None else "3600")) if days else DURATION_EXAMPLES
    bare = f"; a bare number is {_UNIT_NAMES.get(default_unit, default_unit)}" if default_unit else "; a unit is required"
    return f"{text!r} is not a duration (e.g. {examples}{bare})"


def parse_duration(text: str, option: str, default_unit: str | None = "s", *, days: bool = False) -> float:
    """Seconds from '500us', '10ms', '2.5s', '10m', '1h' (and '30d' with `days`); a bare number is
    in `default_unit`, or refused when that is None (freeze lengths: 10 once meant 10 ms there)."""
    seconds = _duration_or_problem(text, default_unit, days)
    if isinstance(seconds, str):
        raise UsageError(f"{option}: {seconds}")
    return seconds


def duration(*, unit: str | None = "s", days: bool = False, zero: str | None = None,
             low: float | None = None, high: float | None = None) -> Callable[[str], float]:
    """An argparse `type=` for a duration option, so every one reads the same grammar (parse_duration)
    and fails alike: exit 2, "argument --FLAG: ..." with examples. Seconds come out. The value must be
    longer than 0 unless `zero` says what 0 means ("never"), and within `low`..`high` seconds.

    Give such an option a number (or None) as its default, never text: `option_given` compares
    the value with the default."""
    def read(text: str) -> float:
        seconds = _duration_or_problem(text, unit, days)
        if isinstance(seconds, str):
            raise argparse.ArgumentTypeError(seconds)
        if seconds == 0 and zero is not None:
            return seconds
        problem = _range_problem(seconds, low, high, zero)
        if problem:
            raise argparse.ArgumentTypeError(f"{problem}, got {text!r}")
        return seconds

    read.__name__ = "duration"
    return read


def _range_problem(seconds: float, low: float | None, high: float | None, zero: str | None) -> str | None:
    also = f" (or 0: {zero})" if zero is not None else ""
    if low is not None and high is not None and not low <= seconds <= high:
        return f"must be {format_seconds(low)}..{format_seconds(high)}{also}"
    if low is not None and seconds < low:
        return f"must be at least {format_seconds(low)}{also}"
    if high is not None and seconds > high:
        return f"must be at most {format_seconds(high)}{also}"
    if seconds <= 0:
        return f"must be longer than 0{also}"
    return None


def count(low: int = 0, high: int | None = None, *, zero: str | None = None) -> Callable[[str], int]:
    """An argparse `type=` for a whole number held to `low`..`high` (`zero`: what 0 means, for the
    message), so a range is refused at parse time naming the option and the rule."""
    def read(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low or (high is not None and value > high):
            meaning = f" ({zero} at 0)" if zero else ""
            rule = f"{low}..{high}" if high is not None else ("at least " + str(low))
            raise argparse.ArgumentTypeError(f"must be {rule}{meaning}, got {value}")
        return value

    read.__name__ = "count"
    return read


def option_given(args: argparse.Namespace, dest: str) -> bool:
    """Whether the operator set option `dest`: written on the command line (at its default value
    too: `protect status --samples 5` asks for something status never does), or its value
    differs from its parser's default (main records the chosen command's parser as
    `command_parser`), or without a parser at hand, differs from 'not set' (None, False, [])."""
    value = getattr(args, dest, None)
    parser = getattr(args, "command_parser", None)
    if parser is not None:
        return _written(parser, dest) or value != parser.get_default(dest)
    return value not in (None, False, [])


def _written(parser: argparse.ArgumentParser, dest: str) -> bool:
    """Whether a flag of `dest` is among the words the parser was given (`--flag`, `--flag=V`, a
    prefix argparse accepts, `-x` alone or bundled), before any `--`."""
    flags = {flag for action in parser._actions if action.dest == dest for flag in action.option_strings}
    if not flags:
        return False
    long_options = [flag for flag in parser._option_string_actions if flag.startswith("--")]
    for word in getattr(parser, "_words", ()):
        if word == "--":
            return False
        if word.startswith("--"):
            written = word.split("=", 1)[0]
            matches = [flag for flag in long_options if flag.startswith(written)]
            if written in flags or (len(matches) == 1 and matches[0] in flags):
                return True
        elif word.startswith("-") and word[:2] in flags:
            return True
    return False


def option_flag(args: argparse.Namespace, dest: str) -> str:
    """The flag of `dest` as the operator wrote it (`--no-X` for a boolean option turned off)."""
    flag = dest.replace("_", "-")
    return f"--no-{flag}" if getattr(args, dest, None) is False else f"--{flag}"


def refuse_options(args: argparse.Namespace, dests: Iterable[str], why: str) -> None:
    """Exit 2 naming the first option of `dests` the operator set although the chosen mode never
    reads it: ignored silently, it would look as if it had acted. `why` follows the flag, e.g.
    "applies to rebalancing plans (plan --rebalance), not to plan --request"."""
    for dest in dests:
        if option_given(args, dest):
            raise UsageError(f"{option_flag(args, dest)}: {why}")


def operator_name() -> str:
    """Who acts from this shell, as user@machine, for audit entries and plan messages."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
