"""A built wheel works away from the checkout: its templates, migrations, systemd units and
web view ship inside the package (the smoke path an operator follows in docs/operations.md).

The wheel is built from this checkout and unpacked into a directory of its own; the
dependencies come from the test environment (installing them again would test PyPI, not
the package). Every command runs from an empty directory, with the unpacked package first
on the path, so nothing can be found through the checkout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support import clean_env, run_reporting_hangs

ROOT = Path(__file__).resolve().parents[2]
REQUEST = "guests:\n  - {name: web, vcpus: 2, memory_mib: 1024}\n  - {name: db, vcpus: 2, memory_mib: 1024, cpu_policy: dedicated}\n"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, unpacked (pip install --target) into a directory of its own."""
    build = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(build), str(ROOT)], check=True, capture_output=True, text=True, cwd=build, timeout=300)
    wheels = list(build.glob("vmplacer-*.whl"))
    assert len(wheels) == 1, wheels
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    str(wheels[0])], check=True, capture_output=True, text=True, timeout=300)
    return target


def _env(installed: Path, home: Path) -> dict[str, str]:
    return clean_env({"PYTHONPATH": str(installed), "VMPLACER_DATA_DIR": str(home), "PYTHONSAFEPATH": "1"})


def _run(installed: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_reporting_hangs([sys.executable, "-m", "vmplacer.cli.main", *args], env=_env(installed, home),
                               cwd=home, timeout=120)


def test_the_wheel_carries_what_vmplacer_reads(installed):
    package = installed / "vmplacer"
    for shipped in ("templates/domain.xml.j2", "migrations/env.py", "migrations/versions",
                    "systemd/vmplacer-api.service", "data/example-host.xml", "web/templates/base.html",
                    "data/schemas/request.schema.json",  # `vmplacer config schema request`
                    "data/schemas/config.schema.json",  # `vmplacer config schema config`
                    "web/templates/host.html", "web/static/ui.js", "web/static/ui.css",
                    "lab/simulator.py",  # what `vmplacer eval` runs on
                    "docs/operations.md", "docs/protect.md", "docs/rebalance.md"):  # the units' Documentation=
        assert (package / shipped).exists(), shipped


def test_the_installed_package_prints_its_manual_page(installed, tmp_path):
    result = _run(installed, tmp_path, "manpage")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(".TH VMPLACER 1 ") and '.SS "vmplacer serve"' in result.stdout


def test_the_installed_package_prints_the_request_file_schema(installed, tmp_path):
    result = _run(installed, tmp_path, "config", "schema", "request")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["properties"]["guests"]["items"] == {"$ref": "#/$defs/Guest"}


def test_the_installed_package_prints_the_config_file_schema(installed, tmp_path):
    result = _run(installed, tmp_path, "config", "schema", "config")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (installed / "vmplacer" / "data" / "schemas" / "config.schema.json").read_text("utf-8")
    assert json.loads(result.stdout)["properties"]["hosts"]["items"] == {"$ref": "#/$defs/Host"}


def test_the_installed_package_upgrades_plans_and_makes_tokens(installed, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    where = run_reporting_hangs([sys.executable, "-c", "import vmplacer, vmplacer.resources as r; "
                                 "print(vmplacer.__file__); print(r.resource_dir('templates'))"],
                                env=_env(installed, home), cwd=home, timeout=60)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(installed)) for line in where.stdout.split()), where.stdout

    upgraded = _run(installed, home, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    request = home / "guests.yaml"
    request.write_text(REQUEST)
    planned = _run(installed, home, "plan", "--request", str(request), "--format", "json")
    assert planned.returncode == 0, planned.stderr
    data = json.loads(planned.stdout)
    assert [p["guest"] for p in data["placements"]] == ["web", "db"]
    assert all("<domain" in p["xml"] for p in data["placements"])
    token = _run(installed, home, "token", "create", "orchestrator", "--scope", "read")
    assert token.returncode == 0 and token.stdout.strip(), token.stderr


def test_the_installed_package_serves_healthz(installed, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "vmplacer.cli.main", "serve", "--listen", f"127.0.0.1:{port}",
                               "--no-jobs"], env=_env(installed, home), cwd=home,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        answer = None
        for _ in range(600):  # until it listens (or exits): the bound is the process, not the clock
            if server.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
                    answer = (response.status, response.read())
                break
            except OSError:
                time.sleep(0.2)
        assert answer is not None, server.communicate(timeout=10) if server.poll() is not None else "no answer"
        assert answer[0] == 200, answer
        for path, needle in (("/ui/static/ui.css", b".cpu"), ("/ui/static/ui.js", b"textContent"),
                             ("/ui/login", b'name="token"')):  # the web view ships in the wheel
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                assert response.status == 200 and needle in response.read(), path
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, 9)
            server.wait()
