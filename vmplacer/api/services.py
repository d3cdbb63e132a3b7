"""What the routes use, built once per application from the composition root.

Kept apart from the routes so tests and the benchmark can build an app on any
settings, and so `vmplacer serve` wires exactly what the tests exercise.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vmplacer.api.auth import TokenVerifier
from vmplacer.api.hostcache import MAINTENANCE_TTL_S, HostSnapshots, SnapshotStore, TimedValue
from vmplacer.api.metrics import (
    ApiMetrics,
    degradation_gauges,
    freeze_rescue_metrics,
    isolation_gauges,
    job_gauges,
    maintenance_gauges,
    plan_action_gauges,
    trial_outcome_gauges,
    disruption_gauges,
    protect_metrics,
    throttle_gauges,
)
from vmplacer.app.place.fleet_placement import SurveyMemo
from vmplacer.app.jobs import DEFAULT_LEASE_TTL_S, JobRunner
from vmplacer.bootstrap import Container
from vmplacer.ports import LeaseStore

if TYPE_CHECKING:
    from vmplacer.app.observe.freeze import Freezer
    from vmplacer.app.observe.profiler import Profiler, ProfilerConfig
    from vmplacer.app.protect.loop import ProtectLoop
    from vmplacer.app.rebalance.rebalancer import Rebalancer

log = logging.getLogger(__name__)

HOUSEKEEPING_EVERY_S = 600.0
# /metrics counts the rebalance trials finished this long ago at most: a day, the trials' memory.
TRIAL_OUTCOME_WINDOW_S = 86400.0
# How often `serve` checks each host's live pinning against the isolation invariant (a domain
# pinned by hand onto another guest's exclusive pCPU shows in /metrics and the log within this).
ISOLATION_CHECK_EVERY_S = 60.0
# Freeze journal rows whose owner and guardian both died (a cgroup kill) are replayed this often.
FREEZE_REPLAY_EVERY_S = 1.0
# Synchronous routes (and their database connections) running at once: the server container's
# pool (bootstrap.container.SERVER_POOL_SIZE + SERVER_POOL_OVERFLOW) holds one connection for each.
REQUEST_THREADS = 40


def instance_name() -> str:
    """host:pid:random — unique per process, readable in lease rows and job owners."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class ApiOptions:
    instance: str = field(default_factory=instance_name)
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    run_jobs: bool = True  # False: this instance only queues jobs, others run them
    job_workers: int = 4
    request_threads: int = REQUEST_THREADS  # threads running synchronous routes at once
    replay_freeze_journal: bool = True
    isolation_check_s: float = ISOLATION_CHECK_EVERY_S  # 0: no periodic isolation check


