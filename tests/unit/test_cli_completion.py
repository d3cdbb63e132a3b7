"""`vmplacer completion bash`: generated from the parser tree, so it knows every command; bash
itself runs the script here and completes a few command lines."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support import require
from vmplacer.cli.completion import bash_script
from vmplacer.cli.global_options import command_parsers
from vmplacer.cli.main import COMMANDS, build_parser, main


@pytest.fixture(scope="module")
def script() -> str:
    return bash_script(build_parser())


def test_the_command_prints_the_script(capsys, script):
    assert main(["completion", "bash"]) == 0
    assert capsys.readouterr().out == script


def test_the_script_names_every_command_and_sub_command(script):
    commands_line = next(line for line in script.splitlines() if line.startswith("    [vmplacer]="))
    assert commands_line.split("=", 1)[1].strip("'").split() == list(COMMANDS)
    for parser in command_parsers(build_parser()):
        path = parser.prog
        assert f"[{path}]=" in script or f"['{path}']=" in script, path


def _complete(script: str, line: str) -> list[str]:
    """What bash offers for `line` (the word being completed is its last, maybe empty)."""
    require(shutil.which("bash") is not None, "bash is what the completion script is for")
    words = line.split(" ")
    program = (script + "\nCOMP_WORDS=(" + " ".join(f"'{w}'" for w in words) + ")\n"
               f"COMP_CWORD={len(words) - 1}\n_vmplacer\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n")
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return sorted(filter(None, done.stdout.splitlines()))


@pytest.mark.parametrize("line, offered", [
    ("vmplacer pl", ["place", "placements", "plan", "plans"]),
    ("vmplacer --config c.yaml hosts dis", ["disable"]),
    ("vmplacer plans ", ["cancel", "list", "show"]),
    ("vmplacer profile sh", ["show"]),
    ("vmplacer protect ", ["run", "status"]),
    ("vmplacer plan --format ", ["json", "table"]),
    ("vmplacer reconcile --drift a", ["adopt"]),
    ("vmplacer rebalance --all-h", ["--all-hosts"]),
    ("vmplacer db upgrade --conf", ["--config"]),
])
def test_bash_completes(script, line, offered):
    assert _complete(script, line) == offered
