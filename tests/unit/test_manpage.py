"""The vmplacer(1) page is generated from the parser, renders cleanly, and every systemd unit's
Documentation= names something an install following docs/operations.md provides."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

from tests.support import clean_env, run_vmplacer
from vmplacer.cli.global_options import command_parsers
from vmplacer.cli.main import build_parser
from vmplacer.cli.manpage import DOCS_DIR, SEE_ALSO_DOCS, manual_page
from vmplacer.resources import resource_dir

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "systemd").glob("vmplacer*"))


def page() -> str:
    result = run_vmplacer("manpage", env=clean_env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_page_names_every_command_and_option_of_the_tree():
    text = page()
    assert text.startswith(".TH VMPLACER 1 ") and text == manual_page(build_parser())
    for child in command_parsers(build_parser()):
        assert f'.SS "{child.prog.replace("-", chr(92) + "-")}"' in text, child.prog
        for action in child._actions:
            if action.option_strings and action.help != argparse.SUPPRESS and action.dest != "help":
                flag = max(action.option_strings, key=len).replace("-", "\\-")
                assert f"\\fB{flag}\\fR" in text, (child.prog, flag)
    assert "\\fB\\-\\-log\\-format\\fR" in text and "VMPLACER_LOG_FORMAT" in text


def test_the_page_renders_without_warnings_in_80_columns(tmp_path):
    source = tmp_path / "vmplacer.1"
    source.write_text(page())
    groff = shutil.which("groff")
    assert groff, "groff renders man pages here (apt-get install groff-base)"
    rendered = subprocess.run([groff, "-k", "-man", "-Tutf8", "-ww", "-rLL=78n", str(source)],
                              capture_output=True, text=True, timeout=60, env=clean_env({"LC_ALL": "C.UTF-8"}))
    assert rendered.returncode == 0 and rendered.stderr == "", rendered.stderr
    body = re.sub(r".\x08", "", rendered.stdout)
    assert "vmplacer topology" in body and "EXIT STATUS" in body and "--cores" in body.replace("‐", "-")


def test_every_documentation_target_of_every_unit_exists_after_install():
    shipped = resource_dir("docs")
    operations = (ROOT / "docs" / "operations.md").read_text()
    for unit in UNITS:
        targets = [t for line in unit.read_text().splitlines() if line.startswith("Documentation=")
                   for t in line.split("=", 1)[1].split()]
        assert targets, f"{unit.name}: no Documentation="
        for target in targets:
            if target == "man:vmplacer(1)":
                assert "vmplacer manpage > /usr/local/share/man/man1/vmplacer.1" in operations
                continue
            assert target.startswith(f"file://{DOCS_DIR}/"), f"{unit.name}: {target}"
            name = target.removeprefix(f"file://{DOCS_DIR}/")
            assert (shipped / name).is_file(), f"{unit.name}: {name} is not among the shipped docs"
    assert f"install -d {DOCS_DIR}" in operations and "vmplacer/docs/. /usr/share/doc/vmplacer/" in operations
    for name in SEE_ALSO_DOCS:
        assert (shipped / name).is_file(), name
