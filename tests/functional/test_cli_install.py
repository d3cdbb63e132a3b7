"""Installing from the wheel alone, as docs/install.md says: the wheel carries the example config,
the capabilities files its `lab` host names, the request examples and the constraints under
PREFIX/share/vmplacer; the constraints come out of the wheel with the command the page gives;
the example, copied as the page says, passes `config check`; `db upgrade` and `plan` run on
it; the units' comments find the units in the installed package.

The wheel is built from this checkout and installed with `pip --target` into a directory of
its own, without dependencies (those of the test environment serve: installing them again
would test PyPI, not the package); every command runs from an empty directory with only the
installed package on the path."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import clean_env, run_reporting_hangs

ROOT = Path(__file__).resolve().parents[2]
INSTALL_DOC = ROOT / "docs" / "install.md"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(build), str(ROOT)], check=True, capture_output=True, text=True, cwd=build, timeout=300)
    wheels = list(build.glob("vmplacer-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def prefix(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install --target DIR WHEEL`: the package in DIR, its data files in DIR/share as they go
    to PREFIX/share in a virtualenv. (Not --prefix: pip may first uninstall the vmplacer of the
    environment running the tests.)"""
    target = tmp_path_factory.mktemp("prefix")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-warn-script-location", "-q",
                    "--target", str(target), str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    return target


def _site(prefix: Path) -> Path:
    return prefix


def _run(prefix: Path, cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = clean_env({"PYTHONPATH": str(_site(prefix)), "PYTHONSAFEPATH": "1",
                             "VMPLACER_DATA_DIR": str(cwd / "data"), **(env or {})})
    return run_reporting_hangs([sys.executable, *args], env=environment, cwd=cwd, timeout=300)


def _doc_line(start: str) -> str:
    lines = [line for line in INSTALL_DOC.read_text().splitlines() if line.startswith(start)]
    assert len(lines) == 1, f"docs/install.md: one line starting {start!r}, found {len(lines)}"
    return lines[0]


def test_the_wheel_installs_the_examples_and_the_constraints_under_share(prefix):
    share = prefix / "share" / "vmplacer"
    assert (share / "constraints.txt").read_bytes() == (ROOT / "constraints.txt").read_bytes()
    shipped = sorted(p.relative_to(share / "examples").as_posix() for p in (share / "examples").rglob("*")
                     if p.is_file())
    expected = sorted(["vmplacer.yaml", "requests/mixed.yaml", "hosts/README.md",
                       *(f"hosts/{p.name}" for p in (ROOT / "examples" / "hosts").glob("*.xml"))])
    assert shipped == expected
    assert (share / "examples" / "vmplacer.yaml").read_bytes() == (ROOT / "examples" / "vmplacer.yaml").read_bytes()


def test_the_documented_command_takes_the_constraints_out_of_the_wheel(wheel, tmp_path):
    line = _doc_line("/opt/vmplacer/.venv/bin/python -c ")
    command = line.removeprefix("/opt/vmplacer/.venv/bin/python").replace('"$WHEEL"', str(wheel))
    command = command.replace("> /tmp/vmplacer-constraints.txt", f"> {tmp_path / 'constraints.txt'}")
    done = subprocess.run(f"{sys.executable} {command}", shell=True, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "constraints.txt").read_bytes() == (ROOT / "constraints.txt").read_bytes()


def test_the_example_copied_as_documented_passes_its_check_and_plans(prefix, tmp_path):
    share = prefix / "share" / "vmplacer"
    etc = tmp_path / "etc"
    (etc / "hosts").mkdir(parents=True)
    # docs/install.md, step 4: the config and the hosts/ directory beside it
    for step in ('"$SHARE"/examples/vmplacer.yaml /etc/vmplacer/vmplacer.yaml',
                 '"$SHARE"/examples/hosts/*.xml /etc/vmplacer/hosts/'):
        assert step in INSTALL_DOC.read_text(), step
    shutil.copy(share / "examples" / "vmplacer.yaml", etc / "vmplacer.yaml")
    for xml in (share / "examples" / "hosts").glob("*.xml"):
        shutil.copy(xml, etc / "hosts" / xml.name)
    config = str(etc / "vmplacer.yaml")
    database = {"VMPLACER_DATABASE_URL": f"sqlite:///{tmp_path / 'vmplacer.db'}"}
    checked = _run(prefix, tmp_path, "-m", "vmplacer.cli.main", "config", "check", "--config", config)
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "ok\n", "")

    upgraded = _run(prefix, tmp_path, "-m", "vmplacer.cli.main", "--config", config, "db", "upgrade", env=database)
    assert upgraded.returncode == 0, upgraded.stderr
    planned = _run(prefix, tmp_path, "-m", "vmplacer.cli.main", "--config", config, "plan", "--host", "lab",
                   "--request", str(share / "examples" / "requests" / "mixed.yaml"), "--format", "json", env=database)
    assert planned.returncode == 0, planned.stderr
    placements = json.loads(planned.stdout)["placements"]
    assert len(placements) == 8 and {p["host"] for p in placements} == {"lab"}


def test_the_units_comments_find_the_units_in_the_installed_package(prefix, tmp_path):
    comment = next(line for line in (ROOT / "systemd" / "vmplacer-api.service").read_text().splitlines()
                   if "UNITS=$(" in line)
    code = re.search(r"-c '([^']+)'", comment).group(1)
    found = _run(prefix, tmp_path, "-c", code)
    assert found.returncode == 0, found.stderr
    units = Path(found.stdout.strip())
    assert units == _site(prefix) / "vmplacer" / "systemd"
    for unit in sorted((ROOT / "systemd").glob("*.service")):
        text = unit.read_text()
        named = re.findall(r'cp "\$UNITS"/(\S+) ', text)
        assert named, unit.name
        for name in named:
            braces = re.fullmatch(r"(.*)\{(\w+),(\w+)\}", name)  # vmplacer-prune.{service,timer}
            for each in [braces[1] + braces[2], braces[1] + braces[3]] if braces else [name]:
                assert (units / each).is_file(), (unit.name, each)
        assert "cp systemd/" not in text, unit.name
