"""The job runner and host leases on a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from sqlalchemy import update

from vmplacer.adapters.db.api import SqlJobStore
from vmplacer.adapters.db.plans import SqlLeaseStore
from vmplacer.adapters.db.models import HostLeaseRow, JobRow, utcnow
from vmplacer.app.jobs import JobFailed, JobRunner


def _wait(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


# ----- leases (the store the runner shares with `vmplacer rebalance`) ------------------------------


def _live(leases) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {h: info["holder"] for h, info in leases.holders().items() if info["live"]}


def test_a_lease_has_one_holder_until_it_expires(sessions):
    leases = SqlLeaseStore(sessions)
    assert leases.acquire(["h1"], "a", 30)
    assert leases.acquire(["h1"], "a", 30)  # re-entrant for its holder
    assert not leases.acquire(["h1"], "b", 30)
    assert not leases.acquire(["h0", "h1"], "b", 30) and "h0" not in _live(leases)  # all or none
    assert leases.renew(["h1"], "a", 30) and not leases.renew(["h1"], "b", 30)
    leases.release(["h1"], "b")  # not b's to release
    assert _live(leases) == {"h1": "a"}
    leases.release(["h1"], "a")
    assert leases.acquire(["h1"], "b", 30)
    with sessions() as session:  # b crashed: it stops renewing, the lease runs out
        session.execute(update(HostLeaseRow).where(HostLeaseRow.host == "h1").values(
            expires_at=utcnow() - timedelta(seconds=1)))
        session.commit()
    assert _live(leases) == {}
    assert leases.acquire(["h1"], "c", 30)
    assert not leases.renew(["h1"], "b", 30)


def test_racing_instances_never_share_a_lease(sessions):
    leases = SqlLeaseStore(sessions)
    for round_ in range(5):
        host = f"race{round_}"
        barrier = threading.Barrier(8)

        def contend(i: int) -> bool:
            barrier.wait()
            return leases.acquire([host], f"instance-{i}", 30)

        with ThreadPoolExecutor(8) as pool:
            winners = [i for i, won in enumerate(pool.map(contend, range(8))) if won]
        assert len(winners) == 1, winners
        assert _live(leases)[host] == f"instance-{winners[0]}"


# ----- the runner ---------------------------------------------------------------------------------


class _Recorder:
    """Handlers that note when they ran, to check one job per host at a time, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[tuple[str, str, float, float]] = []  # (host, label, start, end)

    def handler(self, params, ctx):  # type: ignore[no-untyped-def]
        start = time.monotonic()
        for step in range(4):
            ctx.progress(step / 4, f"step {step}")
            time.sleep(params.get("sleep", 0.05))
        if params.get("fail"):
            raise JobFailed("asked to fail", code="test", details={"label": params["label"]})
        if params.get("crash"):
            raise RuntimeError("boom")
        with self.lock:
            self.spans.append((params["host"], params["label"], start, time.monotonic()))
        return {"label": params["label"]}


def test_jobs_run_in_order_one_per_host_and_record_outcomes(sessions):
    store, leases, recorder = SqlJobStore(sessions), SqlLeaseStore(sessions), _Recorder()
    runner = JobRunner(store, leases, {"work": recorder.handler}, owner="runner-1", lease_ttl_s=10,
                       poll_s=0.05, max_workers=4)
    jobs = []
    for i in range(6):
        host = "h1" if i % 2 == 0 else "h2"
        jobs.append(runner.submit("work", [host], {"host": host, "label": f"{host}-{i}"}, "tester"))
    failing = runner.submit("work", ["h3"], {"host": "h3", "label": "f", "fail": True}, "tester")
    crashing = runner.submit("work", ["h3"], {"host": "h3", "label": "c", "crash": True}, "tester")
    runner.start()
    try:
        assert _wait(lambda: all(store.get(j.id).done for j in [*jobs, failing, crashing]))
    finally:
        runner.stop()
    for job in jobs:
        done = store.get(job.id)
        assert done.status == "succeeded" and done.progress == 1.0 and done.owner == "runner-1"
        assert done.result == {"label": job.parameters["label"]}
    failed = store.get(failing.id)
    assert failed.status == "failed" and failed.error["code"] == "test"
    assert failed.error["details"] == {"label": "f"}
    crashed = store.get(crashing.id)
    assert crashed.status == "failed" and "boom" in crashed.error["message"]
    for host in ("h1", "h2"):
        spans = sorted((s for s in recorder.spans if s[0] == host), key=lambda s: s[2])
        assert [s[1] for s in spans] == [j.parameters["label"] for j in jobs if j.hosts == (host,)]
        for before, after in zip(spans, spans[1:]):
            assert before[3] <= after[2], f"jobs on {host} overlapped"
    assert _live(leases) == {}  # every lease released after its job