class ApiServices:
    def __init__(self, container: Container, options: ApiOptions | None = None):
        self.container = container
        self.settings = container.settings
        self.options = options or ApiOptions()
        self.instance = self.options.instance
        self.metrics = ApiMetrics()
        from vmplacer.api.placing import admit_host

        self.placement = container.placement_service(admit_host=admit_host(self))
        store = container.placement_store
        self.snapshots = HostSnapshots(container.hypervisor, store.occupied_and_refusals,
                                       every_host_records=getattr(store, "every_host_occupied_and_refusals", None))
        self.dry_run_maintenance = TimedValue(lambda: dict(container.maintenance.current()), MAINTENANCE_TTL_S)
        # Dry runs place on host snapshots, rendered and held to the XML policy like real placements.
        self.dry_runs = container.placement_service(SnapshotStore(self.snapshots))
        self.survey_memo = SurveyMemo()  # the fleet's rooms while no snapshot changed (host choice)
        self.token_store = container.token_store
        self.tokens = TokenVerifier(self.token_store.verify)
        self.idempotency = container.idempotency_store
        self.jobs = container.job_store
        self.runner: JobRunner | None = None
        self._housekeeping_stop = threading.Event()
        self._housekeeping: threading.Thread | None = None
        self.isolation: dict[str, int | None] = {}  # host -> violations at the last check (None: unreadable)
        self.metrics.add_database_gauges(
            isolation_gauges(lambda: dict(self.isolation)),
            degradation_gauges(self.latest_profile_results),
            job_gauges(self.jobs.counts),
            plan_action_gauges(self.plan_action_counts),
            trial_outcome_gauges(container.plan_store.trial_counts, time.time, TRIAL_OUTCOME_WINDOW_S),
            disruption_gauges(container.plan_store.latest_disruption),
            maintenance_gauges(lambda: self.host_names, lambda: container.maintenance.current().keys()),
            freeze_rescue_metrics(self.freeze_rescues),
            throttle_gauges(container.throttle_ledger.current),
            protect_metrics(self.protect_rounds, time.time),
        )

    @property
    def base_xml_limit(self) -> int:
        """Longest base XML accepted: half the request limit leaves room for the rest of the body."""
        from vmplacer.api.schemas import MAX_BASE_XML

        return min(MAX_BASE_XML, self.settings.api.max_request_bytes // 2)

    @property
    def host_names(self) -> list[str]:
        return [h.name for h in self.settings.hosts]

    # ----- what the routes' jobs build: the routes never call the composition root themselves --
    def rebalancer(self, holder: str) -> Rebalancer:
        """The rebalancer as the CLI builds it (stored model, learning, vCPU demand, probes),
        acting under `holder` in the host leases; its trials count in this instance's metrics."""
        from vmplacer.bootstrap.rebalance import build_rebalancer

        return build_rebalancer(self.container, holder=holder, on_trial=self.metrics.rebalance_trial)

    def profiler(self, host: str, config: ProfilerConfig, **options: Any) -> tuple[Profiler, Freezer]:
        """A ready profiler for `host` (options as `bootstrap.profiler.build_profiler`'s)."""
        from vmplacer.bootstrap.profiler import build_profiler

        return build_profiler(self.container, host, config, **options)

    def protect_loop(self, host: str, **options: Any) -> ProtectLoop:
        """A ready protection loop for `host` (options as `bootstrap.protect.build_protect_loop`'s)."""
        from vmplacer.bootstrap.protect import build_protect_loop

        return build_protect_loop(self.container, host, **options)

    # ----- background work -------------------------------------------------------------------
    def start(self, leases: LeaseStore | None = None) -> None:
        """Replay the freeze journal, close plans a stopped process left running, then start
        taking jobs."""
        if self.options.replay_freeze_journal:
            self._replay_freeze_journal()
        self._close_orphaned_plans()
        self._housekeeping = threading.Thread(target=self._housekeep, name="vmplacer-housekeeping", daemon=True)
        self._housekeeping.start()
        threading.Thread(target=self.snapshots.keep_fresh, args=(lambda: self.host_names, self._housekeeping_stop),
                         name="vmplacer-host-snapshots", daemon=True).start()
        if self.options.replay_freeze_journal:
            threading.Thread(target=self._replay_freezes_every_second, name="vmplacer-freeze-replay",
                             daemon=True).start()
        if self.options.isolation_check_s > 0:
            threading.Thread(target=self._check_isolation_periodically, name="vmplacer-isolation",
                             daemon=True).start()
        if not self.options.run_jobs:
            return
        from vmplacer.api.job_handlers import handlers

        self.runner = JobRunner(
            self.jobs, leases or self.host_leases(), handlers(self),
            owner=self.instance, lease_ttl_s=self.options.lease_ttl_s,
            max_workers=self.options.job_workers, on_finished=self._job_finished)
        self.runner.start()

    def stop(self) -> None:
        self._housekeeping_stop.set()
        if self.runner is not None:
            self.runner.stop()
            self.runner = None

    def _housekeep(self) -> None:
        """Forget idempotency keys past their retention and close plans left running by a stopped
        process (one restarted at once finds its predecessor's leases still live), now and then."""
        while not self._housekeeping_stop.wait(HOUSEKEEPING_EVERY_S):
            self._close_orphaned_plans()
            try:
                purged = self.idempotency.purge()
                if purged:
                    log.info("purged %d expired idempotency keys", purged)
            except Exception as exc:  # noqa: BLE001 - next round
                log.warning("housekeeping failed: %s", exc)

    def host_leases(self) -> LeaseStore:
        return self.container.lease_store

    def _replay_freeze_journal(self, cause: str = "start", hosts: dict[str, Any] | None = None) -> None:
        """Resume domains a killed vmplacer process left paused (before serving anything, then
        every second: what killed a freezer and its guardian together may strike any time)."""
        try:
            from vmplacer.bootstrap.profiler import replay_freeze_journal

            report = replay_freeze_journal(self.container, cause=cause, hosts=hosts)
        except Exception as exc:  # noqa: BLE001 - report it; the API still serves
            log.error("freeze journal replay failed: %s", exc)
            return
        for host, domain in report.resumed:
            log.warning("resumed %s on %s: left paused by an interrupted freeze", domain, host)
        for error in report.errors:
            log.error("freeze journal replay: %s", error)

    def _replay_freezes_every_second(self) -> None:
        hosts: dict[str, Any] = {}  # libvirt handles kept between rounds
        while not self._housekeeping_stop.wait(FREEZE_REPLAY_EVERY_S):
            self._replay_freeze_journal("housekeeping", hosts)

    def _check_isolation_periodically(self) -> None:
        while not self._housekeeping_stop.wait(self.options.isolation_check_s):
            self.check_isolation()

    def check_isolation(self) -> dict[str, int | None]:
        """Each configured host's live pinning (and reservations) against the isolation invariant:
        the count goes to /metrics, each violation found to the log. Returns host -> count."""
        from vmplacer.core.reconcile import isolation_findings

        for name in self.host_names:
            try:
                host = self.container.hypervisor(name)
                records = [r for r in self.container.placement_store.records(name) if r.state == "planned"]
                findings = isolation_findings(name, host.topology(), records, host.domains(),
                                              emulator_cpus=self.container.allocation_options(name).emulator_cpus)
            except Exception as exc:  # noqa: BLE001 - one unreadable host; the next round tries again
                log.warning("isolation check of host %s failed: %s", name, exc)
                self.isolation[name] = None
                continue
            for finding in findings:
                log.warning("isolation: %s", finding.detail)
            self.isolation[name] = len(findings)
        return dict(self.isolation)

    def freeze_rescues(self) -> tuple[dict[str, int], float]:
        return self.container.freeze_rescue_summary()

    def _close_orphaned_plans(self) -> None:
        """End plans left `running` by a process that stopped (no live lease on their hosts) as failed."""
        try:
            closed = self.container.plan_store.close_orphaned(f"api:{self.instance}")
        except Exception as exc:  # noqa: BLE001 - report it; the API still serves
            log.error("closing plans left running by a stopped process failed: %s", exc)
            return
        for plan_id in closed:
            log.warning("plan %s closed as failed: the process applying it stopped", plan_id)

    def _job_finished(self, job: Any, status: str, result: dict[str, Any] | None) -> None:
        self.metrics.jobs_finished.labels(job.kind, status).inc()
        for host in job.hosts:
            self.snapshots.invalidate(host)

    # ----- database-derived metrics -----------------------------------------------------------
    def latest_profile_results(self) -> list[tuple[str, dict[str, Any]]]:
        return self.container.profile_store.latest_results()

    def protect_rounds(self) -> list[dict[str, Any]]:
        """The newest round each configured host's protection loop recorded (the history files)."""
        from vmplacer.adapters.protect_history import ProtectHistory

        history = ProtectHistory.in_data_dir(self.settings.data_dir)
        return [record for host in self.host_names if (record := history.latest(host)) is not None]

    def plan_action_counts(self) -> dict[str, int]:
        return self.container.plan_store.action_counts()
