"""Real placements through the API that arrive together are placed as one batch (group
commit), on libvirt's test driver, SQLite and PostgreSQL: every guest lands with pins of its
own, the records equal what libvirt holds, a guest that fails fails alone, and a batch
places exactly what the same requests one at a time would.

A batch is made deterministic by holding the host's placement lock while the requests
arrive: the first request's batch waits for it, and every later one queues behind it, so
they form the next batch, in the order they were sent.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import yaml

from tests.functional.test_api_helpers import make_container, roomy_test_driver

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from vmplacer.adapters.db.api import SqlTokenStore
from vmplacer.api.app import create_app
from vmplacer.api.services import ApiOptions
from vmplacer.app.place.placement_service import host_lock

ROOT = Path(__file__).resolve().parents[2]
CAPS = ROOT / "examples" / "hosts" / "xeon-2s-56c-smt2.xml"
REQUEST = ROOT / "examples" / "requests" / "mixed.yaml"
HOST_CPUS = frozenset(range(16))  # the test driver's own host: 16 pCPUs on two nodes
CLASH_UUID = "6f1c2f1e-2b0e-4a52-9a43-0d8a7c3e5b10"
QUEUE_WAIT_S = 60.0  # only how long a request that never queues is waited for before failing


@contextlib.contextmanager
def _serving(database_url: str, data_dir: Path, **host: Any):  # type: ignore[no-untyped-def]
    with roomy_test_driver() as connection:
        container = make_container(database_url, data_dir, [{"name": "t", "uri": "test:///default",
                                                             "domain_type": "qemu", **host}])
        admin = SqlTokenStore(container.sessions).create("orchestrator", "admin")
        app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
        with TestClient(app, raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {admin}"
            yield client, connection, app.state.services.placement.groups
        container.close()


def _one_batch(client, groups, bodies: list[dict[str, Any]]) -> list[Any]:  # type: ignore[no-untyped-def]
    """POST every body so that all but the first form one batch, in the order given: the first
    is placed alone (it holds the batch slot while the host lock is held here), each later one
    is sent once the one before it is queued. Returns the answers in the order of `bodies`."""
    answers: list[Any] = [None] * len(bodies)

    def post(at: int) -> None:
        answers[at] = client.post("/v1/placements", json=bodies[at])

    threads = [threading.Thread(target=post, args=(at,)) for at in range(len(bodies))]
    with host_lock("t"):
        threads[0].start()
        _wait_until(lambda: groups.busy("t"))
        for at, thread in enumerate(threads[1:], start=1):
            thread.start()
            _wait_until(lambda at=at: groups.queued("t") == at)
    for thread in threads:
        thread.join(QUEUE_WAIT_S)
    assert groups.batches[-2:] == [1, len(bodies) - 1]
    return answers


def _wait_until(condition) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + QUEUE_WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "a request never reached the placement queue"
        time.sleep(0.005)


def _live_placement(connection, name: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The vCPU pins, emulator pins and memory nodes the domain libvirt holds says."""
    from lxml import etree

    from vmplacer.core.topology.cpuset import parse_cpuset

    root = etree.fromstring(connection.lookupByName(name).XMLDesc(0).encode())
    vcpupin = {pin.get("vcpu"): sorted(parse_cpuset(pin.get("cpuset"))) for pin in root.iter("vcpupin")}
    emulator = root.find("cputune/emulatorpin")
    memory = root.find("numatune/memory")
    return {"vcpupin": vcpupin, "emulatorpin": sorted(parse_cpuset(emulator.get("cpuset"))) if emulator is not None
            else [], "memory_nodes": sorted(parse_cpuset(memory.get("nodeset"))) if memory is not None else []}


def _records_equal_libvirt(client, connection, foreign: tuple[str, ...] = ()  # type: ignore[no-untyped-def]
                           ) -> list[dict[str, Any]]:
    """Every record has its domain, pinned as recorded, and every domain but `foreign` a record."""
    records = client.get("/v1/placements").json()["placements"]
    assert sorted(r["guest"] for r in records) == sorted(d.name() for d in connection.listAllDomains()
                                                          if d.name() not in foreign)
    for record in records:
        live = _live_placement(connection, record["guest"])
        placement = record["placement"]
        assert live["vcpupin"] == {k: v for k, v in placement["vcpupin"].items() if v}, record["guest"]
        assert live["emulatorpin"] == placement["emulatorpin"], record["guest"]
    return records


