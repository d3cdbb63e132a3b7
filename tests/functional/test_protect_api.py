"""The protection loop as an API job: POST /v1/protect queues it (auth, idempotency, one per
host, audit), GET shows it, DELETE asks it to stop; the job runner runs the loop on a simulated
host until stopped, and the stop releases every throttle it set."""

from __future__ import annotations

import time
import warnings
from types import SimpleNamespace

import pytest

from tests.functional.test_api_helpers import make_container

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from vmplacer.adapters.db.api import SqlJobStore, SqlTokenStore
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlanStore
from vmplacer.adapters.db.throttles import SqlThrottleLedger
from vmplacer.lab.simulator import SimCluster
from vmplacer.api.app import create_app
from vmplacer.api.routes.protect import PROTECT_JOB, protect_handler
from vmplacer.api.services import ApiOptions
from vmplacer.app.jobs import JobRunner
from vmplacer.app.protect.loop import Measurement, ProtectLoop
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer
from vmplacer.core.protect.decisions import LoopSettings
from vmplacer.core.protect.policy import MIN_SHARE_LABEL, PROTECT_LABEL
from vmplacer.core.topology.host import uniform_topology


@pytest.fixture
def api(database_url, tmp_path):
    container = make_container(database_url, tmp_path, [{"name": "t", "uri": "test:///default"}])
    tokens = SqlTokenStore(container.sessions)
    admin, reader = tokens.create("operator", "admin"), tokens.create("viewer", "read")
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
    with TestClient(app, raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {admin}"
        yield client, reader
    container.close()


def test_post_get_delete_a_protection_job(api):
    client, reader = api
    started = client.post("/v1/protect", json={"host": "t", "scope": ["web*", "batch*"], "samples": 3},
                          headers={"Idempotency-Key": "p1"})
    assert started.status_code == 202, started.text
    job = started.json()["job"]
    assert (job["kind"], job["hosts"], job["status"]) == ("protect", ["t"], "queued")
    assert started.headers["Location"] == f"/v1/protect/{job['id']}"
    replay = client.post("/v1/protect", json={"host": "t", "scope": ["web*", "batch*"], "samples": 3},
                         headers={"Idempotency-Key": "p1"})
    assert replay.status_code == 202 and replay.json()["job"]["id"] == job["id"]  # the first answer again
    busy = client.post("/v1/protect", json={"host": "t"})
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "busy"
    status = client.get(f"/v1/protect/{job['id']}")
    assert status.status_code == 200, status.text
    assert status.json()["host"] == "t" and status.json()["guests"] == [] and status.json()["throttles"] == []
    denied = client.post("/v1/protect", json={"host": "t"}, headers={"Authorization": f"Bearer {reader}"})
    assert denied.status_code == 403
    assert client.post("/v1/protect", json={"host": "nope"}).status_code == 422
    assert client.post("/v1/protect", json={"host": "t", "samples": 0}).status_code == 422
    stopped = client.delete(f"/v1/protect/{job['id']}")
    assert stopped.status_code == 202 and stopped.json()["job"]["parameters"]["stop"]["by"] == "api:operator"
    assert stopped.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert client.get(f"/v1/protect/{job['id']}").status_code == 404  # the protection is gone ...
    assert client.delete(f"/v1/protect/{job['id']}").status_code == 404
    assert client.get(f"/v1/jobs/{job['id']}").json()["parameters"]["stop"]  # ... its job tells how it ended
    missing = client.delete("/v1/protect/00000000-0000-4000-8000-000000000000")
    assert missing.status_code == 404
    audit = client.get("/v1/audit", params={"limit": 20}).json()
    actions = {entry["action"] for entry in audit["entries"]}
    assert {"protect-queued", "protect-stop"} <= actions


class _PacedClock:
    """The simulator's clock, slept on in small real steps so the runner's threads get a turn."""

    def __init__(self, clock):
        self._clock = clock

    def now(self) -> float:
        return self._clock.now()

    def sleep(self, seconds: float) -> None:
        self._clock.sleep(seconds)
        time.sleep(0.005)


def test_the_runner_runs_the_loop_until_deleted_and_the_stop_releases_its_throttles(migrated_url):
    engine = make_engine(migrated_url)
    sessions = make_session_factory(engine)
    sim = SimCluster(seed=3, noise=0.0)
    host = sim.add_host("h1", uniform_topology(nodes=1, cores_per_node=2, name="h1"))
    host.define_domain("web", workload="spin", vcpupin=[0], labels={PROTECT_LABEL: "0.8"})
    host.define_domain("batch", workload="spin", vcpupin=[0], labels={MIN_SHARE_LABEL: "0.2"})
    jobs, leases = SqlJobStore(sessions), SqlLeaseStore(sessions)
    services = SimpleNamespace(jobs=jobs, instance="instance-1", options=SimpleNamespace(lease_ttl_s=30.0),
                               container=SimpleNamespace(sessions=sessions, lease_store=leases,
                                                         throttle_ledger=SqlThrottleLedger(sessions)),
                               metrics=SimpleNamespace(libvirt_error=lambda exc: None))
    clock = _PacedClock(sim.clock)

    def build(_container, host_name, *, scope, samples, t_m_s, holder):
        plans = SqlPlanStore(sessions)
        rebalancer = Rebalancer(
            RebalancePorts(hosts=dict(sim.hosts), plans=plans, leases=leases, clock=clock,
                           audit=SqlPlacementStore(sessions), throttles=SqlThrottleLedger(sessions)),
            holder=holder,
        )
        sim_host = sim.hosts[host_name]
        return ProtectLoop(sim_host, measure=lambda names, n: Measurement({g: sim_host.true_performance(g)
                                                                             for g in names}),
                           ledger=SqlThrottleLedger(sessions), plans=plans,
                           apply=lambda plan_id: rebalancer.apply(plan_id, lease_ttl_s=30.0, wait_s=0.0),
                           clock=clock, wall=clock.now, settings=LoopSettings(step=0.1, release_after=2))

    runner = JobRunner(jobs, leases, {PROTECT_JOB: protect_handler(services, build=build)}, owner="instance-1",
                       lease_ttl_s=30.0, poll_s=0.05)
    runner.start()
    try:
        job = runner.submit(PROTECT_JOB, ["h1"], {"host": "h1", "samples": 5}, "tester")
        deadline = time.monotonic() + 120

        def held() -> tuple[float, bool]:  # one reading of both: the loop runs on meanwhile
            return host.true_performance("web"), host.cpu_bandwidth("batch").limited

        reading = held()
        while not (reading[0] >= 0.8 and reading[1]) and time.monotonic() < deadline:
            time.sleep(0.05)
            reading = held()
        assert reading[0] >= 0.8 and reading[1], f"web's performance, batch throttled: {reading}"
        assert jobs.get(job.id).status == "running"
        assert leases.holders(["h1"])["h1"]["holder"] == "instance-1"  # the job keeps its lease between plans
        jobs.request_stop(job.id, "operator")
        while not (jobs.get(job.id) or job).done and time.monotonic() < deadline:
            time.sleep(0.05)
        done = jobs.get(job.id)
        assert done.status == "succeeded", done.error
        assert done.result["released"] == ["batch"] and done.result["stopped_by"] == "operator"
        assert not host.cpu_bandwidth("batch").limited and SqlThrottleLedger(sessions).current() == []
    finally:
        runner.stop()
        engine.dispose()
