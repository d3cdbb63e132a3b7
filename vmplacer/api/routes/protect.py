"""Protection loops as jobs: start one for a host, read its status, stop it (releasing its throttles).

POST /v1/protect queues a `protect` job; the runner that holds the host's
lease runs the loop (the same loop as `vmplacer protect run --host H`, acting
under the runner's lease). DELETE /v1/protect/{id} (an alias of POST
/v1/jobs/{id}/cancel) ends a queued job `cancelled` at once, and records a
stop request in a running job's row; the loop notices it within a second,
releases every throttle it holds on the host and finishes the job `succeeded`
(stopping is how a protection ends; `result.empty` when no round ran). A job stopped for any
other reason (the instance shuts down, the lease is lost) keeps its
throttles, like a killed `vmplacer protect`: they have reasons in the ledger,
and the next loop on the host continues from them or releases those whose
reason is gone.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Path, Request, Response

from vmplacer.api.deps import Services
from vmplacer.api.actors import api_actor, audit
from vmplacer.api.errors import COMMON_RESPONSES, CONFLICT, NOT_FOUND, ApiError
from vmplacer.api.placing import Placer
from vmplacer.api.job_views import JOB_ID, accepted, check_can_queue, following, job_view, outcome
from vmplacer.api.schemas import JobAccepted, ProtectRequest, ProtectView
from vmplacer.api.strict_json import StrictJsonRoute
from vmplacer.api.times import api_timestamp
from vmplacer.app.jobs import Handler, JobContext, JobFailed
from vmplacer.ports import HypervisorError

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices
    from vmplacer.ports import JobRecord

router = APIRouter(prefix="/v1/protect", tags=["protect"], route_class=StrictJsonRoute)


def _protect_job(services: ApiServices, job_id: str) -> JobRecord:
    """The protection job, 404 when there is none — or when it was deleted (asked to stop): the
    protection is gone; how its stop and releases went stays at /v1/jobs/{id}."""
    job = services.jobs.get(job_id)
    if job is None or job.kind != PROTECT_JOB:
        raise ApiError(404, "not-found", f"protection job {job_id} does not exist", {"job": job_id})
    if (job.parameters or {}).get("stop"):
        raise ApiError(404, "not-found", f"protection job {job_id} was deleted (stopped); its outcome is at "
                       f"/v1/jobs/{job_id}", {"job": job_id, "location": f"/v1/jobs/{job_id}"})
    return job


@router.post("", operation_id="startProtection", status_code=202, response_model=JobAccepted,
             summary="start the protection loop on a host (a job that runs until DELETE /v1/protect/{id})",
             responses={**COMMON_RESPONSES, **CONFLICT})
def start_protect(request: Request, services: Services, body: ProtectRequest, response: Response) -> dict[str, Any]:
    actor = api_actor(request)
    host = Placer(services).configured(body.host)  # 422 for an unknown host; default: the first
    check_can_queue(services, PROTECT_JOB, host, "protection")
    params = {"host": host, "scope": list(body.scope), "samples": body.samples, "t_m_ms": body.t_m_ms}
    job = services.jobs.create(PROTECT_JOB, [host], params, actor.token)
    audit(services, actor, action="protect-queued", host=host, message=f"protection job {job.id} queued",
          detail={"job": job.id, "scope": list(body.scope)})
    return accepted(services, job, response, f"/v1/protect/{job.id}")


@router.get("/{job_id}", operation_id="getProtection", response_model=ProtectView,
            summary="a protection job and, per protected guest, what its loop last saw; the throttles in force",
            responses={**COMMON_RESPONSES, **NOT_FOUND})
def get_protect(services: Services, job_id: str = Path(pattern=JOB_ID, max_length=36)) -> dict[str, Any]:
    job = _protect_job(services, job_id)
    host = job.hosts[0]
    return {"job": job_view(job), "host": host, **protect_status(services, host)}


@router.delete("/{job_id}", operation_id="stopProtection", status_code=202, response_model=JobAccepted,
               summary="stop a protection job (alias of POST /v1/jobs/{id}/cancel): a queued one is cancelled at "
               "once; a running one releases every throttle it holds on the host, then finishes (follow it at "
               "/v1/jobs/{id}; /v1/protect/{id} is 404 from now on)",
               responses={**COMMON_RESPONSES, **NOT_FOUND, **CONFLICT})
def stop_protect(request: Request, services: Services, response: Response,
                 job_id: str = Path(pattern=JOB_ID, max_length=36)) -> dict[str, Any]:
    actor = api_actor(request)
    job = _protect_job(services, job_id)
    if job.done:
        raise ApiError(409, "conflict", f"protection job {job_id} already {job.status}",
                       {"job": job_id, "status": job.status})
    job = services.jobs.cancel(job_id, actor.name) or job  # queued: cancelled now; running: asked to stop
    what = "cancelled before it started" if job.status == "cancelled" else \
        "stop requested (its throttles are released)"
    audit(services, actor, action="protect-stop", host=job.hosts[0], message=f"protection job {job_id}: {what}",
          detail={"job": job_id, "status": job.status})
    location = f"/v1/jobs/{job_id}"  # the protection is gone; the job shows how the stop went
    following(response, location)
    return {"job": job_view(job), "location": location}


# ----- the resource's work beyond HTTP
PROTECT_JOB = "protect"
STOP_POLL_S = 1.0


def stop_requested(services: ApiServices, job_id: str) -> dict[str, Any] | None:
    job = services.jobs.get(job_id)
    stop = (job.parameters or {}).get("stop") if job is not None else None
    return stop if isinstance(stop, dict) else None


def protect_handler(services: ApiServices, build: Any = None) -> Handler:
    """`build(container, host, **options)` makes the loop (default: the services' `protect_loop`)."""

    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        host = params["host"]
        options = {"scope": tuple(params.get("scope") or ("*",)), "samples": int(params.get("samples") or 5),
                   "t_m_s": None if params.get("t_m_ms") is None else float(params["t_m_ms"]) / 1e3,
                   "holder": services.instance}
        try:
            loop = services.protect_loop(host, **options) if build is None else \
                build(services.container, host, **options)
        except HypervisorError as exc:
            services.metrics.libvirt_error(exc)
            raise JobFailed(str(exc), code="host-unavailable", details={"host": exc.host or host}) from None
        asked: dict[str, Any] = {"stop": None, "checked": 0.0}

        def should_stop() -> bool:
            if ctx.should_stop():
                return True
            now = time.monotonic()
            if now - asked["checked"] >= STOP_POLL_S:
                asked["checked"] = now
                asked["stop"] = stop_requested(services, ctx.job.id)
            return asked["stop"] is not None

        counts = {"rounds": 0}

        def on_round(report: Any) -> None:
            counts["rounds"] += 1
            states = ", ".join(f"{v.guest} {v.state}" + ("" if v.ratio is None else f" {v.ratio:.2f}")
                               for v in report.decision.verdicts) or "no protected guest running"
            ctx.progress(0.0, f"round {counts['rounds']}: {states}")

        ctx.progress(0.0, f"protecting on host {host}")
        try:
            loop.run(stop=should_stop, on_round=on_round, poll_s=0.5)
        except HypervisorError as exc:
            services.metrics.libvirt_error(exc)
            raise JobFailed(str(exc), code="host-unavailable", details={"host": exc.host or host}) from None
        empty = None if counts["rounds"] else "stopped before its first round"
        result: dict[str, Any] = outcome({"host": host, "rounds": counts["rounds"], "released": []}, empty)
        if asked["stop"] is not None and not ctx.should_stop():
            by = asked["stop"].get("by", "")
            report = loop.release_all(f"protection job {ctx.job.id} stopped by {by}")
            result["released"] = [s.guest for s in report.decision.steps]
            result["release_plan"] = report.plan
            result["stopped_by"] = by
            if report.plan is not None and report.plan["state"] != "succeeded":
                raise JobFailed(f"stopped, but releasing the throttles {report.plan['state']}", code="release-failed",
                                details=result)
        return result

    return run


def protect_status(services: ApiServices, host: str) -> dict[str, Any]:
    """What the host's loop last recorded per protected guest, and the throttles in force there."""
    from vmplacer.adapters.protect_history import ProtectHistory

    record = ProtectHistory.in_data_dir(services.settings.data_dir).latest(host)
    guests = []
    if record is not None:
        for name, stats in sorted((record.get("guests") or {}).items()):
            guests.append({"guest": name, **{k: stats.get(k) for k in (
                "ratio", "ratio_raw", "floor", "state", "throttles_applied", "below_floor_s")}})
    throttles = [{"guest": r.guest, "share": round(r.bandwidth.share, 4), "original_share": round(r.original.share, 4),
                  "protects": r.protects, "plan_id": r.plan_id, "age_s": round(r.age_s, 1)}
                 for r in services.container.throttle_ledger.current(host)]
    return {"last_round_at": None if record is None else api_timestamp(record.get("at")), "guests": guests,
            "budget": None if record is None else record.get("budget"),
            "pace": None if record is None else record.get("pace"), "throttles": throttles}
