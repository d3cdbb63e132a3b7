"""Prometheus metrics at /metrics.

Two kinds:
- counters and histograms of what *this instance* did (requests, placements,
  freezes and their duration, libvirt errors, rebalance trials); sum them across
  instances;
- gauges read from the database at scrape time, the same on every instance
  (degradation per VM from the newest profiling run of each host, jobs by
  state, plan actions by outcome).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from vmplacer.core.rebalance.trial import CLOSE_CALLS, RULINGS, TRIAL_KINDS, Verdict

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FREEZE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


class DatabaseGauges(Collector):
    """Gauges computed from the database on each scrape; a failing query drops only its family."""

    def __init__(self, sources: Iterable[Callable[[], Iterable[GaugeMetricFamily]]]):
        self.sources = list(sources)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        for source in self.sources:
            try:
                yield from list(source())
            except Exception as exc:  # noqa: BLE001 - /metrics must answer even with the database down
                log.warning("metrics: %s skipped: %s", getattr(source, "__name__", source), exc)


class ApiMetrics:
    def __init__(self) -> None:
        disable_created_metrics()  # the *_created series only double what a scraper needs
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter("vmplacer_http_requests", "HTTP requests served",
                                     ("method", "route", "status"), registry=r)
        self.http_latency = Histogram("vmplacer_http_request_duration_seconds", "HTTP request latency",
                                      ("method", "route"), buckets=LATENCY_BUCKETS, registry=r)
        self.placements = Counter("vmplacer_placements", "placement requests by host, mode and outcome",
                                  ("host", "mode", "outcome"), registry=r)
        self.placement_latency = Histogram("vmplacer_placement_duration_seconds",
                                           "time to plan or make one placement", ("mode",),
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.freezes = Counter("vmplacer_freezes", "Freeze'nSense freezes (co-located domains suspended)",
                               ("host",), registry=r)
        self.freeze_time = Histogram("vmplacer_freeze_duration_seconds",
                                     "how long neighbours stayed frozen per freeze (first suspend to last resume)",
                                     ("host",), buckets=FREEZE_BUCKETS, registry=r)
        self.libvirt_errors = Counter("vmplacer_libvirt_errors", "libvirt operations that failed",
                                      ("host",), registry=r)
        self.jobs_finished = Counter("vmplacer_jobs_finished", "background jobs this instance finished",
                                     ("kind", "status"), registry=r)
        self.reconcile_findings = Counter("vmplacer_reconcile_findings",
                                          "reconcile findings by host, kind and outcome (applied, skipped, ...)",
                                          ("host", "kind", "outcome"), registry=r)
        self.rebalance_trials = Counter("vmplacer_rebalance_trials",
                                        "measured rebalance trials by host, kind (confirm, explore), verdict "
                                        "(kept, undone, unmeasured) and close call "
                                        "(no, measured_twice, second_probe_failed)",
                                        ("host", "kind", "verdict", "close_call"), registry=r)

    def add_database_gauges(self, *sources: Callable[[], Iterable[GaugeMetricFamily]]) -> None:
        self.registry.register(DatabaseGauges(sources))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ----- recording helpers ----------------------------------------------------------------------
    def libvirt_error(self, exc: Any) -> None:
        self.libvirt_errors.labels(getattr(exc, "host", "") or "unknown").inc()

    def rebalance_trial(self, host: str, kind: str, verdict: Verdict) -> None:
        """Count one trial's verdict. `host` is the trial probe's (the executor runs plans on
        configured hosts only); a kind outside TRIAL_KINDS (a stored plan edited by hand) is not
        counted, so the labels stay a closed set."""
        labels = (kind, verdict.ruling, verdict.close_call)
        if kind not in TRIAL_KINDS or verdict.ruling not in RULINGS or verdict.close_call not in CLOSE_CALLS:
            log.warning("metrics: trial on %s not counted: unknown labels %s", host, labels)
            return
        self.rebalance_trials.labels(host, *labels).inc()

    def profile_finished(self, host: str, span_ms: Iterable[float]) -> None:
        spans = list(span_ms)
        self.freezes.labels(host).inc(len(spans))
        for span in spans:
            self.freeze_time.labels(host).observe(span / 1e3)


def degradation_gauges(latest_results: Callable[[], list[tuple[str, dict[str, Any]]]]):
    """vmplacer_vm_degradation{host, guest} from (host, results) of the newest finished run per host."""

    def vm_degradation() -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "vmplacer_vm_degradation",
            "1 - zeta/zeta_b of each VM in the newest finished profiling run of its host (0 = no loss)",
            labels=("host", "guest"))
        for host, results in latest_results():
            for guest, summary in sorted((results.get("vms") or {}).items()):
                loss = (summary or {}).get("degradation") or {}
                estimate = loss.get("estimate")
                if isinstance(estimate, (int, float)):
                    family.add_metric((host, guest), float(estimate))
        yield family

    return vm_degradation


def job_gauges(counts: Callable[[], dict[tuple[str, str], int]]):
    def jobs() -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("vmplacer_jobs", "background jobs in the database by kind and status",
                                   labels=("kind", "status"))
        for (kind, status), n in sorted(counts().items()):
            family.add_metric((kind, status), n)
        yield family

    return jobs


def plan_action_gauges(counts: Callable[[], dict[str, int]]):
    def plan_actions() -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("vmplacer_plan_actions", "plan actions in the database by outcome",
                                   labels=("outcome",))
        for outcome, n in sorted(counts().items()):
            family.add_metric((outcome,), n)
        yield family

    return plan_actions


def trial_outcome_gauges(counts_since: Callable[[float], dict[tuple[str, str, str], int]],
                         now: Callable[[], float], window_s: float):
    """vmplacer_rebalance_trial_outcomes{host,kind,verdict}: the measured trials of every process
    (the timer's and operators' runs as well as the API's) finished in the last `window_s`, counted
    from the stored plans. A host whose count of undone trials keeps rising is one where the
    model's planned layouts keep measuring worse (docs/rebalance.md §2)."""

    def trial_outcomes() -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "vmplacer_rebalance_trial_outcomes",
            f"rebalance trials finished in the last {window_s:.0f} s by host, kind (confirm, explore) and "
            "verdict (kept, undone), from the stored plans of every process", labels=("host", "kind", "verdict"))
        for (host, kind, verdict), n in sorted(counts_since(now() - window_s).items()):
            if kind in TRIAL_KINDS:  # a stored plan edited by hand: keep the labels a closed set
                family.add_metric((host, kind, verdict), n)
        yield family

    return trial_outcomes


