"""Fleet mode: two `vmplacer serve` instances on one PostgreSQL share the hosts' work.

Both serve the same two hosts (libvirt's test driver; each process has its
own). Jobs are queued through either instance and run by whichever takes the
host's lease first. Checked while they run: a host's running job always
belongs to the lease holder, and two jobs on one host never overlap. Then
the instance running a long job is killed (SIGKILL): the other one takes the
host over once the lease expires, fails the orphaned job as abandoned, and
runs new work there.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import create_engine, select

from tests.functional.test_api_helpers import Server, scratch_database, wait_job, write_config
from vmplacer.adapters.db.models import HostLeaseRow, JobRow

TTL = 3.0
HOSTS = ("t1", "t2")


@pytest.fixture
def fleet(tmp_path):
    with scratch_database("postgresql", tmp_path) as url:
        config = write_config(tmp_path, url, [{"name": h, "uri": "test:///default"} for h in HOSTS])
        a = Server(config, tmp_path, instance="fleet-a", lease_ttl_s=TTL).start()
        b = Server(config, tmp_path, instance="fleet-b", lease_ttl_s=TTL)
        b.admin, b.read = a.admin, a.read  # one token store for the fleet
        b.start(tokens=False)
        engine = create_engine(url)
        try:
            yield a, b, engine
        finally:
            for server in (a, b):
                server.stop()
            engine.dispose()


class _Watcher(threading.Thread):
    """Samples leases and running jobs straight from the database."""

    def __init__(self, engine) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.engine = engine
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.samples = 0
        self.holders_seen: dict[str, set[str]] = {h: set() for h in HOSTS}

    def run(self) -> None:
        while not self.stop.is_set():
            # one snapshot for both reads: read committed would let a job start (lease taken,
            # then status running) between them and look like a job without its lease
            with self.engine.connect().execution_options(isolation_level="REPEATABLE READ") as connection, \
                    connection.begin():
                leases = {r.host: r for r in connection.execute(select(HostLeaseRow))}
                running = list(connection.execute(select(JobRow).where(JobRow.status == "running")))
            for job in running:
                for host in job.hosts:
                    lease = leases.get(host)
                    if lease is None or lease.holder != job.owner:
                        self.violations.append(f"job {job.id} on {host} run by {job.owner}, lease holder "
                                               f"{lease.holder if lease else None}")
                    else:
                        self.holders_seen[host].add(job.owner)
            self.samples += 1
            time.sleep(0.02)


def test_two_instances_share_hosts_and_take_over_after_a_crash(fleet):
    a, b, engine = fleet
    watcher = _Watcher(engine)
    watcher.start()
    job_ids = []
    try:
        for round_ in range(4):
            submitted = []
            for index, host in enumerate(HOSTS):
                via = (a, b)[(round_ + index) % 2]
                with via.client() as client:
                    answer = client.post("/v1/profiles", json={"host": host, "duration_s": 0.6, "t_sleep_s": 0.1})
                    assert answer.status_code == 202, answer.text
                    submitted.append(answer.json()["job"]["id"])
                    busy = client.post("/v1/profiles", json={"host": host, "duration_s": 0.6})
                    assert busy.status_code == 409  # seen by both instances: the queue is shared
            with a.client() as client:
                for job_id in submitted:
                    assert wait_job(client, job_id, 60)["status"] == "succeeded"
            job_ids += submitted
    finally:
        watcher.stop.set()
        watcher.join()
    assert watcher.samples > 20 and not watcher.violations, watcher.violations[:5]
    with engine.connect() as connection:
        jobs = list(connection.execute(select(JobRow).where(JobRow.id.in_(job_ids))))
    assert {j.owner for j in jobs} == {"fleet-a", "fleet-b"}  # both did work (each runs what it queued first)
    for host in HOSTS:
        spans = sorted((j.started_at, j.finished_at) for j in jobs if host in j.hosts)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start, f"two jobs acted on {host} at once"
    with a.client() as client:  # leases are released between jobs; the host list shows them
        assert all(h["lease"] is None for h in client.get("/v1/hosts").json()["hosts"])

    # --- a long job, then its instance dies ---
    with a.client() as client:
        long_job = client.post("/v1/profiles", json={"host": "t1", "duration_s": 120, "t_sleep_s": 0.1}).json()
        job_id = long_job["job"]["id"]
        deadline = time.monotonic() + 30
        while client.get(f"/v1/jobs/{job_id}").json()["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        owner = client.get(f"/v1/jobs/{job_id}").json()["owner"]
        lease = {h["name"]: h["lease"] for h in client.get("/v1/hosts").json()["hosts"]}["t1"]
        assert lease["holder"] == owner
    doomed, survivor = (a, b) if owner == "fleet-a" else (b, a)
    killed_at = time.monotonic()
    doomed.kill()
    with survivor.client() as client:
        # the orphan is failed once its heartbeat is 2 TTLs old; then t1 takes new work
        orphan = wait_job(client, job_id, timeout=10 * TTL)
        assert orphan["status"] == "failed" and orphan["error"]["code"] == "abandoned"
        assert owner in orphan["message"]
        answer = client.post("/v1/profiles", json={"host": "t1", "duration_s": 0.3, "t_sleep_s": 0.1})
        assert answer.status_code == 202, answer.text
        rerun = wait_job(client, answer.json()["job"]["id"], timeout=30)
    took_over_after = time.monotonic() - killed_at
    assert rerun["status"] == "succeeded" and rerun["owner"] == survivor.instance
    assert TTL <= took_over_after < 10 * TTL, took_over_after
