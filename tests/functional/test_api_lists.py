"""Every list pages by an opaque cursor, newest first, with its filters applied by the database,
on SQLite and PostgreSQL: walking the pages yields each row once, in the documented order; a
cursor that was altered, belongs to another list or to other filters is a 422 naming it."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import update

from tests.functional.test_api_helpers import admin_client, roomy_test_driver
from vmplacer.adapters.db.models import AuditRow, JobRow
from vmplacer.adapters.db.plans import SqlPlanStore
from vmplacer.core.rebalance.plan import Plan

HOSTS = [{"name": "t", "uri": "test:///default", "domain_type": "qemu"}]


@pytest.fixture
def api(database_url, tmp_path):
    with roomy_test_driver(), admin_client(database_url, tmp_path, HOSTS) as client:
        yield client, client.app.state.services.container


def _walk(client, path: str, key: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every row of a list by following `next` from the first page; checks the Link header."""
    rows: list[dict[str, Any]] = []
    answer = client.get(path, params=params)
    for _ in range(1000):
        assert answer.status_code == 200, answer.text
        body = answer.json()
        rows += body[key]
        if body["next"] is None:
            assert body["next_cursor"] is None and "Link" not in answer.headers
            return rows
        assert len(body[key]) == params["limit"]
        assert answer.headers["Link"] == f'<{body["next"]}>; rel="next"'
        assert f"cursor={body['next_cursor']}" in body["next"]
        answer = client.get(body["next"])
    raise AssertionError("the pages never ended")


def _place(client, name: str, labels: dict[str, str]) -> None:
    answer = client.post("/v1/placements", json={"name": name, "vcpus": 1, "memory_mib": 64, "host": "t",
                                                 "define": False, "labels": labels})
    assert answer.status_code == 201, answer.text


def test_placements_page_newest_first_and_filter_by_state_host_and_labels(api):
    client, _ = api
    for i in range(7):
        _place(client, f"g{i}", {"env": "prod" if i % 2 else "dev", "tier": str(i % 3)})
    everything = client.get("/v1/placements").json()
    assert [p["guest"] for p in everything["placements"]] == [f"g{i}" for i in reversed(range(7))]
    assert everything["next"] is None
    walked = _walk(client, "/v1/placements", "placements", {"limit": 2})
    assert [p["guest"] for p in walked] == [p["guest"] for p in everything["placements"]]
    prod = _walk(client, "/v1/placements", "placements", {"limit": 1, "label": "env=prod"})
    assert [p["guest"] for p in prod] == ["g5", "g3", "g1"]
    both = client.get("/v1/placements", params=[("label", "env=prod"), ("label", "tier=0")]).json()
    assert [p["guest"] for p in both["placements"]] == ["g3"]
    assert client.get("/v1/placements", params={"label": "env=staging"}).json()["placements"] == []
    assert len(client.get("/v1/placements", params={"state": "planned", "host": "t"}).json()["placements"]) == 7
    assert client.get("/v1/placements", params={"state": "running"}).json()["placements"] == []
    for bad, field in (("env", "query.label.0"), ("-x=1", "query.label.0"), ("env=", "query.label.0")):
        refused = client.get("/v1/placements", params={"label": bad})
        assert refused.status_code == 422 and refused.json()["error"]["details"][0]["field"] == field, bad
    twice = client.get("/v1/placements", params=[("label", "env=a"), ("label", "env=b")])
    assert twice.status_code == 422 and twice.json()["error"]["details"][0]["rule"] == "label_filter"
    assert client.get("/v1/placements", params={"state": "gone"}).status_code == 422
    # a guest placed between two pages is newer than the cursor: it neither shifts nor repeats a page
    first = client.get("/v1/placements", params={"limit": 3}).json()
    _place(client, "late", {"env": "prod"})
    rest = _walk(client, first["next"].split("?")[0], "placements",
                 {"limit": 3, "cursor": first["next_cursor"]})
    assert [p["guest"] for p in first["placements"] + rest] == [f"g{i}" for i in reversed(range(7))]


def test_jobs_page_by_creation_time_then_id_and_filter_by_status(api):
    client, container = api
    jobs = container.job_store
    made = [jobs.create("profile", ["t"], {"n": i}, "tester") for i in range(9)]
    for job in made[:3]:
        jobs.cancel(job.id, "tester")
    same = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with container.sessions() as session:  # four jobs of one moment: their ids order them
        session.execute(update(JobRow).where(JobRow.id.in_([j.id for j in made[4:8]])).values(created_at=same))
        session.commit()
    everything = client.get("/v1/jobs").json()["jobs"]
    order = [j["id"] for j in everything]
    assert sorted(order) == sorted(j.id for j in made)
    with container.sessions() as session:  # the stored moments, to the microsecond
        stored = {row.id: row.created_at for row in session.query(JobRow)}
    assert order == sorted(stored, key=lambda job_id: (stored[job_id], job_id), reverse=True)
    tied = [job_id for job_id in order if job_id in {j.id for j in made[4:8]}]
    assert order[-4:] == tied == sorted(tied, reverse=True)  # the oldest moment, by id
    for size in (1, 2, 4):
        assert [j["id"] for j in _walk(client, "/v1/jobs", "jobs", {"limit": size})] == order
    cancelled = _walk(client, "/v1/jobs", "jobs", {"limit": 2, "status": "cancelled"})
    assert {j["id"] for j in cancelled} == {j.id for j in made[:3]}
    queued_or_cancelled = client.get("/v1/jobs", params=[("status", "queued"), ("status", "cancelled")]).json()
    assert len(queued_or_cancelled["jobs"]) == 9
    assert client.get("/v1/jobs", params={"status": "succeeded"}).json()["jobs"] == []
    assert client.get("/v1/jobs", params={"kind": "apply-plan"}).json()["jobs"] == []


