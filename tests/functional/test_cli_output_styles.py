"""`-o table|wide|json|yaml` and `--columns` through the real console script: on an 80-column
terminal (a real pseudo-terminal, and $COLUMNS=80 into a pipe) the placement table shows every
character of every value within 80 columns; `wide` keeps one complete line per guest; yaml is
the JSON's data; `--format json` answers as before; a bad `--columns` exits 2 naming the valid
columns. Host: libvirt's test driver with a two-socket, 112-pCPU machine's capabilities and a
long host name; request: examples/requests/mixed.yaml (guests of 2 to 24 vCPUs)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import termios
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.support import VMPLACER, clean_env, run_vmplacer
from vmplacer.core.topology.cpuset import format_cpuset

ROOT = Path(__file__).resolve().parents[2]
CAPS = ROOT / "examples" / "hosts" / "xeon-2s-56c-smt2.xml"
REQUEST = ROOT / "examples" / "requests" / "mixed.yaml"
HOST = "analytics-host-frankfurt-01"
WIDTH = 80
BOX_DRAWING = re.compile("[\u2500-\u257f]")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("styles")
    path = directory / "vmplacer.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(directory), "hosts": [
        {"name": HOST, "uri": "test:///default", "domain_type": "qemu", "capabilities": str(CAPS)}]}))
    return path


def _env(**extra: str) -> dict[str, str]:
    return clean_env(extra, drop=("VMPLACER_", "COLUMNS", "LINES"))


def _vmplacer(config: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer("--config", str(config), *args, env=_env(**env))


def _plan(config: Path, *args: str, **env: str) -> str:
    done = _vmplacer(config, "plan", "--request", str(REQUEST), *args, **env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _visible(text: str) -> Counter:
    """The characters a reader sees (not blanks, box drawing or terminal escapes)."""
    return Counter(c for c in BOX_DRAWING.sub("", ANSI.sub("", text)) if not c.isspace())


@pytest.fixture(scope="module")
def planned(config) -> dict:
    return json.loads(_plan(config, "-o", "json"))


@pytest.fixture(scope="module")
def wide(config) -> str:
    return _plan(config, "-o", "wide", COLUMNS=str(WIDTH))


def test_wide_is_one_complete_line_per_guest(planned, wide):
    lines = wide.splitlines()
    assert any(len(line) > WIDTH for line in lines), "the control: these values do not fit 80 columns"
    for entry in planned["placements"]:
        pins = " ".join(f"{v}→{format_cpuset(c)}" for v, c in entry["vcpupin"].items())
        (line,) = [line for line in lines if line.split()[:1] == [entry["guest"]]]
        assert f"  {HOST}  " in line and f"  {pins}  " in line, line
        assert f"  {format_cpuset(entry['emulatorpin'])}  " in line and line.endswith(f"{entry['score']:.3f}")


def test_a_table_piped_with_80_columns_fits_and_cuts_nothing(config, wide):
    text = _plan(config, COLUMNS=str(WIDTH))
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    assert "…" not in text and _visible(text) == _visible(wide), text


def test_a_table_piped_without_a_width_is_what_scripts_read(config, wide):
    assert _plan(config) == wide


def _on_terminal(config: Path, *args: str, columns: int) -> str:
    """`vmplacer ARGS` with its output on a pseudo-terminal `columns` wide, as an operator sees it."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    process = subprocess.Popen([VMPLACER, "--config", str(config), *args], stdin=subprocess.DEVNULL,
                               stdout=side, stderr=subprocess.PIPE, env=_env(TERM="xterm-256color"))
    os.close(side)
    chunks = []
    while True:
        ready, _, _ = select.select([main], [], [], 120)
        assert ready, "no output for 120 s"
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal's other side closed: the command ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert process.wait(timeout=120) == 0, process.stderr.read().decode() if process.stderr else ""
    if process.stderr:
        process.stderr.close()
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_an_80_column_terminal_shows_every_character(config, wide):
    text = _on_terminal(config, "plan", "--request", str(REQUEST), columns=WIDTH)
    shown = ANSI.sub("", text)
    assert max(len(line) for line in shown.splitlines()) <= WIDTH, shown
    assert "…" not in shown and _visible(shown) == _visible(wide), shown


def test_yaml_is_the_json_and_format_json_is_as_before(config, planned):
    assert yaml.safe_load(_plan(config, "-o", "yaml")) == planned
    assert json.loads(_plan(config, "--format", "json")) == planned
    assert json.loads(_plan(config, "--output=json")) == planned


def test_columns_are_chosen_by_name(config, planned):
    lines = _plan(config, "-o", "wide", "--columns", "guest,memory-nodes,vcpupin").splitlines()
    assert lines[1].split() == ["guest", "memory", "nodes", "vcpupin"]
    first = planned["placements"][0]
    pins = " ".join(f"{v}→{format_cpuset(c)}" for v, c in first["vcpupin"].items())
    assert lines[2].split(None, 2) == [first["guest"], format_cpuset(first["memory_nodes"]), pins]


@pytest.mark.parametrize(("args", "said"), [
    (("--columns", "guest,pins,uuid"), "argument --columns: unknown columns 'pins', 'uuid' (columns: guest, host, "
                                       "nodes, vcpupin, emulatorpin, memory-nodes, mode, score)"),
    (("--columns", "guest", "-o", "yaml"), "argument --columns: applies to table and wide output, not to yaml"),
    (("-o", "csv"), "argument -o/--output: invalid choice: 'csv'"),
])
def test_a_bad_output_choice_exits_2_and_says_why(config, args, said):
    done = _vmplacer(config, "plan", "--request", str(REQUEST), *args)
    assert done.returncode == 2 and done.stdout == ""
    assert said in done.stderr, done.stderr


def test_placements_take_the_same_styles(config, planned):
    placed = _vmplacer(config, "place", "--request", str(REQUEST), "-o", "yaml")
    assert placed.returncode == 0, placed.stderr
    guests = [p["guest"] for p in yaml.safe_load(placed.stdout)["placements"]]
    assert sorted(guests) == sorted(p["guest"] for p in planned["placements"])
    listed = _vmplacer(config, "placements", "-o", "wide", "--columns", "guest,exclusive-pcpus")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert rows[1].split() == ["guest", "exclusive", "pCPUs"] and len(rows) == 2 + len(guests)
    records = json.loads(_vmplacer(config, "placements", "--format", "json").stdout)
    assert {tuple(r.split(None, 1)) for r in rows[2:]} == {
        (r["guest"], ",".join(map(str, r["claims"])) or "-") for r in records}
