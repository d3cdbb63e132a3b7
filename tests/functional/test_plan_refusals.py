"""When the rebalance planner refuses what it read, or runs out of memory, the caller gets a
clear answer, never a 500 or a traceback.

Hosts: "far", libvirt's test driver on a node file whose running guest `pinned-far` is pinned
to pCPUs 12-14, with a capabilities file (examples/hosts/xeon-e3-4c8t.xml) that lists pCPUs
0-7 only — the planner refuses such a host (RebalanceInputError); "t", the test driver's
default host, which plans fine. Through the real app in process (SQLite and PostgreSQL) and
the real console script:

- a plan of "far" alone is a 422 (exit 2) naming the guest, the pCPUs and the capabilities
  file, and nothing is stored; with "t" too, "far" is left out of the plan and named;
- a planner that runs out of memory (its MemoryError faked: planning's own failure, nothing
  else) is a 503 `out-of-memory` (exit 1, one line) naming the hosts and
  rebalance.search.memory_budget_mib, and nothing is stored.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.functional.test_api_helpers import admin_client
from tests.support import require, run_vmplacer

ROOT = Path(__file__).resolve().parents[2]
CAPABILITIES = ROOT / "examples" / "hosts" / "xeon-e3-4c8t.xml"  # pCPUs 0-7
SETTING = "rebalance.search.memory_budget_mib"

# libvirt's test driver with 16 pCPUs and one running guest pinned beyond the capabilities' 0-7
NODE_WITH_FAR_PINNED_GUEST = """<node>
  <cpu><nodes>1</nodes><sockets>1</sockets><cores>8</cores><threads>2</threads><active>16</active>
       <mhz>3000</mhz><model>x86_64</model></cpu>
  <memory>8388608</memory>
  <domain type='test'>
    <name>pinned-far</name><memory>65536</memory><vcpu>2</vcpu>
    <cputune><vcpupin vcpu='0' cpuset='12'/><vcpupin vcpu='1' cpuset='13-14'/></cputune>
    <os><type>hvm</type></os>
  </domain>
