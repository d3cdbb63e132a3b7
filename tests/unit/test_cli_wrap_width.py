"""`vmplacer plan --why` and `vmplacer topology` (compact and the `--cores` tree) held to the
width they are shown in: a terminal's, or $COLUMNS in a pipe (80 and 40 here), every line
within it and nothing of a value left out. Piped without $COLUMNS, the `--why` candidates are
one line each (as grep reads them, like the plan's table) and the topology keeps its 80 columns."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support import clean_env, run_vmplacer
from tests.unit.test_topology_compact import on_a_terminal

ROOT = Path(__file__).resolve().parents[2]
BIG = ROOT / "examples" / "hosts" / "xeon-2s-56c-smt2.xml"
SMALL = ROOT / "examples" / "hosts" / "xeon-e3-4c8t.xml"
WIDE = ROOT / "examples" / "hosts" / "numa16-256c.xml"
GUESTS = ("guests:\n"
          "  - {name: wide, vcpus: 16, memory_mib: 65536, cpu_policy: dedicated}\n"
          "  - {name: small, vcpus: 2, memory_mib: 2048}\n")
WIDTHS = (80, 40)


def _run(tmp_path: Path, *args: str, columns: int | None = None) -> str:
    extra = {"VMPLACER_DATA_DIR": str(tmp_path)}
    if columns is not None:
        extra["COLUMNS"] = str(columns)
    done = run_vmplacer(*args, env=clean_env(extra, drop=("VMPLACER_", "COLUMNS", "LINES")))
    assert done.returncode == 0, done.stderr
    return done.stdout


def _plan_args(tmp_path: Path) -> tuple[str, ...]:
    request = tmp_path / "guests.yaml"
    request.write_text(GUESTS)
    return ("plan", "--caps", f"big={BIG}", "--caps", f"small={SMALL}", "--request", str(request), "--why")


def _too_wide(text: str, width: int) -> list[str]:
    return [line for line in text.splitlines() if len(line) > width]


def _pins(candidate: dict) -> list[str]:
    return [f"{v}→{_cpuset(cpus)}" for v, cpus in candidate["vcpupin"].items()]


def _cpuset(cpus: list[int]) -> str:
    from vmplacer.core.topology.cpuset import format_cpuset

    return format_cpuset(cpus)


def _why(tmp_path: Path) -> dict[str, dict]:
    data = json.loads(_run(tmp_path, *_plan_args(tmp_path), "--format", "json"))
    return {entry["guest"]: entry["why"] for entry in data["placements"]}


@pytest.mark.parametrize("width", WIDTHS)
def test_why_lines_fit_columns_and_keep_every_pin_and_message(tmp_path, width):
    text = _run(tmp_path, *_plan_args(tmp_path), columns=width)
    assert _too_wide(text, width) == [], text
    tokens = text.split()
    for guest, why in _why(tmp_path).items():
        assert f"guest {guest} (model:" in " ".join(tokens)
        for candidate in why["candidates"]:
            for pin in _pins(candidate):
                assert pin in tokens, (pin, text)
    # the refused host's message, wrapped at blanks: its words all there, in order
    message = "need 16 free pCPUs, have 8"
    assert message in " ".join(tokens)


def test_why_lines_are_one_line_each_when_piped_without_columns(tmp_path):
    text = _run(tmp_path, *_plan_args(tmp_path))
    lines = text.splitlines()
    for why in _why(tmp_path).values():
        for candidate in why["candidates"]:
            pins = " ".join(_pins(candidate))
            assert any(pins in line for line in lines), (pins, text)  # one line per candidate
    assert any(line.startswith("candidates for guest wide (model: not used: a host read from a capabilities "
                               "file has no guests to predict for)") for line in lines)


def test_why_on_a_40_column_terminal_fits(tmp_path):
    text = on_a_terminal(*_plan_args(tmp_path), columns=40)
    assert _too_wide(text, 40) == [], text
    assert "candidates for guest" in text and "joined" in text


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("host", [BIG, WIDE], ids=lambda p: p.stem)
def test_the_topology_tree_fits_columns_and_only_wraps(tmp_path, host, width):
    unwrapped = _run(tmp_path, "topology", "--caps", str(host), "--cores", columns=1000)
    text = _run(tmp_path, "topology", "--caps", str(host), "--cores", columns=width)
    assert _too_wide(text, width) == [], text
    assert text.split() == unwrapped.split()  # only blanks became line breaks
    assert len(text.splitlines()) > len(unwrapped.splitlines())  # the long labels did wrap
    assert all(line == line.rstrip() for line in text.splitlines())


def test_the_topology_tree_keeps_80_columns_piped_without_columns(tmp_path):
    text = _run(tmp_path, "topology", "--caps", str(WIDE), "--cores")
    assert _too_wide(text, 80) == [] and any(len(line) > 60 for line in text.splitlines())


@pytest.mark.parametrize("width", WIDTHS)
def test_the_compact_topology_fits_columns_and_keeps_every_node(tmp_path, width):
    text = _run(tmp_path, "topology", "--caps", str(WIDE), columns=width)
    assert _too_wide(text, width) == [], text
    data = json.loads(_run(tmp_path, "topology", "--caps", str(WIDE), "--format", "json"))
    for node in data["nodes"]:
        cpus = _cpuset(node["cpus"])
        assert re.search(rf"(^|\s){re.escape(cpus)}(\s|$)", text, re.M), (cpus, text)
    # the distance matrix in blocks of whole columns: every pair's distance on a row of its own
    rows = [line for line in text.splitlines() if re.match(r"^\s*\d+:\s", line)]
    assert len(rows) % len(data["nodes"]) == 0 and all(len(line.split()) > 1 for line in rows)
    assert sum(len(line.split()) - 1 for line in rows) == len(data["nodes"]) ** 2


def test_the_compact_topology_on_a_40_column_terminal_fits():
    text = on_a_terminal("topology", "--caps", str(WIDE), columns=40)
    assert _too_wide(text, 40) == [], text
    assert "0-15,256-271" in text
