"""Freeze'nSense through the API: the profile job and reading stored distributions.

A profile run lasts seconds to hours, so POST /v1/profiles only queues a job;
the job runner runs it on the instance that holds the host's lease. Probes
(`cmd:` sources) are not offered here: the API never runs commands.
"""

from __future__ import annotations

import time
from typing import Any, TYPE_CHECKING

from vmplacer.api.errors import ApiError, field_problems
from vmplacer.api.times import api_time
from vmplacer.app.jobs import JobContext, JobFailed
from vmplacer.ports import DomainGone, HypervisorError

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices
    from vmplacer.app.profiler import ProfilerConfig

PROFILE_JOB = "profile"


def profiler_config(params: dict[str, Any], settings: Any) -> ProfilerConfig:
    """ProfilerConfig from request parameters and the settings' defaults; 422 naming the field."""
    from vmplacer.bootstrap.profiler_config import SensitiveSpecError
    from vmplacer.bootstrap.profiler_config import profiler_config as compose

    samples = params.get("samples")
    duration = params.get("duration_s")
    if samples is None and duration is None:
        samples = 20
    try:
        return compose(
            settings.profiler,
            t_m_s=params["t_m_ms"] / 1e3 if params.get("t_m_ms") else None,
            t_sleep_s=params.get("t_sleep_s"),
            max_freeze_s=params["max_freeze_ms"] / 1e3 if params.get("max_freeze_ms") else None,
            sensitive=params.get("sensitive") or None, vms=params.get("vms") or [],
            exclude=params.get("exclude") or (), scope=params.get("scope") or (),
            samples=samples, duration_s=duration, adaptive=bool(params.get("adaptive")),
            pair_probes=params.get("pair_probes"),
        )
    except SensitiveSpecError as exc:
        raise ApiError(422, "validation", str(exc), field_problems([("sensitive", str(exc))])) from None
    except ValueError as exc:
        text = str(exc)
        field = "t_m_ms" if "t_m" in text else "max_freeze_ms" if "max_freeze" in text else \
            "t_sleep_s" if "t_sleep" in text else "samples" if "samples" in text else \
            "pair_probes" if "pair_probes" in text else "body"
        raise ApiError(422, "validation", text, field_problems([(field, text)])) from None


def check_vms(host: Any, names: list[str]) -> None:
    """Named sensitive VMs must exist on the host (422 naming the missing ones)."""
    missing = []
    for name in names:
        try:
            host.domain_state(name)
        except DomainGone:
            missing.append(name)
    if missing:
        reason = f"not on host {host.name}: {', '.join(missing)}"
        raise ApiError(422, "validation", f"vms: {reason}", field_problems([("vms", reason)]))


class _Progress:
    """Job progress from the profiler's per-sample events (and the clock for --duration runs)."""

    def __init__(self, ctx: JobContext, samples: int | None, duration_s: float | None):
        self.ctx = ctx
        self.samples = samples
        self.duration_s = duration_s
        self.started = time.monotonic()
        self.vms: dict[str, tuple[int, int]] = {}

    def __call__(self, event: Any) -> None:
        self.vms[event.vm] = (event.zeta, event.zeta_b)
        fractions = []
        if self.samples:
            sensitive = [(z, zb) for z, zb in self.vms.values() if zb > 0] or list(self.vms.values())
            if sensitive:
                fractions.append(min(min(z, self.samples) + min(zb, self.samples)
                                     for z, zb in sensitive) / (2 * self.samples))
        if self.duration_s:
            fractions.append((time.monotonic() - self.started) / self.duration_s)
        fraction = min(max(fractions, default=0.0), 0.99)
        counts = ", ".join(f"{vm} ζ {z} ζb {zb}" for vm, (z, zb) in sorted(self.vms.items())[:8])
        self.ctx.progress(fraction, f"sampling: {counts}")


def profile_handler(services: ApiServices):
    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        from vmplacer.app.profiler import ProfilerError
        from vmplacer.bootstrap.profiler import build_profiler

        host = params["host"]
        try:
            config = profiler_config(params, services.settings)
        except ApiError as exc:
            raise JobFailed(exc.message, code="invalid", details=exc.details) from None
        ctx.progress(0.0, f"starting on host {host}")
        try:
            profiler, freezer = build_profiler(services.container, host, config, metric=params.get("metric"),
                                               on_progress=_Progress(ctx, config.samples, config.duration_s))
        except HypervisorError as exc:
            services.metrics.libvirt_error(exc)
            raise JobFailed(str(exc), code="host-unavailable", details={"host": exc.host or host}) from None
        try:
            result = profiler.run(stop=ctx.should_stop)
        except ProfilerError as exc:
            raise JobFailed(str(exc), code="invalid" if exc.bad_input else "failed", details={"host": host}) from None
        except HypervisorError as exc:
            services.metrics.libvirt_error(exc)
            raise JobFailed(str(exc), code="host-unavailable", details={"host": exc.host or host}) from None
        finally:
            freezer.close()
        services.metrics.profile_finished(host, result.span_ms)
        return result.to_dict()

    return run


def stored_profile(services: ApiServices, guest: str, run_id: int | None, host: str | None) -> dict[str, Any]:
    """ζ, ζb and degradation distributions of one VM from the stored samples of one run
    (the newest run holding samples of it, unless `run_id` says which)."""
    from vmplacer.bootstrap.profiler import profile_store
    from vmplacer.core.profile_stats import stored_summary

    store = profile_store(services.container)
    run = store.run(run_id) if run_id is not None else store.latest_run_with([guest], host)
    if run is None or (host is not None and run.host != host):
        what = f"run {run_id}" if run_id is not None else f"a profiling run with samples of {guest}"
        raise ApiError(404, "not-found", f"no {what}" + (f" on host {host}" if host else ""), {"guest": guest})
    samples = store.samples(run.id, guest)
    if not samples:
        raise ApiError(404, "not-found", f"guest {guest}: no samples in run {run.id}", {"guest": guest})
    summary = stored_summary(samples)
    summary.pop("values")

    return {
        "guest": guest,
        "run": {"id": run.id, "host": run.host, "metric": run.metric, "status": run.status,
                "started_at": api_time(run.started_at), "finished_at": api_time(run.finished_at),
                "parameters": run.parameters},
        "profile": summary,
    }