</node>
"""


def _needs_libvirt() -> None:
    require(importlib.util.find_spec("libvirt") is not None, "libvirt-python is not installed")


def _hosts(tmp_path: Path, *names: str) -> list[dict]:
    node = tmp_path / "node-far.xml"
    node.write_text(NODE_WITH_FAR_PINNED_GUEST)
    known = {"far": {"name": "far", "uri": f"test://{node}", "domain_type": "qemu",
                     "capabilities": str(CAPABILITIES)},
             "t": {"name": "t", "uri": "test:///default", "domain_type": "qemu"}}
    return [known[name] for name in names]


def _error(response) -> dict:  # type: ignore[no-untyped-def]
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def _names_the_refusal(text: str) -> None:
    assert "'pinned-far'" in text and "pCPUs 12-14" in text, text
    assert f"capabilities file {CAPABILITIES}" in text and "pCPUs 0-7" in text, text


# ----- the API ------------------------------------------------------------------------------------------


@pytest.fixture
def api(database_url, tmp_path):
    _needs_libvirt()
    with admin_client(database_url, tmp_path, _hosts(tmp_path, "far", "t")) as client:
        yield client


def _proposals(api) -> list:  # type: ignore[no-untyped-def]
    return api.get("/v1/audit", params={"action": "rebalance-propose"}).json()["entries"]


def test_a_plan_of_a_host_the_planner_refuses_is_422_naming_guest_pcpus_and_capabilities(api):
    before = api.get("/v1/plans").json()["plans"]
    response = api.post("/v1/plans", json={"hosts": ["far"]})
    assert response.status_code == 422, response.text
    error = _error(response)
    assert error["code"] == "validation"
    _names_the_refusal(error["message"])
    [detail] = error["details"]
    assert detail["field"] == "hosts" and detail["host"] == "far"
    assert detail["guests"] == [{"guest": "pinned-far", "pcpus": [12, 13, 14]}]
    assert detail["capabilities"] == f"capabilities file {CAPABILITIES}"
    _names_the_refusal(detail["reason"])
    assert api.get("/v1/plans").json()["plans"] == before  # nothing stored
    assert _proposals(api) == []


def test_a_plan_of_several_hosts_leaves_the_refused_host_out_and_names_it(api):
    created = api.post("/v1/plans", json={})
    assert created.status_code == 201, created.text
    plan = created.json()
    assert plan["hosts"] == ["t"]
    [error] = plan["errors"]
    assert error["host"] == "far" and error["kind"] == "refused"
    _names_the_refusal(error["error"])
    assert "refused, left out: far" in plan["summary"]
    [refused] = plan["settings"]["refused"]
    assert refused["guests"] == [{"guest": "pinned-far", "pcpus": [12, 13, 14]}]
    assert any(note.startswith("host far left out: guest 'pinned-far'") for note in plan["notes"])
    assert api.get(f"/v1/plans/{plan['id']}").json()["errors"] == plan["errors"]  # stored with the plan
    assert [e["detail"]["errors"] for e in _proposals(api)] == [plan["errors"]]


def test_a_drain_of_a_refused_host_is_422_naming_the_drain(api):
    assert api.put("/v1/hosts/far/maintenance", json={"reason": "firmware"}).status_code == 200
    response = api.post("/v1/plans", json={"hosts": ["far", "t"], "drain": "far"})
    assert response.status_code == 422, response.text
    error = _error(response)
    assert error["code"] == "validation" and error["message"].startswith("host far to drain cannot be planned")
    _names_the_refusal(error["message"])
    assert [d["field"] for d in error["details"]] == ["drain"]
    assert _proposals(api) == []


def _out_of_memory(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
    raise MemoryError


def test_a_planner_out_of_memory_is_503_naming_hosts_and_setting_and_stores_nothing(api, monkeypatch):
    import vmplacer.app.rebalance.rebalancer as rebalancer

    before = api.get("/v1/plans").json()["plans"]
    monkeypatch.setattr(rebalancer, "plan_rebalance", _out_of_memory)
    response = api.post("/v1/plans", json={"hosts": ["t"]})
    assert response.status_code == 503, response.text
    error = _error(response)
    assert error["code"] == "out-of-memory"
    assert "planning ran out of memory for host t" in error["message"] and SETTING in error["message"]
    assert [(d["rule"], d["hosts"], d["setting"]) for d in error["details"]] == [("out-of-memory", ["t"], SETTING)]
    assert "Traceback" not in response.text
    monkeypatch.undo()
    assert api.get("/v1/plans").json()["plans"] == before  # no half plan stored
    assert _proposals(api) == []


def test_out_of_memory_anywhere_else_is_503_not_a_bare_500(api, monkeypatch):
    import vmplacer.api.routes.plans as plans

    class Exhausted:
        def get(self, *_args, **_kwargs):  # noqa: ANN002, ANN003, ANN201
            raise MemoryError

    monkeypatch.setattr(plans, "plan_store", lambda _services: Exhausted())
    response = api.get("/v1/plans/1")
    assert response.status_code == 503, response.text
    error = _error(response)
    assert error["code"] == "out-of-memory" and "out of memory" in error["message"]


# ----- the command line ------------------------------------------------------------------------------------


def _config(tmp_path: Path, *names: str) -> Path:
    path = tmp_path / "vmplacer.yaml"
    path.write_text(json.dumps({"database_url": f"sqlite:///{tmp_path / 'vmplacer.db'}", "data_dir": str(tmp_path),
                                "hosts": _hosts(tmp_path, *names)}))
    return path


@pytest.mark.parametrize("command", [("plan", "--rebalance"), ("rebalance", "--profile-seconds", "0")])
def test_cli_refused_host_exits_2_with_one_line_and_no_traceback(tmp_path, command):
    _needs_libvirt()
    done = run_vmplacer("--config", str(_config(tmp_path, "far")), *command)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("vmplacer: error: nothing was planned: host far: guest 'pinned-far'"), line
    _names_the_refusal(line)


def test_cli_plan_of_several_hosts_leaves_the_refused_host_out(tmp_path):
    _needs_libvirt()
    done = run_vmplacer("--config", str(_config(tmp_path, "far", "t")), "plan", "--rebalance", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["plan"]["hosts"] == ["t"] and "refused, left out: far" in report["plan"]["summary"]
    [note] = [n for n in report["notes"] if n.startswith("host far left out:")]
    _names_the_refusal(note)


def test_cli_shared_rebalance_round_leaves_a_refused_host_out(tmp_path):
    """A round of one-host batches: the refused host's batch plans nothing, the round goes on."""
    _needs_libvirt()
    done = run_vmplacer("--config", str(_config(tmp_path, "far", "t")), "rebalance", "--profile-seconds", "0",
                        "--batch-hosts", "1", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "nothing-to-do" and report["round"]["done_here"] == ["far", "t"]
    [note] = [n for n in report["notes"] if n.startswith("host far left out:")]
    _names_the_refusal(note)


@pytest.mark.parametrize("command", [("plan", "--rebalance"), ("rebalance", "--profile-seconds", "0")])
def test_cli_planner_out_of_memory_exits_1_with_one_line_naming_hosts_and_setting(tmp_path, monkeypatch, capsys,
                                                                                   command):
    _needs_libvirt()
    import vmplacer.app.rebalance.rebalancer as rebalancer
    from vmplacer.cli.main import main

    monkeypatch.setattr(rebalancer, "plan_rebalance", _out_of_memory)
    code = main(["--config", str(_config(tmp_path, "t")), *command])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err
    [line] = err.strip().splitlines()
    assert line.startswith("vmplacer: failed: planning ran out of memory for host t;"), line
    assert SETTING in line


def test_the_setting_named_is_the_config_files_key_of_the_memory_budget():
    from vmplacer.app.rebalance.rebalancer import MEMORY_BUDGET_KEY
    from vmplacer.config_rebalance import config_key_of

    assert MEMORY_BUDGET_KEY == config_key_of("memory_budget_mib") == SETTING


# ----- the refusal's words, whatever the guests are called ----------------------------------------------------


class _Host:
    """A host of pCPUs 0-3 whose running guests are pinned where they are told."""

    def __init__(self, name: str, pins: dict[str, int]):
        from vmplacer.core.topology.host import uniform_topology

        self.name, self.uri = name, f"test:///{name}"
        self._topology = uniform_topology(nodes=1, cores_per_node=4, name=name)
        self.pins = pins

    def topology(self):  # type: ignore[no-untyped-def]
        return self._topology

    def domains(self):  # type: ignore[no-untyped-def]
        from vmplacer.core.placement.guest_placement import Placement
        from vmplacer.ports import DomainInfo

        return [DomainInfo(guest, f"uuid-{i}", "running", None, 1, 65536,
                           Placement(guest, self.name, {0: frozenset({cpu})}, memory_kib=65536))
                for i, (guest, cpu) in enumerate(self.pins.items())]


def test_a_refusal_names_every_far_pinned_guest_escaped_and_the_others_are_planned():
    from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer

    hosts = {"h1": _Host("h1", {"ok": 1, "evil\nname": 9, "far": 12}), "h2": _Host("h2", {"fine": 0})}
    rebalancer = Rebalancer(RebalancePorts(hosts=hosts, plans=None, leases=None, clock=None))  # type: ignore[arg-type]
    observed = rebalancer.observe(["h1", "h2"])
    assert set(observed.state.hosts) == {"h2"} and set(observed.state.guests) == {"fine"}
    refusal = observed.refused["h1"]
    assert refusal.guests == (("evil\nname", (9,)), ("far", (12,)))
    assert refusal.capabilities == "libvirt capabilities of test:///h1"
    assert "\n" not in refusal.message
    assert refusal.message == ("host h1: guests 'evil\\nname' (pCPUs 9), 'far' (pCPUs 12) are pinned to pCPUs the "
                               "host's capabilities do not list (read from libvirt capabilities of test:///h1: "
                               "pCPUs 0-3)")
    assert f"host h1 left out: {refusal.reason}" in observed.notes
