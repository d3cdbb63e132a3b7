"""Tables never cut a value: `table` fits the width it is given (a long value wrapped in its
column, or one `key: value` block per row), `wide` keeps one line per row, json and yaml carry
the same data, and `--columns` picks columns by name or refuses naming the valid ones."""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from collections import Counter
from contextlib import redirect_stdout

import pytest
import yaml

from vmplacer.cli.common import (
    MIN_COLUMN,
    add_format_argument,
    column_key,
    emit,
    fold,
    json_ready,
    plain_table,
    print_line,
    print_table,
    render_table,
    yaml_text,
)

TITLE = "placement plan for host analytics-host-frankfurt-01 (dry run)"
COLUMNS = ("guest", "host", "node(s)", "vcpupin", "emulatorpin", "memory nodes", "mode", "score")
ROWS = [
    ("analytics-warehouse-01", "analytics-host-frankfurt-01", "0-1",
     " ".join(f"{v}→{2 * v}-{2 * v + 1}" for v in range(16)), "0-7,28-35,56-63,84-91", "0-1", "interleave", "0.639"),
    ("db1", "e3", "0", "0→0 1→4 2→1 3→5", "0-1,4-5", "0", "strict", "0.800"),
    ("literal-[bold]markup[/bold]", "e3", "1", "0→13-15", "13-15", "1", "preferred", "0.742"),
]
BOX_DRAWING = re.compile("[\u2500-\u257f]")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _chars(text: str) -> Counter:
    """Every printed character but blanks and box drawing: what a reader can see of the values."""
    return Counter(c for c in BOX_DRAWING.sub("", ANSI.sub("", text)) if not c.isspace())


def _block_values(text: str) -> list[dict[str, str]]:
    """The records of the `key: value` layout, a wrapped value's lines joined again."""
    records: list[dict[str, str]] = []
    key = None
    lines = text.splitlines()
    for line in lines[lines.index(""):]:  # after the title (folded too)
        if not line:
            records.append({})
            key = None
            continue
        if not line.startswith(" "):
            key, _, value = line.partition(": ")
            records[-1][key] = value.strip()
        else:
            assert key is not None, text
            records[-1][key] += "\n" + line.strip()
    return records


@pytest.mark.parametrize("width", [200, 120, 100, 80, 60, 40, 24])
@pytest.mark.parametrize("boxed", [False, True], ids=["piped", "terminal"])
def test_a_table_fits_its_width_and_shows_every_character(width, boxed):
    text = render_table(TITLE, COLUMNS, ROWS, width=width, boxed=boxed)
    lines = ANSI.sub("", text).splitlines()
    assert max(len(line) for line in lines) <= width, text
    assert "…" not in text, text
    complete = _chars(plain_table(TITLE, COLUMNS, ROWS))
    if any(line.startswith("guest:") for line in lines):  # one block per row: each key once per row
        for row, record in zip(ROWS, _block_values(text), strict=True):
            assert list(record) == list(COLUMNS)
            for column, value in zip(COLUMNS, row):  # a wrapped value lost only the blanks it broke at
                assert re.sub(r"\s", "", record[column]) == re.sub(r"\s", "", value), (column, record[column])
    else:
        assert _chars(text) == complete, text


def test_each_layout_is_chosen_by_the_width():
    wide = render_table(TITLE, COLUMNS, ROWS, width=1000)
    assert wide == plain_table(TITLE, COLUMNS, ROWS) and len(wide.splitlines()) == 1 + 1 + len(ROWS)
    wrapped = render_table(TITLE, COLUMNS, ROWS, width=100)
    assert len(wrapped.splitlines()) > 2 + len(ROWS) and "guest:" not in wrapped
    blocks = render_table(TITLE, COLUMNS, ROWS, width=8 * MIN_COLUMN)
    assert "\nguest:" in blocks and len(_block_values(blocks)) == len(ROWS)
    boxed = render_table(TITLE, COLUMNS, ROWS[1:2], width=200, boxed=True)
    assert "┏" in boxed and len([line for line in boxed.splitlines() if "db1" in line]) == 1


