"""Freeze'nSense: start a profiling job, read a VM's distributions.

A profile run lasts seconds to hours, so POST /v1/profiles only queues a job;
the job runner runs it on the instance that holds the host's lease. Probes
(`cmd:` sources) are not offered here: the API never runs commands.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic_core import PydanticCustomError

from vmplacer.api.deps import SensitiveSpecError, Services, compose_profiler_config
from vmplacer.api.actors import api_actor, audit
from vmplacer.api.errors import COMMON_RESPONSES, CONFLICT, HOST_ERROR, NOT_FOUND, ApiError, field_problems
from vmplacer.api.fields import DOMAIN_NAME_MAX_BYTES, DOMAIN_NAME_PATTERN, DOMAIN_NAME_RULE, check_domain_name
from vmplacer.api.placing import Placer
from vmplacer.api.job_views import accepted, check_can_queue, outcome
from vmplacer.api.schemas import HOST_NAME, JobAccepted, ProfileRequest, ProfileView
from vmplacer.api.strict_json import StrictJsonRoute
from vmplacer.api.times import api_timestamp
from vmplacer.app.jobs import JobCancelled, JobContext, JobFailed
from vmplacer.ports import DomainGone, HypervisorError

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices
    from vmplacer.app.observe.profiler import ProfilerConfig

router = APIRouter(prefix="/v1/profiles", tags=["profiles"], route_class=StrictJsonRoute)


@router.post("", operation_id="startProfile", status_code=202, response_model=JobAccepted,
             summary="start Freeze'nSense on a host (a background job; poll GET /v1/jobs/{id})",
             responses={**COMMON_RESPONSES, **CONFLICT, **HOST_ERROR})
def start_profile(request: Request, services: Services, body: ProfileRequest, response: Response) -> dict[str, Any]:
    actor = api_actor(request)
    host = Placer(services).configured(body.host)  # 422 for an unknown host; default: the first
    params = body.model_dump()
    params["host"] = host
    profiler_config(params, services.settings)  # 422 now rather than a failed job later
    if body.vms:
        check_vms(services.container.hypervisor(host), body.vms)
    check_can_queue(services, PROFILE_JOB, host, "profiling")
    job = services.jobs.create(PROFILE_JOB, [host], params, actor.token)
    audit(services, actor, action="profile-queued", host=host, message=f"profiling job {job.id} queued",
          detail={"job": job.id, "vms": list(body.vms)})
    return accepted(services, job, response, f"/v1/jobs/{job.id}")


@router.get("/{guest}", operation_id="getProfile", response_model=ProfileView,
            summary="a VM's ζ (shared), ζb (neighbours frozen) and degradation distributions",
            responses={**COMMON_RESPONSES, **NOT_FOUND})
def get_profile(services: Services,
                guest: str = Path(min_length=1, max_length=DOMAIN_NAME_MAX_BYTES, description=DOMAIN_NAME_RULE,
                                  json_schema_extra={"pattern": DOMAIN_NAME_PATTERN}),
                run_id: int | None = Query(default=None, ge=1, le=2**31 - 1),
                host: str | None = Query(default=None, pattern=HOST_NAME, max_length=63)) -> dict[str, Any]:
    try:  # any libvirt domain name, by the rule POST /v1/profiles applies to `vms`
        check_domain_name(guest)
    except PydanticCustomError as exc:
        raise ApiError(422, "validation", f"field guest: {exc}", field_problems([("guest", str(exc))])) from None
    return stored_profile(services, guest, run_id, host)


# ----- the resource's work beyond HTTP
PROFILE_JOB = "profile"


def profiler_config(params: dict[str, Any], settings: Any) -> ProfilerConfig:
    """ProfilerConfig from request parameters and the settings' defaults; 422 naming the field."""
    samples = params.get("samples")
    duration = params.get("duration_s")
    if samples is None and duration is None:
        samples = 20
    try:
        return compose_profiler_config(
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
        from vmplacer.app.observe.profiler import ProfilerError

        host = params["host"]
        try:
            config = profiler_config(params, services.settings)
        except ApiError as exc:
            raise JobFailed(exc.message, code="invalid", details=exc.details) from None
        ctx.progress(0.0, f"starting on host {host}")
        try:
            profiler, freezer = services.profiler(host, config, metric=params.get("metric"),
                                                  on_progress=_Progress(ctx, config.samples, config.duration_s))
        except HypervisorError as exc:
            services.metrics.libvirt_error(exc)
            raise JobFailed(str(exc), code="host-unavailable", details={"host": exc.host or host}) from None
        cancel = CancelFlag(services, ctx)
        try:
            result = profiler.run(stop=cancel)
        except ProfilerError as exc:
            raise JobFailed(str(exc), code="invalid" if exc.bad_input else "failed", details={"host": host}) from None
        except HypervisorError as exc:
            services.metrics.libvirt_error(exc)
            raise JobFailed(str(exc), code="host-unavailable", details={"host": exc.host or host}) from None
        finally:
            freezer.close()
        services.metrics.profile_finished(host, result.span_ms)
        kept = sum(len(vm.zeta) + len(vm.zeta_b) for vm in result.vms.values())
        empty = None if kept else f"no sample was kept ({result.stopped_because or 'stopped'})"
        data = outcome(result.to_dict(), empty)
        if cancel.requested is not None and result.stopped_because == "stopped" and not ctx.should_stop():
            by = cancel.requested.get("by", "")
            raise JobCancelled(f"cancelled by {by} after {kept} samples", result=data)
        return data

    return run


class CancelFlag:
    """The profiler's stop check: the runner's own stop (shutdown, lost lease), or a cancel
    recorded in the job's row by any instance (read at most once a second: the profiler asks
    between every step)."""

    def __init__(self, services: ApiServices, ctx: JobContext, every_s: float = 1.0):
        self.services = services
        self.ctx = ctx
        self.every_s = every_s
        self.checked = -float("inf")
        self.requested: dict[str, Any] | None = None

    def __call__(self) -> bool:
        if self.ctx.should_stop():
            return True
        now = time.monotonic()
        if self.requested is None and now - self.checked >= self.every_s:
            self.checked = now
            job = self.services.jobs.get(self.ctx.job.id)
            stop = (job.parameters or {}).get("stop") if job is not None else None
            self.requested = stop if isinstance(stop, dict) else None
        return self.requested is not None


def stored_profile(services: ApiServices, guest: str, run_id: int | None, host: str | None) -> dict[str, Any]:
    """ζ, ζb and degradation distributions of one VM from the stored samples of one run
    (the newest run holding samples of it, unless `run_id` says which)."""
    from vmplacer.core.model.profile_stats import stored_summary

    store = services.container.profile_store
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
                "started_at": api_timestamp(run.started_at), "finished_at": api_timestamp(run.finished_at),
                "parameters": run.parameters},
        "profile": summary,
    }
