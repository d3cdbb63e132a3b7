"""Background jobs: long work (profiling, applying a plan) never blocks a request.

A job is a database row first (`queued`), so any vmplacer instance sharing the
database may run it: each instance's runner polls the queue, takes the lease
of every host the job touches (one instance acts on a host at a time, fleet
wide), claims the row with a conditional update, and runs the handler on a
worker thread. While a job runs its leases are renewed and its row gets a
heartbeat; when an instance dies, its leases expire and its running jobs are
failed as abandoned by whichever instance notices first, and queued work on
those hosts is picked up by the others.

Jobs on one host run one at a time, in the order they were queued.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from vmplacer.ports import JobRecord, JobStore, LeaseStore

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL_S = 30.0
POLL_S = 1.0
PROGRESS_EVERY_S = 0.5  # progress writes are throttled; the last one always lands
LEASE_SAFETY = 0.8  # stop a job whose leases were not confirmed for this share of the TTL


class JobFailed(Exception):
    """Raised by a handler to fail its job with a message and structured details."""

    def __init__(self, message: str, *, code: str = "failed", details: Any = None):
        super().__init__(message)
        self.code = code
        self.details = details


class JobCancelled(Exception):
    """Raised by a handler that stopped early because its job was cancelled: the job ends
    `cancelled`, keeping what it produced so far as its result."""

    def __init__(self, message: str, *, result: dict[str, Any] | None = None):
        super().__init__(message)
        self.result = result


@dataclass
class JobContext:
    """What a handler gets besides its parameters: progress reporting and a stop flag."""

    job: JobRecord
    report: Callable[[float, str], None]
    stop_event: threading.Event

    def progress(self, fraction: float, message: str = "") -> None:
        self.report(fraction, message)

    def should_stop(self) -> bool:
        """True when the runner shuts down or lost a lease: stop acting on the host."""
        return self.stop_event.is_set()


Handler = Callable[[dict[str, Any], JobContext], dict[str, Any]]


@dataclass
class _Running:
    job: JobRecord
    leased_at: float  # when its leases were last confirmed (monotonic)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_progress_at: float = 0.0
    pending_progress: tuple[float, str] | None = None
    stop_reason: str = ""

    def halt(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()


class JobRunner:
    def __init__(
        self,
        store: JobStore,
        leases: LeaseStore,
        handlers: Mapping[str, Handler],
        *,
        owner: str,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        poll_s: float = POLL_S,
        max_workers: int = 4,
        on_finished: Callable[[JobRecord, str, dict[str, Any] | None], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if lease_ttl_s <= 0:
            raise ValueError(f"lease TTL must be positive, got {lease_ttl_s}")
        self.store = store
        self.leases = leases
        self.handlers = dict(handlers)
        self.owner = owner
        self.lease_ttl_s = lease_ttl_s
        self.poll_s = poll_s
        self.on_finished = on_finished or (lambda _job, _status, _result: None)
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="vmplacer-job")
        self._max_workers = max_workers
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._busy_hosts: set[str] = set()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_renew = -float("inf")

    # ----- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="vmplacer-jobs", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop taking work, ask running handlers to stop, wait, release every lease."""
        self._stopping.set()
        self._wake.set()
        with self._lock:
            for running in self._running.values():
                running.halt(f"instance {self.owner} is shutting down")
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ----- API side -----------------------------------------------------------------------------
    def submit(self, kind: str, hosts: list[str], parameters: dict[str, Any], created_by: str) -> JobRecord:
        if kind not in self.handlers:
            raise ValueError(f"unknown job kind {kind!r} (known: {', '.join(sorted(self.handlers))})")
        job = self.store.create(kind, hosts, parameters, created_by)
        self._wake.set()
        return job

    def wake(self) -> None:
        """Look at the queue now (a job was queued by someone else, e.g. the API)."""
        self._wake.set()

    def running_ids(self) -> list[str]:
        with self._lock:
            return list(self._running)

    # ----- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a database hiccup must not kill the runner
                log.exception("job runner: tick failed; retrying")
            self._stop_unconfirmed()
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def tick(self) -> None:
        """One pass: renew leases and heartbeats, fail abandoned jobs, start queued ones."""
        now = self.clock()
        if now - self._last_renew >= self.lease_ttl_s / 3:
            self._renew()
            self._last_renew = now
            reaped = self.store.reap(stale_s=2 * self.lease_ttl_s)
            for job_id in reaped:
                log.warning("job %s failed: its instance stopped reporting", job_id)
        self._flush_progress()
        self._dispatch()

    def _renew(self) -> None:
        """Renew the leases of running jobs. A job whose leases cannot be confirmed (taken
        over, or the database unreachable) for most of a TTL is told to stop: after the
        TTL another instance may act on its hosts."""
        with self._lock:
            running = list(self._running.values())
        for item in running:
            hosts = list(item.job.hosts)
            if not hosts:
                item.leased_at = self.clock()
                continue
            try:
                held = self.leases.renew(hosts, self.owner, self.lease_ttl_s)
            except Exception as exc:  # noqa: BLE001 - judged by the age check below
                log.warning("job %s: lease renewal failed: %s", item.job.id, exc)
            else:
                if not held:
                    log.error("job %s: lost the lease of %s; stopping it", item.job.id, ", ".join(hosts))
                    item.halt(f"lost the lease of host(s) {', '.join(hosts)}")
                else:
                    item.leased_at = self.clock()
        self.store.heartbeat(self.owner, [item.job.id for item in running])

    def _stop_unconfirmed(self) -> None:
        now = self.clock()
        with self._lock:
            running = list(self._running.values())
        for item in running:
            if not item.stop.is_set() and now - item.leased_at > LEASE_SAFETY * self.lease_ttl_s:
                log.error("job %s: leases unconfirmed for %.0f s; stopping it", item.job.id, now - item.leased_at)
                item.halt(f"its host leases could not be renewed for {now - item.leased_at:.0f} s")

    def _dispatch(self) -> None:
        if self._stopping.is_set():
            return
        with self._lock:
            free = self._max_workers - len(self._running)
        if free <= 0:
            return
        # Jobs run in queue order per host: once a job is passed over for a busy host, no later
        # job of that host may start in this pass (the host may free up halfway through it).
        passed_over: set[str] = set()
        for job in self.store.queued(limit=50):
            if free <= 0 or self._stopping.is_set():
                break
            if job.kind not in self.handlers:
                continue  # another vmplacer version's job: leave it to an instance that knows it
            if set(job.hosts) & passed_over:
                continue
            with self._lock:
                busy = bool(set(job.hosts) & self._busy_hosts)
            if busy or not self.leases.acquire(list(job.hosts), self.owner, self.lease_ttl_s):
                passed_over.update(job.hosts)  # busy here, or another instance acts on one of its hosts
                continue
            if not self.store.claim(job.id, self.owner):
                self._release(job.hosts)
                continue
            claimed = self.store.get(job.id) or job
            running = _Running(claimed, leased_at=self.clock())
            with self._lock:
                self._running[job.id] = running
                self._busy_hosts.update(job.hosts)
            free -= 1
            self._pool.submit(self._run, running)

    def _release(self, hosts: list[str] | tuple[str, ...]) -> None:
        if not hosts:
            return
        try:
            self.leases.release(list(hosts), self.owner)
        except Exception:  # noqa: BLE001 - they expire anyway
            log.warning("leases of %s not released; they expire in %g s", ", ".join(hosts), self.lease_ttl_s)

    # ----- running one job ------------------------------------------------------------------------
    def _run(self, running: _Running) -> None:
        job = running.job
        handler = self.handlers[job.kind]
        context = JobContext(job, lambda f, m: self._report(running, f, m), running.stop)
        status, result = "failed", None
        error: dict[str, object] | None = None
        try:
            result = handler(dict(job.parameters), context)
            status = "succeeded"
            if running.stop.is_set():  # it returned early because it was told to stop
                status = "failed"
                error = {"code": "interrupted", "message": f"stopped before the end: {running.stop_reason}"}
        except JobCancelled as exc:
            status, result = "cancelled", exc.result
            error = {"code": "cancelled", "message": str(exc)}
        except JobFailed as exc:
            error = {"code": exc.code, "message": str(exc), "details": exc.details}
        except Exception as exc:  # noqa: BLE001 - the job fails, the runner goes on
            log.exception("job %s (%s) crashed", job.id, job.kind)
            error = {"code": "internal", "message": f"{exc.__class__.__name__}: {exc}"}
        try:
            self._flush_one(running)
            if not self.store.finish(job.id, self.owner, status, result, error):
                log.warning("job %s: finished after it was failed as abandoned; result not stored", job.id)
        except Exception:  # noqa: BLE001
            log.exception("job %s: could not store its outcome", job.id)
        finally:
            with self._lock:
                self._running.pop(job.id, None)
                self._busy_hosts.difference_update(job.hosts)
            self._release(job.hosts)
            self._wake.set()
        try:
            self.on_finished(job, status, result)
        except Exception:  # noqa: BLE001
            log.exception("job %s: on_finished hook failed", job.id)

    def _report(self, running: _Running, fraction: float, message: str) -> None:
        with running.lock:
            running.pending_progress = (fraction, message)
            due = self.clock() - running.last_progress_at >= PROGRESS_EVERY_S
        if due:
            self._flush_one(running)

    def _flush_one(self, running: _Running) -> None:
        with running.lock:
            pending = running.pending_progress
            if pending is None:
                return
            running.pending_progress = None
            running.last_progress_at = self.clock()
        self.store.progress(running.job.id, self.owner, pending[0], pending[1])

    def _flush_progress(self) -> None:
        with self._lock:
            running = list(self._running.values())
        for item in running:
            try:
                self._flush_one(item)
            except Exception:  # noqa: BLE001
                log.warning("job %s: progress not stored", item.job.id)
