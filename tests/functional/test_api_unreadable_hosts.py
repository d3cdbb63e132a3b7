"""A host that cannot be read is named, never silently left out: in plans and in /readyz.

Hosts: libvirt's test driver ("t"); the test driver on a node file without NUMA
cells ("blind": libvirt answers, but its topology cannot be read); a libvirtd
that is not there ("down"). The real app, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest

from tests.functional.test_api_helpers import admin_client, free_port


NODE_WITHOUT_CELLS = """<node>
  <cpu><nodes>1</nodes><sockets>1</sockets><cores>4</cores><threads>2</threads><active>8</active>
       <mhz>3000</mhz><model>x86_64</model></cpu>
  <memory>8388608</memory>
</node>
"""


@pytest.fixture
def api(database_url, tmp_path):
    node = tmp_path / "node-without-cells.xml"
    node.write_text(NODE_WITHOUT_CELLS)
    with admin_client(database_url, tmp_path, [
        {"name": "t", "uri": "test:///default", "domain_type": "qemu"},
        {"name": "blind", "uri": f"test://{node}", "domain_type": "qemu"},
        {"name": "down", "uri": f"qemu+tcp://127.0.0.1:{free_port()}/system"},
    ]) as client:
        yield client


def test_a_plan_names_each_host_it_could_not_read(api):
    created = api.post("/v1/plans", json={})
    assert created.status_code == 201, created.text
    plan = created.json()
    assert plan["hosts"] == ["t"]
    errors = {e["host"]: e["error"] for e in plan["errors"]}
    assert set(errors) == {"blind", "down"}
    assert "no NUMA cells" in errors["blind"] and "cannot connect" in errors["down"]
    assert "not read, left out: blind, down" in plan["summary"]
    assert api.get(f"/v1/plans/{plan['id']}").json()["errors"] == plan["errors"]  # stored with the plan
    audited = api.get("/v1/audit", params={"action": "rebalance-propose"}).json()["entries"]
    assert [e["detail"]["errors"] for e in audited] == [plan["errors"]]


def test_a_plan_of_hosts_none_of_which_can_be_read_is_503(api):
    before = api.get("/v1/plans").json()["plans"]
    response = api.post("/v1/plans", json={"hosts": ["blind", "down"]})
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "host-unavailable" and int(response.headers["retry-after"]) > 0
    assert "no host could be read" in error["message"] and "blind" in error["message"]
    assert api.get("/v1/plans").json()["plans"] == before  # nothing stored


def test_readyz_reports_a_host_whose_topology_cannot_be_read(api):
    ready = api.get("/readyz")
    assert ready.status_code == 503
    body = ready.json()
    checks = {c["name"]: c for c in body["checks"]}
    assert body["ready"] is False
    assert checks["host t"]["ok"] is True and checks["database"]["ok"] is True
    assert checks["host blind"]["ok"] is False and "no NUMA cells" in checks["host blind"]["detail"]
    assert checks["host down"]["ok"] is False
