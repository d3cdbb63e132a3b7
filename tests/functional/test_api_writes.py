"""Writes through the API on a host with room (libvirt's test driver): what libvirt refuses
because of the caller's XML is a 4xx, and every write is audited as the token that asked.

The real app in process, on SQLite and PostgreSQL. The test driver's own domain is
moved out of the way for each test (it fills the host's memory) and put back after.
"""

from __future__ import annotations

import re
import warnings

import pytest

from tests.functional.test_api_helpers import make_container, roomy_test_driver

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from vmplacer.adapters.db.api import SqlTokenStore
from vmplacer.api.app import create_app
from vmplacer.api.services import ApiOptions

GUEST = {"vcpus": 1, "memory_mib": 64, "host": "t"}
OTHER_UUID = "5e044358-d714-49c5-b502-fa28b76f6681"


@pytest.fixture
def host(database_url, tmp_path):
    with roomy_test_driver() as connection:
        container = make_container(database_url, tmp_path, [{"name": "t", "uri": "test:///default",
                                                             "domain_type": "qemu"}])
        admin = SqlTokenStore(container.sessions).create("orchestrator", "admin")
        token_id = next(t.id for t in SqlTokenStore(container.sessions).list() if t.name == "orchestrator")
        app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
        with TestClient(app, raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {admin}"
            yield client, connection, token_id
        container.close()


def _error(response) -> dict:  # type: ignore[no-untyped-def]
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def _base(name: str, inner: str) -> str:
    return f"<domain type='qemu'><name>{name}</name>{inner}</domain>"


# ----- libvirt's refusals of the caller's XML --------------------------------------------------------------


def test_xml_libvirt_refuses_is_422_naming_base_xml(host):
    client, connection, _ = host
    for name, inner, words in (
        ("no-os", "", "os <type>"),
        ("container", "<os><type>exe</type></os>", "init binary"),  # valid to the schema, not to libvirt
    ):
        response = client.post("/v1/placements", json={**GUEST, "name": name, "base_xml": _base(name, inner)})
        assert response.status_code == 422, response.text
        error = _error(response)
        assert error["code"] == "invalid-xml" and words in error["message"]
        assert error["details"][0]["field"] == "base_xml", error
        assert error["details"][0].get("host") == "t", error
        assert client.get(f"/v1/placements/{name}").status_code == 404  # the claim was undone
        assert name not in [d.name() for d in connection.listAllDomains()]
    assert 'outcome="refused"' in client.get("/metrics").text


def test_a_uuid_another_domain_has_is_409_exists(host):
    client, connection, _ = host
    connection.defineXML(f"<domain type='test'><name>theirs</name><uuid>{OTHER_UUID}</uuid><memory>1024</memory>"
                         "<vcpu>1</vcpu><os><type>hvm</type></os></domain>")
    base = _base("mine", f"<uuid>{OTHER_UUID}</uuid><os><type>hvm</type></os>")
    response = client.post("/v1/placements", json={**GUEST, "name": "mine", "base_xml": base})
    assert response.status_code == 409, response.text
    error = _error(response)
    assert error["code"] == "exists"
    assert error["details"] == [{"field": "base_xml", "rule": "exists", "reason": error["message"], "guest": "mine",
                                 "host": "t"}]
    assert f"domain theirs already has the UUID {OTHER_UUID}" in error["message"]
    assert client.get("/v1/placements/mine").status_code == 404  # its claim was undone: the pCPUs are free
    assert client.post("/v1/placements", json={**GUEST, "name": "mine", "base_xml": _base(
        "mine", "<os><type>hvm</type></os>")}).status_code == 201
    # a dry run of a placed name answers what the placement would: 409 exists, nothing planned
    dry = client.post("/v1/placements", json={**GUEST, "name": "mine", "dry_run": True})
    assert dry.status_code == 409 and _error(dry)["code"] == "exists", dry.text


def test_a_domain_of_the_same_name_is_never_replaced(host):
    client, connection, _ = host
    connection.defineXML("<domain type='test'><name>taken</name><memory>1024</memory>"
                         "<vcpu>1</vcpu><os><type>hvm</type></os></domain>")
    for define in (True, False):  # defining and reserving alike
        response = client.post("/v1/placements", json={**GUEST, "name": "taken", "define": define})
        assert response.status_code == 409, response.text
        error = _error(response)
        assert error["code"] == "no-fit" and "a domain named taken exists" in error["message"]
        assert [r["constraint"] for r in error["details"][0]["reasons"]] == ["name"]
    assert client.get("/v1/placements/taken").status_code == 404
    assert connection.lookupByName("taken").maxMemory() == 1024  # its definition is untouched


def test_a_name_libvirt_cannot_carry_names_no_domain():
    from vmplacer.adapters.libvirt_host import LibvirtHost
    from vmplacer.config import HostSettings
    from vmplacer.ports import DomainGone

    host = LibvirtHost(HostSettings("t", "test:///default"))
    try:
        for name in ("a\u0000b", "a\ud800"):  # libvirt-python raises ValueError / UnicodeEncodeError
            with pytest.raises(DomainGone, match="no domain can be named"):
                host.domain_state(name)
    finally:
        host.close()


# ----- the audit log names the token -------------------------------------------------------------------------


def _entries(client, **params) -> list[dict]:  # type: ignore[no-untyped-def]
    return client.get("/v1/audit", params={"limit": 100, **params}).json()["entries"]


def _by_token(entry: dict, token_id: int) -> None:
    assert entry["actor"] == "api:orchestrator", entry
    assert entry["detail"]["via"] == "api" and entry["detail"]["token"] == "orchestrator", entry
    assert entry["detail"]["token_id"] == token_id and entry["detail"]["instance"], entry


def test_deletes_are_audited_with_the_token_and_what_became_of_the_domain(host):
    client, connection, token_id = host
    for name in ("gone-too", "kept", "vanished"):
        assert client.post("/v1/placements", json={**GUEST, "name": name}).status_code == 201
    assert client.post("/v1/placements", json={**GUEST, "name": "reserved", "define": False}).status_code == 201

    undefined = client.delete("/v1/placements/gone-too")
    assert undefined.json() == {"guest": "gone-too", "host": "t", "undefined": True, "domain": "undefined"}
    kept = client.delete("/v1/placements/kept", params={"undefine": "false"})
    assert kept.json() == {"guest": "kept", "host": "t", "undefined": False, "domain": "kept"}
    connection.lookupByName("vanished").undefine()  # undefined by hand before the DELETE
    vanished = client.delete("/v1/placements/vanished")
    assert vanished.json() == {"guest": "vanished", "host": "t", "undefined": False, "domain": "gone"}
    reserved = client.delete("/v1/placements/reserved")
    assert reserved.json()["domain"] == "kept"  # a reservation's domain is the caller's

    names = [d.name() for d in connection.listAllDomains()]
    assert "gone-too" not in names and "kept" in names
    removals = {e["guest"]: e for e in _entries(client, action="remove")}
    assert set(removals) == {"gone-too", "kept", "vanished", "reserved"}
    for entry in removals.values():
        _by_token(entry, token_id)
        assert entry["outcome"] == "ok" and entry["host"] == "t"
    assert (removals["gone-too"]["detail"]["undefined"], removals["gone-too"]["detail"]["domain"]) == (True, "undefined")
    assert removals["gone-too"]["message"] == "domain destroyed and undefined"
    assert (removals["kept"]["detail"]["undefine"], removals["kept"]["detail"]["undefined"]) == (False, False)
    assert removals["kept"]["message"] == "record only: the domain was left defined"
    assert removals["vanished"]["detail"]["domain"] == "gone"
    assert removals["reserved"]["detail"]["undefine"] is False


def test_every_write_names_the_token(host):
    client, _, token_id = host
    assert client.post("/v1/placements", json={**GUEST, "name": "web"}).status_code == 201
    assert client.post("/v1/placements", json={**GUEST, "name": "db", "define": False}).status_code == 201
    assert client.post("/v1/placements", json={**GUEST, "name": "web-dry", "dry_run": True}).status_code == 200
    assert client.put("/v1/hosts/t/maintenance", json={"reason": "firmware"}).status_code == 200
    assert client.delete("/v1/hosts/t/maintenance").status_code == 200
    assert client.post("/v1/profiles", json={"host": "t", "samples": 1}).status_code == 202
    plan = client.post("/v1/plans", json={"hosts": ["t"]})
    assert plan.status_code == 201, plan.text
    assert client.post("/v1/reconcile", json={"hosts": ["t"], "settle_s": 0}).status_code == 200
    assert client.delete("/v1/placements/web").status_code == 200

    entries = _entries(client)
    actions = {e["action"] for e in entries}
    for action in ("place", "reserve", "maintenance-start", "maintenance-end", "profile-queued",
                   "rebalance-propose", "remove"):
        assert action in actions, (action, actions)
    for entry in entries:
        if entry["action"] in ("token-create",):
            continue  # the CLI made the token
        _by_token(entry, token_id)
    assert "web-dry" not in {e["guest"] for e in entries}  # a dry run writes nothing
    proposed = next(e for e in entries if e["action"] == "rebalance-propose")
    assert proposed["detail"]["plan_id"] == plan.json()["id"]



ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


def test_every_timestamp_the_api_shows_is_iso_8601_utc(host):
    """Plans, plan lists, jobs and job lists spell time as the CLI and the audit log do."""
    client, _, _ = host
    plan = client.post("/v1/plans", json={"hosts": ["t"]}).json()
    queued = client.post("/v1/profiles", json={"host": "t", "samples": 1}).json()["job"]
    seen = [plan["created_at"], client.get(f"/v1/plans/{plan['id']}").json()["created_at"],
            *(p["created_at"] for p in client.get("/v1/plans").json()["plans"]),
            queued["created_at"], client.get(f"/v1/jobs/{queued['id']}").json()["created_at"],
            *(j["created_at"] for j in client.get("/v1/jobs").json()["jobs"])]
    for job in client.get("/v1/jobs").json()["jobs"]:
        seen += [job[k] for k in ("started_at", "finished_at") if job[k] is not None]
    assert len(seen) >= 6
    for value in seen:
        assert isinstance(value, str) and ISO_UTC.match(value), value


def test_a_name_placed_through_another_instance_meanwhile_is_409_exists(database_url, tmp_path):
    """This instance's snapshot of the recorded placements may be a second old; a name another
    instance placed in that second gets past it and is refused by the database's own check,
    with the same answer."""
    from vmplacer.adapters.db.placements import SqlPlacementStore
    from vmplacer.core.placement.guest_placement import Placement

    with roomy_test_driver():
        container = make_container(database_url, tmp_path, [{"name": "t", "uri": "test:///default",
                                                             "domain_type": "qemu"}])
        admin = SqlTokenStore(container.sessions).create("orchestrator", "admin")
        app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
        with TestClient(app, raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {admin}"
            assert client.post("/v1/placements", json={**GUEST, "name": "warm", "dry_run": True}).status_code == 200
            # another instance records "elsewhere" now: this one's snapshot still says nothing
            SqlPlacementStore(container.sessions).record(
                "t", "test:///default", Placement("elsewhere", "t", {0: frozenset({3})}, memory_kib=65536), {})
            response = client.post("/v1/placements", json={**GUEST, "name": "elsewhere"})
            assert response.status_code == 409 and _error(response)["code"] == "exists", response.text
