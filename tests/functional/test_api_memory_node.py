"""`memory_node` through the API: the same field, rules and messages as request files (SQLite and PostgreSQL).

Host: libvirt's built-in test driver ("t", nodes 0 and 1, both with CPUs), so a
named node is refused there as a NoFit (409); a malformed value is a 422 from
the guest spec before any host is read.
"""

from __future__ import annotations

import pytest

from tests.functional.test_api_helpers import admin_client
from vmplacer.api.schemas import PlacementRequest
from vmplacer.core.placement.guest import FIELDS, MAX_HOST_NODE


GUEST = {"name": "g1", "vcpus": 1, "memory_mib": 64, "dry_run": True, "host": "t"}


@pytest.fixture
def api(database_url, tmp_path):
    with admin_client(database_url, tmp_path, [{"name": "t", "uri": "test:///default",
                                                         "domain_type": "qemu"}]) as client:
        yield client


def _fields(response) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {p["field"]: p["reason"] for p in response.json()["error"]["details"]}


def test_the_request_schema_offers_every_guest_spec_field():
    assert set(FIELDS) <= set(PlacementRequest.model_fields)
    schema = PlacementRequest.model_json_schema()["properties"]["memory_node"]
    node = {"type": "integer", "minimum": 0, "maximum": MAX_HOST_NODE}
    assert schema["anyOf"] == [node, {"type": "object", "additionalProperties": node}, {"type": "null"}]


def test_openapi_documents_the_field(api):
    body = api.get("/openapi.json").json()["components"]["schemas"]["PlacementRequest"]["properties"]
    assert "memory-only" in body["memory_node"]["description"]


@pytest.mark.parametrize("extra, field, fragment", [
    ({"memory_node": -1}, "memory_node", f"must be a host NUMA node id 0..{MAX_HOST_NODE}"),
    ({"memory_node": "1"}, "memory_node", "got '1'"),
    ({"memory_node": {"0": 1}}, "memory_node", "per-cell nodes need the guest's cells fixed"),
    ({"numa_nodes": 1, "memory_node": {"1": 1}}, "memory_node.1", "cell 1 does not exist"),
    ({"numa_nodes": 1, "memory_node.0": True}, "memory_node.0", "got True"),
])
def test_a_malformed_memory_node_is_422_naming_the_field(api, extra, field, fragment):
    response = api.post("/v1/placements", json={**GUEST, **extra})
    assert response.status_code == 422, response.text
    assert fragment in _fields(response)[field]
    assert "guest g1" in response.json()["error"]["message"]


@pytest.mark.parametrize("node, have", [(0, "node 0 with CPUs 0-7 (memory-only here: none)"),
                                        (4, "nodes 0-1 (memory-only: none)")])
def test_a_node_the_host_cannot_give_is_409_with_the_reason(api, node, have):
    response = api.post("/v1/placements", json={**GUEST, "memory_node": node})
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "no-fit" and "guest g1" in error["message"]
    reasons = [(r["constraint"], r["where"], r["have"]) for r in error["details"][0]["reasons"]]
    assert reasons == [("memory-node", f"memory_node {node} (cell 0)", have)]


def test_the_topology_route_serves_the_documented_keys(api):
    response = api.get("/v1/hosts/t/topology")
    assert response.status_code == 200, response.text
    body = response.json()
    assert {"nodes", "cores", "dies", "clusters", "llc", "l2", "smt", "packages", "memory_only_nodes",
            "offline", "reserved", "isolated", "warnings"} <= set(body)
    assert {"id", "cpus", "memory_kib", "free_kib", "distances", "hugepages", "memory_only"} == set(body["nodes"][0])
    assert {"id", "node", "package", "die", "cluster", "kind", "cpus"} == set(body["cores"][0])
    assert {"id", "package", "cpus"} == set(body["dies"][0])
    assert body["memory_only_nodes"] == [n["id"] for n in body["nodes"] if n["memory_only"]] == []
