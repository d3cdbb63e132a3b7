"""Anti-affinity through the API binds both ways: a guest placed later keeps off the node of a
guest on record that refuses it, in a dry run and in a real placement (SQLite and PostgreSQL).

Host: libvirt's built-in test driver ("t") with a two-socket machine's capabilities.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.functional.test_api_helpers import admin_client, roomy_test_driver


CAPS = Path(__file__).resolve().parents[2] / "examples" / "hosts" / "xeon-2s-56c-smt2.xml"
GUEST = {"vcpus": 1, "memory_mib": 64, "cpu_policy": "dedicated", "host": "t"}


@pytest.fixture
def api(database_url, tmp_path):
    with roomy_test_driver(), admin_client(database_url, tmp_path, [{"name": "t", "uri": "test:///default",
                                                         "domain_type": "qemu", "capabilities": str(CAPS)}]) as client:
        yield client


def _nodes(response) -> set[int]:  # type: ignore[no-untyped-def]
    assert response.status_code in (200, 201), response.text
    return set(response.json()["placement"]["memory_nodes"])


def test_a_guest_on_record_that_refuses_the_new_one_keeps_it_off_its_node(api):
    refusing = _nodes(api.post("/v1/placements", json={**GUEST, "name": "aff-a", "anti_affinity": ["aff-b"]}))
    assert len(refusing) == 1
    bulk = _nodes(api.post("/v1/placements", json={**GUEST, "name": "aff-bulk", "vcpus": 4}))
    assert not bulk & refusing  # the allocator spreads: the other node is now the fuller one
    free = _nodes(api.post("/v1/placements", json={**GUEST, "name": "aff-free", "dry_run": True}))
    assert free == refusing  # the control: a guest nobody refuses goes next to aff-a
    planned = _nodes(api.post("/v1/placements", json={**GUEST, "name": "aff-b", "dry_run": True}))
    assert not planned & refusing, (planned, refusing)
    placed = _nodes(api.post("/v1/placements", json={**GUEST, "name": "aff-b"}))
    assert placed == planned


def test_a_refusal_in_a_domain_whose_record_is_gone_still_binds(api, database_url):
    """A database restored from before aff-c was placed has no record of its rule: the rule
    written in aff-c's domain XML keeps aff-d off its node all the same."""
    from sqlalchemy import create_engine, text

    refusing = _nodes(api.post("/v1/placements", json={**GUEST, "name": "aff-c", "anti_affinity": ["aff-d"]}))
    engine = create_engine(database_url)
    with engine.begin() as connection:  # what a restore from before the placement leaves
        connection.execute(text("DELETE FROM cpu_claims WHERE placement_id IN "
                                "(SELECT id FROM placements WHERE guest = 'aff-c')"))
        connection.execute(text("DELETE FROM placements WHERE guest = 'aff-c'"))
    engine.dispose()
    bulk = _nodes(api.post("/v1/placements", json={**GUEST, "name": "aff-bulk2", "vcpus": 4}))
    assert not bulk & refusing
    free = _nodes(api.post("/v1/placements", json={**GUEST, "name": "aff-free2", "dry_run": True}))
    assert free == refusing  # the control: a guest nobody refuses goes next to aff-c
    planned = _nodes(api.post("/v1/placements", json={**GUEST, "name": "aff-d", "dry_run": True}))
    assert not planned & refusing, (planned, refusing)
    assert _nodes(api.post("/v1/placements", json={**GUEST, "name": "aff-d"})) == planned