def test_plans_page_by_id_and_filter_by_state(api):
    client, container = api
    store = SqlPlanStore(container.sessions)
    ids = [store.save(Plan((), ("t",), summary=f"plan {i}")).id for i in range(5)]
    for plan_id in ids[:2]:
        assert store.transition(plan_id, "proposed", "approved")
    walked = _walk(client, "/v1/plans", "plans", {"limit": 2})
    assert [p["id"] for p in walked] == sorted(ids, reverse=True)
    approved = _walk(client, "/v1/plans", "plans", {"limit": 1, "state": "approved"})
    assert [p["id"] for p in approved] == sorted(ids[:2], reverse=True)


def test_audit_until_and_since_are_applied_by_the_database(api):
    client, container = api
    start = datetime(2026, 3, 1, tzinfo=timezone.utc)
    with container.sessions() as session:
        rows = [AuditRow(actor="tester", action="probe", outcome="ok", message=f"entry {i}", detail={"i": i},
                         at=start + timedelta(hours=i)) for i in range(10)]
        session.add_all(rows)
        session.commit()
        ids = [row.id for row in rows]
    # the newest entries by id are the oldest by time: `until` must not stop at the first page of ids
    with container.sessions() as session:
        for row_id, hours in zip(ids, range(9, -1, -1)):
            session.execute(update(AuditRow).where(AuditRow.id == row_id).values(at=start + timedelta(hours=hours)))
        session.commit()
    until = client.get("/v1/audit", params={"action": "probe", "until": "2026-03-01T02:00:00Z", "limit": 2}).json()
    assert [e["at"] for e in until["entries"]] == ["2026-03-01T00:00:00Z", "2026-03-01T01:00:00Z"]
    assert [e["id"] for e in until["entries"]] == ids[-1:-3:-1]
    window = _walk(client, "/v1/audit", "entries", {"action": "probe", "since": "2026-03-01T03:00:00+01:00",
                                                    "until": "2026-03-01T06:00:00Z", "limit": 2})
    assert sorted(e["at"][11:13] for e in window) == ["02", "03", "04", "05", "06"]  # +01:00: 02:00 UTC on
    assert [e["id"] for e in window] == sorted((e["id"] for e in window), reverse=True)
    older = client.get("/v1/audit", params={"action": "probe", "before_id": ids[5]}).json()["entries"]
    assert [e["id"] for e in older] == list(reversed(ids[:5]))  # the older way to page still works
    both = client.get("/v1/audit", params={"before_id": ids[5], "cursor": until["next_cursor"]})
    assert both.status_code == 422 and both.json()["error"]["details"][0]["field"] == "query.before_id"


def _refusal(client, path: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = client.get(path, params=params)
    assert answer.status_code == 422, answer.text
    (problem,) = answer.json()["error"]["details"]
    assert problem["field"] == "query.cursor", problem
    return problem


def test_a_cursor_altered_or_used_elsewhere_is_refused_naming_it(api):
    client, container = api
    for i in range(3):
        container.job_store.create("profile", ["t"], {"n": i}, "tester")
    cursor = client.get("/v1/jobs", params={"limit": 1}).json()["next_cursor"]
    assert cursor
    raw = bytearray(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    for position in (0, len(raw) // 2, len(raw) - 1):  # any byte changed: the checksum no longer matches
        altered = bytearray(raw)
        altered[position] ^= 0x01
        token = base64.urlsafe_b64encode(bytes(altered)).decode().rstrip("=")
        assert _refusal(client, "/v1/jobs", {"limit": 1, "cursor": token})["rule"] == "cursor_invalid"
    for junk in ("x", "AAAA", cursor[:-2], "not+base64"):
        answer = client.get("/v1/jobs", params={"cursor": junk})
        assert answer.status_code == 422, junk
        assert answer.json()["error"]["details"][0]["field"] == "query.cursor", junk
    assert _refusal(client, "/v1/plans", {"cursor": cursor})["rule"] == "cursor_mismatch"  # another list's
    assert _refusal(client, "/v1/jobs", {"cursor": cursor, "status": "queued"})["rule"] == "cursor_mismatch"
    assert client.get("/v1/jobs", params={"cursor": cursor, "limit": 50}).status_code == 200  # page size may change
