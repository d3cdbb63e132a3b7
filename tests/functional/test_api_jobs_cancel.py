"""One cancel verb for every job kind, on SQLite and PostgreSQL: POST /v1/jobs/{id}/cancel ends a
queued job `cancelled` at once (its host free for a new job of its kind), stops a running profile
between its steps, cancels an apply job's plan; polling says when to look again; a job that
produced nothing says so."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.functional.test_api_helpers import make_container, roomy_test_driver

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from vmplacer.adapters.db.api import SqlTokenStore
from vmplacer.adapters.db.plans import SqlPlanStore
from vmplacer.api.app import create_app
from vmplacer.api.services import ApiOptions
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan

HOSTS = [{"name": "t", "uri": "test:///default", "domain_type": "qemu"}]
FINAL = ("succeeded", "failed", "cancelled")


@contextmanager
def _api(database_url: str, tmp_path, run_jobs: bool) -> Iterator[tuple[Any, Any]]:
    container = make_container(database_url, tmp_path, HOSTS)
    try:
        admin = SqlTokenStore(container.sessions).create("operator", "admin")
        app = create_app(container, ApiOptions(run_jobs=run_jobs, replay_freeze_journal=False,
                                               isolation_check_s=0))
        with TestClient(app, raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {admin}"
            yield client, container
    finally:
        container.close()


@pytest.fixture
def queued_only(database_url, tmp_path):
    """An instance that queues jobs but runs none (another instance would): jobs stay queued."""
    with _api(database_url, tmp_path, run_jobs=False) as pair:
        yield pair


@pytest.fixture
def running(database_url, tmp_path):
    """An instance with its job runner on libvirt's test driver."""
    with roomy_test_driver() as connection:
        connection.defineXML("<domain type='test'><name>busy</name><memory unit='MiB'>64</memory>"
                             "<vcpu>1</vcpu><os><type>hvm</type></os></domain>").create()
        with _api(database_url, tmp_path, run_jobs=True) as pair:
            yield pair


