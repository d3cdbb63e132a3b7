"""One rendering for every command: absent values, booleans, counts and timestamps."""

from __future__ import annotations

import io
import json
import re
import sys
from contextlib import redirect_stdout
from datetime import datetime, timedelta, timezone

import pytest

from vmplacer.cli.common import cell, json_ready, print_json, print_table
from vmplacer.core.text import excerpt, iso_utc, plural

EPOCH = 1795822469.66  # 2026-11-27T23:34:29.66Z


@pytest.mark.parametrize(("value", "shown"), [
    (None, "-"), ("", "-"), (True, "yes"), (False, "no"), (0, "0"), (1.5, "1.5"), ("web-1", "web-1"),
    (datetime(2026, 11, 27, 23, 54, 29, 123456, tzinfo=timezone.utc), "2026-11-27T23:54:29Z"),
])
def test_table_cells_have_one_spelling_per_kind(value, shown):
    assert cell(value) == shown


def test_a_table_shows_absent_and_boolean_values_alike():
    out = io.StringIO()
    with redirect_stdout(out):
        print_table("t", ("name", "reachable", "driver"), [("a", True, None), ("b", False, "")])
    text = out.getvalue()
    assert "None" not in text and "True" not in text and "False" not in text and "NO" not in text
    assert text.splitlines() == ["t", "name  reachable  driver", "a     yes        -", "b     no         -"]


BOX_DRAWING = re.compile("[\u2500-\u257f|+]")


def test_a_piped_table_is_plain_aligned_text_one_line_per_row():
    out = io.StringIO()
    with redirect_stdout(out):
        print_table("plans", ("id", "hosts", "summary"),
                    [(1, "h1 → h2", "two\nlines"), (12, "ζ-host", "x")])
    lines = out.getvalue().splitlines()
    assert not BOX_DRAWING.search(out.getvalue()), out.getvalue()
    assert lines == ["plans", "id  hosts    summary", "1   h1 → h2  two lines", "12  ζ-host   x"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_table_on_a_terminal_is_rich_s_own(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setenv("COLUMNS", "60")
    print_table("t", ("name", "reachable"), [("a", True)])
    text = terminal.getvalue()
    assert "┏" in text and "━" in text and "yes" in text, text  # rich's box, as wide as the terminal says
    assert max(len(line) for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()) <= 60


@pytest.mark.parametrize(("count", "text"), [(0, "0 guests"), (1, "1 guest"), (2, "2 guests")])
def test_counts_take_the_right_plural(count, text):
    assert plural(count, "guest") == text


def test_irregular_plural():
    assert plural(1, "die") == "1 die" and plural(3, "entry", "entries") == "3 entries"


def test_iso_utc_from_epoch_aware_and_naive_moments():
    assert iso_utc(EPOCH) == "2026-11-27T23:34:29Z"
    assert iso_utc(datetime(2026, 11, 27, 23, 54, 29)) == "2026-11-27T23:54:29Z"
    assert iso_utc(datetime(2026, 11, 28, 0, 54, 29, tzinfo=timezone(timedelta(hours=1)))) == "2026-11-27T23:54:29Z"


def test_json_timestamps_are_iso_8601_utc_wherever_they_are():
    data = {"plans": [{"id": 1, "created_at": EPOCH, "finished_at": None, "actions": 3,
                       "cancel_request": {"by": "op", "at": EPOCH}}],
            "maintenance": {"since": "2026-11-27T23:54:29.123456+00:00"},
            "started": datetime(2026, 11, 27, 23, 54, 29, tzinfo=timezone.utc),
            "count_at_most": 3, "seconds": 12.5, "reachable": True}
    ready = json_ready(data)
    assert ready["plans"][0]["created_at"] == "2026-11-27T23:34:29Z"
    assert ready["plans"][0]["finished_at"] is None
    assert ready["plans"][0]["cancel_request"]["at"] == "2026-11-27T23:34:29Z"
    assert ready["maintenance"]["since"] == "2026-11-27T23:54:29Z"
    assert ready["started"] == "2026-11-27T23:54:29Z"
    assert (ready["count_at_most"], ready["seconds"], ready["reachable"]) == (3, 12.5, True)
    out = io.StringIO()
    with redirect_stdout(out):
        print_json(data)
    assert json.loads(out.getvalue()) == ready


def test_excerpt_escapes_and_bounds_caller_text():
    assert excerpt("a\nb") == "'a\\nb'"
    long = excerpt("x" * 500, limit=10)
    assert long.startswith("'xxxxxxxxxx'") and "500 characters" in long and len(long) < 40
