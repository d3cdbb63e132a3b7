"""A rebalance dry run as a job (`POST /v1/plans?wait=S`), on SQLite and PostgreSQL: 201 with the
plan when it is ready within S seconds, else 202 with the `plan` job whose result is the plan; a
bad request is refused before anything is queued."""

from __future__ import annotations

import pytest

from tests.functional.test_api_helpers import roomy_test_driver
from tests.functional.test_api_jobs_cancel import FINAL, _api, _wait


@pytest.fixture
def running(database_url, tmp_path):
    with roomy_test_driver(), _api(database_url, tmp_path, run_jobs=True) as pair:
        yield pair


def test_a_dry_run_as_a_job_answers_the_plan_or_the_job(running):
    client, _ = running
    queued = client.post("/v1/plans", params={"wait": 0}, json={"hosts": ["t"]})
    assert queued.status_code == 202, queued.text
    job = queued.json()["job"]
    assert job["kind"] == "plan" and job["hosts"] == [] and job["parameters"]["hosts"] == ["t"]
    assert queued.headers["Location"] == f"/v1/jobs/{job['id']}" and queued.headers["Retry-After"] == "1"
    done = _wait(client, job["id"], lambda j: j["status"] in FINAL)
    assert done["status"] == "succeeded", done
    plan = done["result"]
    # the test driver has nothing worth moving: the plan is empty, and the job says it produced nothing
    assert plan["state"] == "empty" and plan["hosts"] == ["t"]
    assert plan["empty"] is True and plan["empty_reason"] == "nothing worth doing was found"
    assert client.get(f"/v1/plans/{plan['id']}").json()["summary"] == plan["summary"]
    waited = client.post("/v1/plans", params={"wait": 30}, json={"hosts": ["t"]},
                         headers={"Idempotency-Key": "plan-t-1"})
    assert waited.status_code == 201, waited.text
    assert waited.json()["state"] == "empty" and waited.headers["Location"] == f"/v1/plans/{waited.json()['id']}"
    replay = client.post("/v1/plans", params={"wait": 30}, json={"hosts": ["t"]},
                         headers={"Idempotency-Key": "plan-t-1"})
    assert replay.status_code == 201 and replay.json()["id"] == waited.json()["id"]
    entries = client.get("/v1/audit", params={"action": "rebalance-propose"}).json()["entries"]
    assert {e["detail"]["plan_id"] for e in entries} == {plan["id"], waited.json()["id"]}
    assert all(e["actor"] == "api:operator" for e in entries)
    jobs = client.get("/v1/jobs", params={"kind": "plan"}).json()["jobs"]
    assert len(jobs) == 2 and {j["status"] for j in jobs} == {"succeeded"}
    # refused before anything is queued
    unknown = client.post("/v1/plans", params={"wait": 5}, json={"hosts": ["nowhere"]})
    assert unknown.status_code == 422 and unknown.json()["error"]["details"][0]["field"] == "hosts"
    for bad in ("-1", "31", "nan", "soon"):
        refused = client.post("/v1/plans", params={"wait": bad}, json={"hosts": ["t"]})
        assert refused.status_code == 422 and refused.json()["error"]["details"][0]["field"] == "query.wait", bad
    assert len(client.get("/v1/jobs", params={"kind": "plan"}).json()["jobs"]) == 2
    plain = client.post("/v1/plans", json={"hosts": ["t"]})  # without `wait`: the dry run in the request
    assert plain.status_code == 201 and plain.json()["state"] == "empty"