def test_placements_arriving_together_land_with_pins_of_their_own(database_url, tmp_path):
    with _serving(database_url, tmp_path) as (client, connection, groups):
        dedicated = [{"name": f"pin-{i}", "vcpus": 1, "memory_mib": 16, "cpu_policy": "dedicated", "host": "t"}
                     for i in range(12)]
        shared = [{"name": f"float-{i}", "vcpus": 1, "memory_mib": 16, "host": "t"} for i in range(12)]
        bodies = [body for pair in zip(dedicated, shared) for body in pair]
        answers = _one_batch(client, groups, bodies)
        assert [a.status_code for a in answers] == [201] * len(bodies), [a.text for a in answers if a.status_code != 201]
        owned = [frozenset(a.json()["placement"]["exclusive_cpus"]) for a in answers[::2]]
        assert all(len(cpus) == 1 for cpus in owned) and len(frozenset().union(*owned)) == len(owned)
        floating = [frozenset(a.json()["placement"]["vcpupin"]["0"]) for a in answers[1::2]]
        every_owned = frozenset().union(*owned)
        records = _records_equal_libvirt(client, connection)
        # the shared guests float off every pCPU a guest owns, in libvirt and on record, once all landed
        for record in records:
            if record["guest"].startswith("float-"):
                assert not set(record["placement"]["vcpupin"]["0"]) & every_owned, record
        assert all(pins for pins in floating)


def test_a_guest_that_fails_in_a_batch_fails_alone(database_url, tmp_path):
    with _serving(database_url, tmp_path) as (client, connection, groups):
        connection.defineXML(f"<domain type='test'><name>holder</name><uuid>{CLASH_UUID}</uuid>"
                             "<memory>16384</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain>")
        clash = (f"<domain type='qemu'><name>clash</name><uuid>{CLASH_UUID}</uuid>"
                 "<os><type>hvm</type></os></domain>")
        bodies = [
            {"name": "first", "vcpus": 1, "memory_mib": 16, "cpu_policy": "dedicated", "host": "t"},
            {"name": "before", "vcpus": 2, "memory_mib": 16, "cpu_policy": "dedicated", "host": "t"},
            {"name": "clash", "vcpus": 2, "memory_mib": 16, "cpu_policy": "dedicated", "host": "t",
             "base_xml": clash},  # libvirt refuses to define it: its UUID is taken
            {"name": "huge", "vcpus": 32, "memory_mib": 16, "cpu_policy": "dedicated", "host": "t"},  # no room
            {"name": "before", "vcpus": 1, "memory_mib": 16, "host": "t"},  # its name is taken in this batch
            {"name": "holder", "vcpus": 1, "memory_mib": 16, "host": "t"},  # a domain of that name exists
            {"name": "after", "vcpus": 2, "memory_mib": 16, "cpu_policy": "dedicated", "host": "t"},
        ]
        first, before, clashed, huge, twice, holder, after = _one_batch(client, groups, bodies)
        assert holder.status_code == 409 and holder.json()["error"]["code"] == "no-fit", holder.text
        assert [r["constraint"] for r in holder.json()["error"]["details"][0]["reasons"]] == ["name"]
        assert connection.lookupByName("holder").maxMemory() == 16384  # its definition is untouched
        assert first.status_code == before.status_code == after.status_code == 201
        assert clashed.status_code == 409 and clashed.json()["error"]["code"] == "exists", clashed.text
        assert huge.status_code == 409 and huge.json()["error"]["code"] == "no-fit", huge.text
        assert twice.status_code == 409 and twice.json()["error"]["code"] == "exists", twice.text
        for name in ("clash", "huge"):
            assert client.get(f"/v1/placements/{name}").status_code == 404  # no orphan record
            assert name not in connection.listDefinedDomains()  # no half-defined domain
        assert len(client.get("/v1/placements/before").json()["claims"]) == 2  # the first "before"
        records = _records_equal_libvirt(client, connection, foreign=("holder",))
        assert sorted(r["guest"] for r in records) == ["after", "before", "first"]
        claims = [set(r["claims"]) for r in records]
        assert sum(len(c) for c in claims) == len(set().union(*claims)) == 5  # no pCPU twice
        audit = client.get("/v1/audit", params={"limit": 50}).json()
        failed = [e for e in audit["entries"] if e["outcome"] == "failed"]
        assert [e["guest"] for e in failed if e["action"] == "define"] == ["clash"]


