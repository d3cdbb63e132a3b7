"""A first run without any config places guests: the built-in example host, through the real
console script (in an empty home and working directory) and through the REST API.

The example host is the topology of a 2-socket SMT server (vmplacer/data/example-host.xml)
with its domains on libvirt's test driver, whose own running domain `test` stays and is
counted as occupied. A guest that fits nowhere exits 3 in `plan` and `place`.
"""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import pytest

from tests.functional.test_api_helpers import make_container
from tests.support import clean_env, require, run_vmplacer

ROOT = Path(__file__).resolve().parents[2]
MIXED = ROOT / "examples" / "requests" / "mixed.yaml"


def _libvirt() -> None:
    try:
        import libvirt  # noqa: F401
    except ImportError:
        require(False, "libvirt-python is not installed")


@pytest.fixture
def first_run(tmp_path):
    """Run `vmplacer ARGS` as a new operator would: no config anywhere, an empty home. Only
    the data dir is moved (it would be /var/lib/vmplacer for root), so runs stay apart."""
    _libvirt()
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env({"HOME": str(home), "VMPLACER_DATA_DIR": str(tmp_path / "data")}, drop=("VMPLACER_", "XDG_"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_vmplacer(*args, env=env, cwd=home)

    run.home = home  # type: ignore[attr-defined]
    run.data = tmp_path / "data"  # type: ignore[attr-defined]
    return run


def _request(directory: Path, text: str) -> str:
    path = directory / "guests.yaml"
    path.write_text(text)
    return str(path)


def test_hosts_says_the_host_is_the_builtin_example(first_run):
    result = first_run("hosts")
    assert result.returncode == 0, result.stderr
    assert "built-in example host" in result.stdout and "2-socket" in result.stdout
    assert "examples/vmplacer.yaml" in result.stdout  # and what to do for real hosts
    (host,) = json.loads(first_run("hosts", "--format", "json").stdout)
    assert host["name"] == "example" and host["uri"] == "test:///default" and host["reachable"] is True
    assert host["builtin_example"] is True and host["capabilities"].endswith("vmplacer/data/example-host.xml")


def test_plan_places_every_guest_of_the_example_request(first_run):
    result = first_run("plan", "--request", str(MIXED), "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["host"] == "example" and data["errors"] == []
    assert len(data["placements"]) == 8 and {p["host"] for p in data["placements"]} == {"example"}
    analytics = next(p for p in data["placements"] if p["guest"] == "analytics1")
    assert analytics["nodes"] == [0, 1]  # the example has two sockets to spread a big guest over
    assert [r["guest"] for r in data["repins"]] == ["test"]  # the test driver's own domain counts
    table = first_run("plan", "--request", str(MIXED))
    assert table.returncode == 0 and "placement plan for host example (dry run)" in table.stdout


def test_place_defines_a_guest_on_the_example_and_records_it(first_run):
    # 12 whole cores on one node: the example has 16 per node; the test driver's own topology 8 CPUs
    request = _request(first_run.home, "guests:\n  - {name: web1, vcpus: 12, memory_mib: 8192, "
                                       "cpu_policy: dedicated, thread_policy: isolate}\n")
    result = first_run("place", "--request", request, "--format", "json")
    assert result.returncode == 0, result.stderr
    (placed,) = json.loads(result.stdout)["placements"]
    assert placed["guest"] == "web1" and placed["host"] == "example" and placed["state"] == "defined"
    pcpus = {c for cpus in placed["vcpupin"].values() for c in cpus}
    assert len(pcpus) == 12 and len(placed["memory_nodes"]) == 1
    listed = json.loads(first_run("placements", "--format", "json").stdout)
    assert [(p["guest"], p["host"], p["state"]) for p in listed] == [("web1", "example", "defined")]
    assert (first_run.data / "vmplacer.db").is_file()


def test_a_guest_that_fits_nowhere_exits_3_and_the_others_are_still_placed(first_run):
    request = _request(first_run.home, "guests:\n"
                                       "  - {name: small, vcpus: 2, memory_mib: 2048}\n"
                                       "  - {name: huge, vcpus: 8, memory_mib: 1048576}\n")
    for command in ("plan", "place"):
        result = first_run(command, "--request", request, "--format", "json")
        assert result.returncode == 3, (command, result.stderr)
        data = json.loads(result.stdout)
        assert [p["guest"] for p in data["placements"]] == ["small"]
        (error,) = data["errors"]
        assert error["guest"] == "huge" and error["kind"] == "no-fit"
        assert any(r["constraint"] == "memory" for r in error["reasons"]), error
    assert "guest #1 (huge): guest huge does not fit" in first_run("plan", "--request", request).stderr


def test_the_test_driver_stays_reachable_by_its_uri(first_run):
    config = first_run.home / "vmplacer.yaml"
    config.write_text("hosts:\n  - {name: t, uri: 'test:///default'}\n")
    topology = json.loads(first_run("--config", str(config), "topology", "--format", "json").stdout)
    assert topology["name"] == "t" and len({c for n in topology["nodes"] for c in n["cpus"]}) == 16
    (host,) = json.loads(first_run("--config", str(config), "hosts", "--format", "json").stdout)
    assert host["builtin_example"] is False and host["capabilities"] is None


# ----- the REST API on the built-in defaults ------------------------------------------------------------

@pytest.fixture
def api(database_url, tmp_path):
    """The real app in process on the built-in host list (no `hosts` in the settings)."""
    _libvirt()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from vmplacer.adapters.db.api import SqlTokenStore
    from vmplacer.api.app import create_app
    from vmplacer.api.services import ApiOptions

    container = make_container(database_url, tmp_path, None)
    assert [h.name for h in container.settings.hosts] == ["example"]
    token = SqlTokenStore(container.sessions).create("orchestrator", "admin")
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {token}"
            yield client
    finally:
        container.close()


def test_the_api_places_a_guest_on_the_builtin_example(api):
    guest = {"name": "first", "vcpus": 4, "memory_mib": 8192, "cpu_policy": "dedicated"}
    dry = api.post("/v1/placements", json={**guest, "dry_run": True})
    assert dry.status_code == 200, dry.text
    assert dry.json()["host"] == "example" and dry.json()["state"] == "planned"
    placed = api.post("/v1/placements", json=guest)
    assert placed.status_code == 201, placed.text
    body = placed.json()
    assert body["host"] == "example" and body["state"] == "defined" and body["domain_uuid"]
    assert api.get("/v1/placements/first").json()["host"] == "example"
    assert api.delete("/v1/placements/first").status_code == 200  # the shared test driver is left as found