DISRUPTION_SPENT = ("trials", "trial_repins", "trials_waiting")  # plan notes' `disruption` keys shown
DISRUPTION_BUDGET = ("max_trials", "max_trial_repins", "max_moves_per_guest_hour", "max_frozen_share_per_guest_hour",
                     "max_migrations_in_flight")


def disruption_gauges(latest: Callable[[], Mapping[str, Any] | None], in_flight: Callable[[], int] | None = None):
    """vmplacer_rebalance_disruption{what} and vmplacer_rebalance_disruption_budget{what}: what the
    newest plan's trials spent of the disruption budget (trials, trial repins, trials left waiting
    for a later round) and the budget it was made under (its trials, moves per guest and hour,
    frozen share per guest and hour, migrations in flight), from the stored plans of every process
    (docs/disruption.md); vmplacer_rebalance_disruption_plan: that plan's id;
    vmplacer_rebalance_migrations_in_flight: the migrations this process runs now (`in_flight`,
    the process's migration slots unless given)."""
    if in_flight is None:
        from vmplacer.app.apply.migration_slots import PROCESS_SLOTS

        def in_flight() -> int:
            return PROCESS_SLOTS.in_flight

    def disruption() -> Iterable[GaugeMetricFamily]:
        found = latest() or {}
        spent = GaugeMetricFamily("vmplacer_rebalance_disruption",
                                  "what the newest plan's trials spent of the disruption budget, and trials left "
                                  "waiting for a later round", labels=("what",))
        budget = GaugeMetricFamily("vmplacer_rebalance_disruption_budget",
                                   "the disruption budget the newest plan was made under", labels=("what",))
        plan = GaugeMetricFamily("vmplacer_rebalance_disruption_plan", "the id of the plan the disruption figures are of")
        for what in DISRUPTION_SPENT:
            if isinstance(found.get(what), (int, float)):
                spent.add_metric((what,), float(found[what]))
        for what in DISRUPTION_BUDGET:
            if isinstance(found.get(what), (int, float)) and not isinstance(found[what], bool):
                budget.add_metric((what.removeprefix("max_"),), float(found[what]))
        if isinstance(found.get("plan_id"), int):
            plan.add_metric((), float(found["plan_id"]))
        flying = GaugeMetricFamily("vmplacer_rebalance_migrations_in_flight",
                                   "migrations this process runs now (rebalance.disruption.max_migrations_in_flight)")
        flying.add_metric((), float(in_flight()))
        yield spent
        yield budget
        yield plan
        yield flying

    return disruption


def maintenance_gauges(host_names: Callable[[], Iterable[str]], in_maintenance: Callable[[], Iterable[str]]):
    """vmplacer_host_maintenance{host}: 1 while a configured host is in maintenance (alert on hosts left so)."""

    def host_maintenance() -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("vmplacer_host_maintenance",
                                   "1 while the host is in maintenance (no new guests, no migrations in)",
                                   labels=("host",))
        closed = set(in_maintenance())
        for host in host_names():
            family.add_metric((host,), 1.0 if host in closed else 0.0)
        yield family

    return host_maintenance


