"""Everything the CLI prints for a reader fits 80 columns: every command's and action's --help,
`vmplacer topology` (compact and --cores) for the shipped example hosts, and the man page as
`man` renders it in 80 columns."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import require, run_vmplacer
from vmplacer.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_HOSTS = sorted((ROOT / "examples" / "hosts").glob("*.xml"))
COLUMNS = 80


def every_parser(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """The top parser, then every command's, then every action's (`db upgrade`, `hosts disable`)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from every_parser(child, (*path, name))


def too_wide(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > COLUMNS]


def test_every_help_fits_80_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", str(COLUMNS))  # argparse wraps to it
    walked = list(every_parser(build_parser()))
    names = {" ".join(path) for path, _ in walked}
    assert {"", "db downgrade", "token revoke", "plans", "profile", "config show", "hosts disable"} <= names
    wide = {" ".join(path) or "vmplacer": too_wide(parser.format_help()) for path, parser in walked}
    assert {name: lines for name, lines in wide.items() if lines} == {}


@pytest.mark.parametrize("host", EXAMPLE_HOSTS, ids=lambda p: p.stem)
@pytest.mark.parametrize("form", [(), ("--cores",)], ids=["compact", "cores"])
def test_topology_of_every_example_host_fits_80_columns(host, form):
    done = run_vmplacer("topology", "--caps", str(host), *form)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") > 2 and too_wide(done.stdout) == [], done.stdout
    assert all(line == line.rstrip() for line in done.stdout.splitlines())
    assert done.stdout.isascii(), "piped output is plain ASCII: no box drawing or tree guides"


def test_the_man_page_rendered_by_man_fits_80_columns(tmp_path):
    require(shutil.which("man") is not None, "man (man-db) is not installed (scripts/setup.sh installs it)")
    page = run_vmplacer("manpage")
    assert page.returncode == 0, page.stderr
    source = tmp_path / "vmplacer.1"
    source.write_text(page.stdout)
    env = {**os.environ, "MANWIDTH": str(COLUMNS), "MAN_KEEP_FORMATTING": "", "LC_ALL": "C.UTF-8"}
    shown = subprocess.run(["man", "-l", str(source)], capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "db downgrade" in text and "--yes" in text, text[:2000]
    assert too_wide(text) == []
