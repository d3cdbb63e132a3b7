"""Start-up stays cheap: a command imports only what it uses.

`vmplacer --help` and `vmplacer version` run on every shell completion and in
health scripts; `topology --caps` and `plan --caps` are offline tools. Each runs
here in a fresh interpreter and lists the modules it imported.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import clean_env
from vmplacer.cli.main import COMMAND_MODULES, COMMANDS, build_parser, command_in

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ROOT / "examples" / "hosts"
REQUEST = ROOT / "examples" / "requests" / "mixed.yaml"

# Libraries no start-up command needs: the database, numerics, the solver, the REST API, libvirt.
NEVER = {"sqlalchemy", "alembic", "psycopg", "numpy", "ortools", "fastapi", "starlette", "pydantic",
         "uvicorn", "prometheus_client", "libvirt", "psutil", "httpx"}
RENDERING = {"jinja2"}  # only where domain XML is rendered
FILES = {"yaml", "lxml"}  # only where a request or capabilities file is read
DISPATCHER = {"vmplacer.cli.main", "vmplacer.cli.common", "vmplacer.cli.global_options",
              "vmplacer.cli.log_format"}  # every command's
PROJECT_LAYERS = ("vmplacer.app", "vmplacer.api", "vmplacer.bootstrap", "vmplacer.testbed", "vmplacer.lab")

_PROBE = """
import json, sys
from vmplacer.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
json.dump({"code": code, "modules": sorted(sys.modules)}, sys.stderr)
"""


def _imported(*argv: str) -> tuple[int, set[str], set[str]]:
    """(exit code, top-level libraries, vmplacer modules) of one command in a fresh interpreter."""
    env = clean_env({"PYTHONPATH": str(ROOT)})
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    report = json.loads(done.stderr[done.stderr.index("{\"code\""):])
    modules = set(report["modules"])
    return report["code"], {m.split(".")[0] for m in modules}, {m for m in modules if m.startswith("vmplacer")}


@pytest.mark.parametrize("argv", [("--help",), ("version",), ("version", "--format", "json")])
def test_help_and_version_import_no_library_and_no_other_command(argv):
    code, libraries, ours = _imported(*argv)
    assert code == 0
    assert not libraries & (NEVER | RENDERING | FILES | {"rich", "yaml"})
    assert not {m for m in ours if m.startswith(PROJECT_LAYERS + ("vmplacer.adapters", "vmplacer.config"))}
    commands = {m for m in ours if m.startswith("vmplacer.cli.")} - DISPATCHER
    assert commands == ({"vmplacer.cli.version"} if "version" in argv else set())


def test_topology_from_a_file_reads_it_and_nothing_more():
    code, libraries, ours = _imported("topology", "--caps", str(HOSTS / "xeon-e3-4c8t.xml"))
    assert code == 0
    assert "lxml" in libraries and "vmplacer.adapters.capabilities" in ours  # the probe sees real imports
    assert not libraries & (NEVER | RENDERING | {"yaml"})
    assert not {m for m in ours if m.startswith(PROJECT_LAYERS)}


def test_plan_from_a_file_renders_but_opens_no_database_or_host():
    code, libraries, ours = _imported("plan", "--caps", str(HOSTS / "xeon-2s-56c-smt2.xml"), "--request", str(REQUEST),
                                      "--format", "json")
    assert code == 0
    assert {"jinja2", "yaml", "lxml"} <= libraries
    assert not libraries & NEVER
    # the application's batch planner works on views alone: nothing else of the layers above core
    assert {m for m in ours if m.startswith(PROJECT_LAYERS)} == {"vmplacer.app", "vmplacer.app.place",
                                                                 "vmplacer.app.place.fleet_planner"}


# ----- the dispatcher's table -------------------------------------------------------------------

def _registered_help() -> dict[str, str | None]:
    parser = build_parser()  # every command in full
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {action.dest: action.help for action in subparsers._choices_actions}


def test_the_table_lists_every_command_with_its_modules_own_help_in_order():
    registered = _registered_help()
    assert list(registered) == list(COMMANDS)
    assert registered == {name: help_line for name, (_module, help_line) in COMMANDS.items()}


def test_each_command_is_registered_by_the_module_the_table_names():
    for module_name in COMMAND_MODULES:
        parser = argparse.ArgumentParser()
        subparsers = parser.add_subparsers()
        importlib.import_module(module_name).register(subparsers)
        assert set(subparsers.choices) == {name for name, (m, _h) in COMMANDS.items() if m == module_name}


def test_a_lazily_built_parser_runs_the_named_command_in_full():
    args = build_parser(["plan", "--caps", "f.xml", "--request", "r.yaml"]).parse_args(
        ["plan", "--caps", "f.xml", "--request", "r.yaml"])
    assert args.caps == ["f.xml"] and args.request == "r.yaml" and callable(args.func)


@pytest.mark.parametrize("argv, command", [
    (["version"], "version"),
    (["--config", "plan", "hosts"], "hosts"),  # a config file named like a command is not one
    (["--config=x.yaml", "-vv", "plan", "--host", "version"], "plan"),
    (["--conf", "x.yaml", "place"], "place"),  # argparse's prefix of --config
    (["-v", "--help"], None),
    (["--", "topology"], "topology"),
    ([], None),
])
def test_the_command_is_found_after_the_global_options(argv, command):
    assert command_in(argv) == command