def _wait(client, job_id: str, until, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    job = client.get(f"/v1/jobs/{job_id}").json()
    while not until(job) and time.monotonic() < deadline:
        time.sleep(0.05)
        job = client.get(f"/v1/jobs/{job_id}").json()
    assert until(job), job
    return job


def test_a_queued_protection_cancelled_frees_its_host_at_once(queued_only):
    client, _ = queued_only
    first = client.post("/v1/protect", json={"host": "t"}).json()["job"]
    assert client.post("/v1/protect", json={"host": "t"}).status_code == 409  # one per host
    polled = client.get(f"/v1/jobs/{first['id']}")
    assert polled.json()["status"] == "queued" and polled.headers["Retry-After"] == "1"
    answer = client.post(f"/v1/jobs/{first['id']}/cancel")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "cancelled" and body["location"] == f"/v1/jobs/{first['id']}"
    job = body["job"]
    assert job["status"] == "cancelled" and job["error"]["code"] == "cancelled"
    assert job["parameters"]["stop"]["by"] == "api:operator" and job["finished_at"] is not None
    after = client.get(f"/v1/jobs/{first['id']}")
    assert after.json()["status"] == "cancelled" and "Retry-After" not in after.headers  # final: no more polling
    again = client.post("/v1/protect", json={"host": "t"})  # the host is free for a new protection
    assert again.status_code == 202, again.text
    # the old way (DELETE /v1/protect/{id}) is the same cancel for a queued job
    second = again.json()["job"]
    assert client.delete(f"/v1/protect/{second['id']}").status_code == 202
    assert client.get(f"/v1/jobs/{second['id']}").json()["status"] == "cancelled"
    assert client.post("/v1/protect", json={"host": "t"}).status_code == 202
    refused = client.post(f"/v1/jobs/{first['id']}/cancel")  # final already
    assert refused.status_code == 409 and refused.json()["error"]["details"][0]["status"] == "cancelled"
    assert client.post("/v1/jobs/00000000-0000-4000-8000-000000000000/cancel").status_code == 404
    assert client.post("/v1/jobs/not-a-job/cancel").status_code == 422
    listed = client.get("/v1/jobs", params={"status": "cancelled"}).json()["jobs"]
    assert {j["id"] for j in listed} == {first["id"], second["id"]}
    entries = client.get("/v1/audit", params={"action": "job-cancel"}).json()["entries"]
    assert [e["detail"]["job"] for e in entries] == [first["id"]] and entries[0]["actor"] == "api:operator"


def _stored_plan(container, state: str = "proposed") -> int:
    store = SqlPlanStore(container.sessions)
    live = Placement("busy", "t", {0: frozenset()})
    plan = store.save(Plan((Action(0, "repin", "t", "busy", before=live, after=live, reason="test"),), ("t",),
                           summary="1 no-op repin"))
    if state == "approved":
        assert store.transition(plan.id, "proposed", "approved")
    return plan.id


def test_cancelling_a_queued_apply_job_cancels_its_plan_and_the_other_way_round(queued_only):
    client, container = queued_only
    first = _stored_plan(container)
    job = client.post(f"/v1/plans/{first}/apply").json()["job"]
    assert client.get(f"/v1/plans/{first}").json()["state"] == "approved"
    answer = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert answer.status_code == 200 and answer.json()["job"]["status"] == "cancelled"
    plan = client.get(f"/v1/plans/{first}").json()
    assert plan["state"] == "cancelled" and plan["actions"][0]["state"] == "skipped"
    # the plan's own cancel takes its queued apply job with it
    second = _stored_plan(container)
    job = client.post(f"/v1/plans/{second}/apply").json()["job"]
    assert client.post(f"/v1/plans/{second}/cancel").json()["status"] == "cancelled"
    shown = client.get(f"/v1/jobs/{job['id']}").json()
    assert shown["status"] == "cancelled" and shown["parameters"]["stop"]["by"] == "api:operator"


def test_a_running_profile_stops_between_steps_and_ends_cancelled(running):
    client, _ = running
    started = client.post("/v1/profiles", json={"host": "t", "duration_s": 3600, "t_sleep_s": 0.2, "t_m_ms": 5})
    assert started.status_code == 202, started.text
    assert started.headers["Retry-After"] == "1"
    job_id = started.json()["job"]["id"]
    job = _wait(client, job_id, lambda j: j["status"] != "queued")
    assert job["status"] == "running", job
    polled = client.get(f"/v1/jobs/{job_id}")
    assert polled.headers["Retry-After"] == "1"
    answer = client.post(f"/v1/jobs/{job_id}/cancel")
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "cancel-requested" and answer.headers["Location"] == f"/v1/jobs/{job_id}"
    assert answer.headers["Retry-After"] == "1"
    job = _wait(client, job_id, lambda j: j["status"] in FINAL)
    assert job["status"] == "cancelled", job
    assert job["error"]["code"] == "cancelled" and "api:operator" in job["error"]["message"]
    result = job["result"]
    assert result["stopped_because"] == "stopped" and result["host"] == "t"  # not its hour: the cancel
    assert result["empty"] is True and "no sample" in result["empty_reason"]  # the test driver gives none
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 409
    # the host is free for the next profile
    again = client.post("/v1/profiles", json={"host": "t", "duration_s": 0.5, "t_sleep_s": 0.2, "t_m_ms": 5})
    assert again.status_code == 202, again.text
    done = _wait(client, again.json()["job"]["id"], lambda j: j["status"] in FINAL)
    # a profile that kept nothing succeeds, and says it produced nothing and why
    assert done["status"] == "succeeded" and done["result"]["empty"] is True, done
    assert done["result"]["empty_reason"] == "no sample was kept (duration reached)"


def test_an_apply_job_whose_plan_was_cancelled_elsewhere_ends_cancelled(queued_only):
    """The plan cancelled by another front end (the CLI) while its apply job waited: the job runs,
    finds nothing to apply and ends `cancelled`, saying it produced nothing."""
    from vmplacer.api.job_handlers import handlers
    from vmplacer.app.jobs import JobRunner
    from vmplacer.app.rebalance.rebalancer import cancel_plan

    client, container = queued_only
    plan_id = _stored_plan(container)
    job = client.post(f"/v1/plans/{plan_id}/apply").json()["job"]
    assert cancel_plan(container.plan_store, plan_id, by="cli:operator", reason="window closed").status == "cancelled"
    services = client.app.state.services
    runner = JobRunner(services.jobs, services.host_leases(), handlers(services), owner="runner-2", poll_s=0.05)
    runner.start()
    try:
        done = _wait(client, job["id"], lambda j: j["status"] in FINAL)
    finally:
        runner.stop()
    assert done["status"] == "cancelled" and done["error"]["code"] == "cancelled", done
    assert done["result"]["state"] == "cancelled" and done["result"]["empty"] is True
    assert done["result"]["empty_reason"] == "the plan was cancelled before it started"