def freeze_rescue_metrics(summary: Callable[[], tuple[dict[str, int], float]]):
    """Domains resumed by someone other than the freezer's own code path, by cause, and the
    longest pause past its cap (from the audit log: every process's rescues, the guardian's too)."""

    def freeze_rescues() -> Iterable[Any]:
        resumed, worst_s = summary()
        counter = CounterMetricFamily(
            "vmplacer_freeze_rescued_domains",
            "domains resumed by the freeze guardian or a journal replay, by cause "
            "(deadline, parent-died, start, housekeeping, guard, profiler)", labels=("cause",))
        for cause, n in sorted(resumed.items()):
            counter.add_metric((cause,), n)
        yield counter
        yield GaugeMetricFamily("vmplacer_freeze_overrun_max_seconds",
                                "the longest a rescued freeze kept a domain paused beyond its cap",
                                value=worst_s)

    return freeze_rescues


def throttle_gauges(records: Callable[[], Iterable[Any]]):
    """vmplacer_throttle_share{host, guest, protects}: the CPU share of each guest vmplacer throttled
    (the throttle ledger), and whom it protects; vmplacer_throttle_age_seconds the time since it changed."""

    def throttles() -> Iterable[GaugeMetricFamily]:
        share = GaugeMetricFamily("vmplacer_throttle_share",
                                  "CPU share (quota/period) of each guest vmplacer throttled, by the guest it protects",
                                  labels=("host", "guest", "protects"))
        age = GaugeMetricFamily("vmplacer_throttle_age_seconds", "seconds since the throttle last changed",
                                labels=("host", "guest", "protects"))
        for record in records():
            key = (record.host, record.guest, record.protects)
            share.add_metric(key, float(record.bandwidth.share))
            age.add_metric(key, float(record.age_s))
        yield share
        yield age

    return throttles


PROTECT_STALE_S = 900.0  # a host whose loop recorded no round for this long is not shown


def protect_metrics(latest: Callable[[], Iterable[dict[str, Any]]], now: Callable[[], float]):
    """Per protected guest, from the newest round each host's protection loop recorded:
    vmplacer_protect_ratio (smoothed ζ/ζb), vmplacer_protect_floor, the counters
    vmplacer_protect_throttles_applied_total and vmplacer_protect_below_floor_seconds_total (since that
    loop started); per host the loop's frozen share over its budget window, its budget and the
    age of its last round."""

    def protect() -> Iterable[Any]:
        guest_labels = ("host", "guest")
        ratio = GaugeMetricFamily("vmplacer_protect_ratio", "smoothed ζ/ζb of each protected guest (latest round)",
                                  labels=guest_labels)
        floor = GaugeMetricFamily("vmplacer_protect_floor", "ζ/ζb floor the protection loop holds",
                                  labels=guest_labels)
        applied = CounterMetricFamily("vmplacer_protect_throttles_applied",
                                      "throttle steps applied for each protected guest since its loop started",
                                      labels=guest_labels)
        below = CounterMetricFamily("vmplacer_protect_below_floor_seconds",
                                    "seconds each protected guest spent below its floor since its loop started",
                                    labels=guest_labels)
        frozen = GaugeMetricFamily("vmplacer_protect_freeze_share",
                                   "neighbours' frozen time over wall time in the loop's budget window",
                                   labels=("host",))
        budget = GaugeMetricFamily("vmplacer_protect_freeze_budget", "the most frozen share the loop allows itself",
                                   labels=("host",))
        age = GaugeMetricFamily("vmplacer_protect_last_round_age_seconds",
                                "seconds since the host's protection loop last recorded a round", labels=("host",))
        moment = now()
        for record in latest():
            host = str(record.get("host"))
            since = moment - float(record.get("at", 0.0))
            if since > PROTECT_STALE_S:
                continue
            age.add_metric((host,), since)
            spend = record.get("budget") or {}
            if "share" in spend:
                frozen.add_metric((host,), float(spend["share"]))
                budget.add_metric((host,), float(spend["max_share"]))
            for guest, stats in sorted((record.get("guests") or {}).items()):
                key = (host, guest)
                if stats.get("ratio") is not None:
                    ratio.add_metric(key, float(stats["ratio"]))
                floor.add_metric(key, float(stats["floor"]))
                applied.add_metric(key, float(stats.get("throttles_applied", 0)))
                below.add_metric(key, float(stats.get("below_floor_s", 0.0)))
        yield from (ratio, floor, applied, below, frozen, budget, age)

    return protect


def isolation_gauges(latest: Callable[[], dict[str, int | None]]):
    """vmplacer_isolation_violations{host}: threads (vCPUs, emulators) that may run on another guest's
    exclusive or the host's reserved pCPUs, as the last periodic check found them; a host that could
    not be read is left out (its age says so)."""

    def isolation() -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("vmplacer_isolation_violations",
                                   "threads allowed onto another guest's exclusive or a reserved pCPU (last check)",
                                   labels=("host",))
        for host, count in sorted(latest().items()):
            if count is not None:
                family.add_metric((host,), float(count))
        yield family

    return isolation