def _mixed_bodies() -> list[dict[str, Any]]:
    return [{**guest, "host": "t"} for guest in yaml.safe_load(REQUEST.read_text())["guests"]]


def _placed(answers) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    placed = {}
    for answer in answers:
        assert answer.status_code == 201, answer.text
        body = answer.json()
        placed[body["guest"]] = (body["placement"], body["narrowed"], body["narrowed_pins"])
    return placed


def _final(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {r["guest"]: (r["placement"]["vcpupin"], r["placement"]["emulatorpin"], r["placement"]["memory_nodes"],
                         r["claims"]) for r in records}


def test_a_batch_places_what_the_same_requests_one_at_a_time_would(database_url, tmp_path):
    bodies = [{"name": "lead", "vcpus": 1, "memory_mib": 1024, "host": "t"}, *_mixed_bodies()]
    with _serving(database_url, tmp_path, capabilities=str(CAPS)) as (client, connection, groups):
        alone = _placed([client.post("/v1/placements", json=body) for body in bodies])
        assert set(groups.batches) == {1}
        alone_records = _final(_records_equal_libvirt(client, connection))
        for name in alone:
            assert client.delete(f"/v1/placements/{name}").status_code == 200
        assert not connection.listDefinedDomains() and not client.get("/v1/placements").json()["placements"]
        together = _placed(_one_batch(client, groups, bodies))
        together_records = _final(_records_equal_libvirt(client, connection))
    for name in alone:  # the placements first (the clearer failure), then what each one narrowed
        assert together[name][0] == alone[name][0], name
        assert together[name] == alone[name], (name, together[name][1:], alone[name][1:])
    assert together_records == alone_records


def test_a_batch_whose_claim_another_instance_beats_places_its_guests_one_by_one(database_url, tmp_path,
                                                                                   monkeypatch):
    from dataclasses import replace

    from vmplacer.adapters.db.placements import SqlPlacementStore

    original = SqlPlacementStore.record_many
    rival: list[frozenset[int]] = []

    def beaten(self, host, uri, claims):  # type: ignore[no-untyped-def]
        """Another instance claims the batch's first guest's pCPUs just before the batch does."""
        if not rival and len(claims) > 1:
            first = claims[0][0]
            SqlPlacementStore(self._sessions, actor="other-instance").record(
                host, uri, replace(first, guest="rival"), {"name": "rival"})
            rival.append(frozenset(first.exclusive_cpus))
        return original(self, host, uri, claims)

    monkeypatch.setattr(SqlPlacementStore, "record_many", beaten)
    with _serving(database_url, tmp_path) as (client, connection, groups):
        bodies = [{"name": f"pin-{i}", "vcpus": 2, "memory_mib": 16, "cpu_policy": "dedicated", "host": "t"}
                  for i in range(5)]
        answers = _one_batch(client, groups, bodies)
        assert [a.status_code for a in answers] == [201] * len(bodies), [a.text for a in answers]
        assert rival and rival[0]
        owned = [frozenset(a.json()["placement"]["exclusive_cpus"]) for a in answers]
        assert sum(len(c) for c in owned) == len(frozenset().union(*owned))  # no pCPU twice
        assert not frozenset().union(*owned) & rival[0]  # the rival's claim won: nobody else has its pCPUs
        records = client.get("/v1/placements").json()["placements"]
        ours = [r for r in records if r["guest"] != "rival"]
        assert sorted(r["guest"] for r in ours) == sorted(d.name() for d in connection.listAllDomains())
        for record in ours:
            assert _live_placement(connection, record["guest"])["vcpupin"] == record["placement"]["vcpupin"]