def test_abandoned_jobs_are_failed_and_their_hosts_taken_over(sessions):
    store, leases, recorder = SqlJobStore(sessions), SqlLeaseStore(sessions), _Recorder()
    # a dead instance: claimed a job and holds the host's lease, then stopped renewing both
    dead_job = store.create("work", ["h1"], {"host": "h1", "label": "dead"}, "tester")
    assert leases.acquire(["h1"], "dead-instance", 30) and store.claim(dead_job.id, "dead-instance")
    queued = store.create("work", ["h1"], {"host": "h1", "label": "next"}, "tester")
    runner = JobRunner(store, leases, {"work": recorder.handler}, owner="survivor", lease_ttl_s=2,
                       poll_s=0.05)
    runner.start()
    try:
        time.sleep(0.5)
        assert store.get(queued.id).status == "queued"  # h1 is still leased to the dead instance
        with sessions() as session:  # ... until its lease and heartbeat run out
            past = utcnow() - timedelta(seconds=10)
            session.execute(update(HostLeaseRow).where(HostLeaseRow.host == "h1").values(expires_at=past))
            session.execute(update(JobRow).where(JobRow.id == dead_job.id).values(heartbeat_at=past))
            session.commit()
        assert _wait(lambda: store.get(queued.id).done)
        assert _wait(lambda: store.get(dead_job.id).done, timeout=10)
    finally:
        runner.stop()
    assert store.get(queued.id).status == "succeeded" and store.get(queued.id).owner == "survivor"
    abandoned = store.get(dead_job.id)
    assert abandoned.status == "failed" and abandoned.error["code"] == "abandoned"
    assert "dead-instance" in abandoned.message


def test_a_job_that_loses_its_lease_is_stopped(sessions):
    store, leases = SqlJobStore(sessions), SqlLeaseStore(sessions)
    stopped = threading.Event()

    def long_job(params, ctx):  # type: ignore[no-untyped-def]
        while not ctx.should_stop():
            time.sleep(0.02)
        stopped.set()
        return {"partial": True}

    runner = JobRunner(store, leases, {"long": long_job}, owner="a", lease_ttl_s=0.6, poll_s=0.05)
    job = runner.submit("long", ["h1"], {}, "tester")
    runner.start()
    try:
        assert _wait(lambda: store.get(job.id).status == "running")
        with sessions() as session:  # someone else took the host (e.g. after a long pause of ours)
            session.execute(update(HostLeaseRow).where(HostLeaseRow.host == "h1").values(holder="b"))
            session.commit()
        assert stopped.wait(10)
        assert _wait(lambda: store.get(job.id).done)
    finally:
        runner.stop()
    done = store.get(job.id)
    assert done.status == "failed" and done.error["code"] == "interrupted"
    assert "lost the lease of host(s) h1" in done.error["message"]
    assert done.result == {"partial": True}


# ----- idempotency keys -----------------------------------------------------------------------------


def test_idempotency_keys_replay_refuse_and_expire(sessions):
    from vmplacer.adapters.db.api import SqlIdempotencyStore

    store = SqlIdempotencyStore(sessions)
    first = store.begin("ops", "k1", "f" * 64, "POST", "/v1/placements")
    assert first.outcome == "new"
    assert store.begin("ops", "k1", "f" * 64, "POST", "/v1/placements").outcome == "pending"
    store.finish(first.row_id, 201, "application/json", '{"guest": "g1"}',
                 [("location", "/v1/placements/g1"), ("retry-after", "5")])
    again = store.begin("ops", "k1", "f" * 64, "POST", "/v1/placements")
    assert (again.outcome, again.status, again.body) == ("replay", 201, '{"guest": "g1"}')
    assert again.headers == (("location", "/v1/placements/g1"), ("retry-after", "5"))  # replayed with the body
    assert store.begin("ops", "k1", "e" * 64, "POST", "/v1/placements").outcome == "mismatch"
    assert store.begin("viewer", "k1", "e" * 64, "POST", "/v1/placements").outcome == "new"  # per token
    failed = store.begin("ops", "k2", "a" * 64, "POST", "/v1/profiles")
    store.abandon(failed.row_id)  # a 5xx: the retry runs again
    assert store.begin("ops", "k2", "a" * 64, "POST", "/v1/profiles").outcome == "new"
    # a first attempt whose instance died while serving it is taken over after the timeout
    stale = SqlIdempotencyStore(sessions, pending_timeout_s=0.0)
    assert stale.begin("ops", "k2", "a" * 64, "POST", "/v1/profiles").outcome == "new"
    assert SqlIdempotencyStore(sessions, retention_s=0.0).purge() >= 3
    assert store.begin("ops", "k1", "e" * 64, "POST", "/v1/placements").outcome == "new"


def test_a_host_freed_halfway_through_a_dispatch_pass_keeps_its_queue_order(sessions):
    """h1 is busy when the pass looks at its first job and frees up before it reaches the
    second: the second must not overtake the first."""
    store, leases = SqlJobStore(sessions), SqlLeaseStore(sessions)
    runner = JobRunner(store, leases, {"work": lambda job, ctx: {}}, owner="runner-1", lease_ttl_s=10,
                       poll_s=60, max_workers=4)
    first = runner.submit("work", ["h1"], {"label": "first"}, "tester")
    other = runner.submit("work", ["h2"], {"label": "other"}, "tester")
    second = runner.submit("work", ["h1"], {"label": "second"}, "tester")
    runner._busy_hosts.add("h1")  # a job on h1 is running
    real_acquire = leases.acquire

    def acquire(hosts, owner, ttl):
        if hosts == ["h2"]:
            runner._busy_hosts.discard("h1")  # ... and ends while the pass is at h2's job
        return real_acquire(hosts, owner, ttl)

    leases.acquire = acquire
    runner._dispatch()
    runner.stop()
    assert store.get(other.id).status != "queued"
    assert store.get(first.id).status == "queued" and store.get(second.id).status == "queued"