def test_wide_is_one_line_per_row_whatever_the_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    text = render_table(TITLE, COLUMNS, ROWS, style="wide")
    lines = text.splitlines()
    assert len(lines) == 2 + len(ROWS)
    for line, row in zip(lines[2:], ROWS):
        assert all(value in line for value in row), line


def test_piped_without_columns_stays_one_line_per_row_and_columns_sets_a_width(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    with redirect_stdout(out):
        print_table(TITLE, COLUMNS, ROWS)
    assert out.getvalue() == plain_table(TITLE, COLUMNS, ROWS)  # what scripts and grep read
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    with redirect_stdout(out):
        print_table(TITLE, COLUMNS, ROWS)
    assert max(len(line) for line in out.getvalue().splitlines()) <= 80
    assert _chars(out.getvalue()) == _chars(plain_table(TITLE, COLUMNS, ROWS)) or "\nguest:" in out.getvalue()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_narrow_terminal_wraps_inside_the_box_and_cuts_nothing(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setenv("COLUMNS", "100")
    print_table(TITLE, COLUMNS, ROWS)
    text = ANSI.sub("", terminal.getvalue())
    assert "┏" in text and "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 100
    assert _chars(text) == _chars(plain_table(TITLE, COLUMNS, ROWS)), "markup in a value is data, kept"


def test_fold_breaks_at_blanks_and_folds_long_words():
    assert fold("0→0-1 1→2-3 2→4-5", 11) == ["0→0-1 1→2-3", "2→4-5"]
    assert fold("analytics-host-frankfurt-01", 10) == ["analytics-", "host-frank", "furt-01"]
    assert fold("two\nlines", 40) == ["two", "lines"]
    assert fold("ζζ界界", 3) == ["ζζ", "界", "界"]  # terminal cells: 界 takes two


def _parser(columns: tuple[str, ...] = COLUMNS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vmplacer plan")
    add_format_argument(parser, columns=columns)
    return parser


@pytest.mark.parametrize(("argv", "style"), [
    ((), "table"), (("-o", "wide"), "wide"), (("--output", "yaml"), "yaml"), (("--format", "json"), "json"),
    (("--format", "table"), "table"),
])
def test_output_styles_and_the_format_alias(argv, style):
    assert _parser().parse_args(list(argv)).format == style


def test_columns_are_named_as_written_or_as_keys():
    args = _parser().parse_args(["--columns", "vcpupin,guest,Memory Nodes,nodes"])
    assert args.columns == ("vcpupin", "guest", "memory nodes", "node(s)")
    assert [column_key(c) for c in COLUMNS] == ["guest", "host", "nodes", "vcpupin", "emulatorpin",
                                                "memory-nodes", "mode", "score"]


@pytest.mark.parametrize(("argv", "said"), [
    (["--columns", "guest,cpus,foo"], "unknown columns 'cpus', 'foo' (columns: guest, host, nodes, vcpupin"),
    (["--columns", "guest,,host"], "name the columns, comma-separated"),
    (["--columns", "guest", "-o", "json"], "applies to table and wide output, not to json output"),
    (["-o", "yaml", "--columns", "guest"], "applies to table and wide output, not to yaml output"),
    (["--format", "yaml"], "invalid choice: 'yaml'"),
])
def test_a_bad_selection_exits_2_naming_the_field_and_the_rule(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(argv)
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


def test_emit_selects_the_columns_of_the_command_s_table(capsys):
    args = _parser().parse_args(["--columns", "score,guest"])
    emit(args, ROWS, lambda rows: print_table(TITLE, COLUMNS, rows))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["score", "guest"] and lines[3].split() == ["0.800", "db1"]
    emit(args, ROWS, lambda rows: print_table("other", ("a", "b"), [("1", "2")]))  # another table: as it is
    assert capsys.readouterr().out.splitlines()[1].split() == ["a", "b"]


def test_yaml_is_the_json_data():
    data = {"host": None, "placements": [{"guest": "db1", "vcpupin": {"0": [0], "1": [4]}, "score": 0.8,
                                          "xml": "<domain>\n  <name>db1</name>\n</domain>\n", "at": 1795822469.66}],
            "ok": True}
    text = yaml_text(data)
    assert yaml.safe_load(text) == json.loads(json.dumps(json_ready(data)))
    assert "xml: |" in text, "a document of several lines reads as a block"
    assert text.index("host:") < text.index("placements:") < text.index("ok:"), "keys in the data's order"


def test_a_line_beside_a_table_is_held_to_the_width(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "40")
    text = "existing guest web1 on host analytics-host-frankfurt-01: floating vCPUs narrow to 0→2-3,6-7"
    print_line(text)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 1 and max(len(line) for line in lines) <= 40
    assert all(line.startswith("  ") for line in lines[1:])
    assert " ".join(line.strip() for line in lines) == text
    args = _parser().parse_args(["-o", "wide"])
    emit(args, None, lambda _data: print_line(text))
    assert capsys.readouterr().out == text + "\n"


# Every command that lists records as one table takes --columns, its headers declared once.
def _table_commands() -> list[tuple[list[str], tuple[str, ...]]]:
    from vmplacer.cli.db import HISTORY_COLUMNS, PRUNE_COLUMNS
    from vmplacer.cli.eval import MODEL_EVAL_COLUMNS, RANK_COLUMNS, REBALANCE_EVAL_COLUMNS
    from vmplacer.cli.hosts import HOSTS_COLUMNS
    from vmplacer.cli.model import MODEL_COLUMNS
    from vmplacer.cli.place import PLACED_COLUMNS, PLACEMENTS_COLUMNS
    from vmplacer.cli.plan import PLAN_COLUMNS
    from vmplacer.cli.reconcile import RECONCILE_COLUMNS
    from vmplacer.cli.token import TOKEN_COLUMNS

    return [(["plan"], PLAN_COLUMNS), (["place", "--request", "r.yaml"], PLACED_COLUMNS), (["placements"], PLACEMENTS_COLUMNS),
            (["hosts"], HOSTS_COLUMNS), (["token", "list"], TOKEN_COLUMNS), (["db", "history"], HISTORY_COLUMNS),
            (["db", "prune"], PRUNE_COLUMNS), (["model", "show"], MODEL_COLUMNS), (["reconcile"], RECONCILE_COLUMNS),
            (["eval", "model", "--pairs", "p.csv"], MODEL_EVAL_COLUMNS),
            (["eval", "rank", "--pairs", "p.csv", "--profiles", "c.csv"], RANK_COLUMNS),
            (["eval", "rebalance", "--pairs", "p.csv"], REBALANCE_EVAL_COLUMNS)]


TABLE_COMMANDS = _table_commands()


def _command_args(argv: list[str]) -> argparse.Namespace:
    from vmplacer.cli.main import build_parser

    return build_parser(argv).parse_args(argv)


@pytest.mark.parametrize(("command", "headers"), TABLE_COMMANDS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_every_table_command_selects_its_columns_by_name(command, headers):
    keys = [column_key(header) for header in headers]
    args = _command_args([*command, "--columns", ",".join(reversed(keys))])
    assert args.columns == tuple(reversed(headers))
    assert args.table_columns == headers
    assert _command_args([*command, "--columns", headers[-1]]).columns == (headers[-1],)  # as the header reads
    assert _command_args(command).columns is None


@pytest.mark.parametrize(("command", "headers"), TABLE_COMMANDS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_every_table_command_refuses_an_unknown_column_naming_the_valid_ones(command, headers, capsys):
    with pytest.raises(SystemExit) as exit_:
        _command_args([*command, "--columns", f"{column_key(headers[0])},no-such-column"])
    assert exit_.value.code == 2
    said = capsys.readouterr().err
    assert f"unknown column 'no-such-column' (columns: {', '.join(column_key(h) for h in headers)})" in said, said
    with pytest.raises(SystemExit) as exit_:
        _command_args([*command, "--columns", column_key(headers[0]), "-o", "json"])
    assert exit_.value.code == 2
    assert "applies to table and wide output, not to json output" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["hosts", "--columns", "name", "disable", "h1", "--reason", "x"],
                                  ["hosts", "--columns", "name", "enable", "h1"]])
def test_hosts_refuses_columns_where_no_table_is_printed(argv):
    from vmplacer.cli.common import CliContext, UsageError

    args = _command_args(argv)
    with pytest.raises(UsageError, match=f"--columns: applies to the hosts list, not to hosts {argv[3]}"):
        args.func(args, CliContext(config_path=None))
