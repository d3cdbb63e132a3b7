"""Protection loops as jobs: start one for a host, read its status, stop it (releasing its throttles)."""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from fastapi import APIRouter, Path, Request, Response

from vmplacer.api.actors import api_actor, audit
from vmplacer.api.errors import COMMON_RESPONSES, CONFLICT, NOT_FOUND, ApiError
from vmplacer.api.placing import Placer
from vmplacer.api.protecting import PROTECT_JOB, protect_status
from vmplacer.api.routes.jobs import JOB_ID, accepted, check_can_queue, job_view
from vmplacer.api.schemas import JobAccepted, ProtectRequest, ProtectView
from vmplacer.api.strict_json import StrictJsonRoute

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


@router.post("", status_code=202, response_model=JobAccepted,
             summary="start the protection loop on a host (a job that runs until DELETE /v1/protect/{id})",
             responses={**COMMON_RESPONSES, **CONFLICT})
def start_protect(request: Request, body: ProtectRequest, response: Response) -> dict[str, Any]:
    services = request.app.state.services
    actor = api_actor(request)
    host = Placer(services).configured(body.host)  # 422 for an unknown host; default: the first
    check_can_queue(services, PROTECT_JOB, host, "protection")
    params = {"host": host, "scope": list(body.scope), "samples": body.samples, "t_m_ms": body.t_m_ms}
    job = services.jobs.create(PROTECT_JOB, [host], params, actor.token)
    audit(services, actor, action="protect-queued", host=host, message=f"protection job {job.id} queued",
          detail={"job": job.id, "scope": list(body.scope)})
    return accepted(services, job, response, f"/v1/protect/{job.id}")


@router.get("/{job_id}", response_model=ProtectView,
            summary="a protection job and, per protected guest, what its loop last saw; the throttles in force",
            responses={**COMMON_RESPONSES, **NOT_FOUND})
def get_protect(request: Request, job_id: str = Path(pattern=JOB_ID, max_length=36)) -> dict[str, Any]:
    services = request.app.state.services
    job = _protect_job(services, job_id)
    host = job.hosts[0]
    return {"job": job_view(job), "host": host, **protect_status(services, host)}


@router.delete("/{job_id}", status_code=202, response_model=JobAccepted,
               summary="stop a protection job: it releases every throttle it holds on the host, then finishes "
               "(follow it at /v1/jobs/{id}; /v1/protect/{id} is 404 from now on)",
               responses={**COMMON_RESPONSES, **NOT_FOUND, **CONFLICT})
def stop_protect(request: Request, response: Response,
                 job_id: str = Path(pattern=JOB_ID, max_length=36)) -> dict[str, Any]:
    services = request.app.state.services
    actor = api_actor(request)
    job = _protect_job(services, job_id)
    if job.done:
        raise ApiError(409, "conflict", f"protection job {job_id} already {job.status}",
                       {"job": job_id, "status": job.status})
    job = services.jobs.request_stop(job_id, actor.name) or job
    audit(services, actor, action="protect-stop", host=job.hosts[0], message=f"protection job {job_id}: stop "
          "requested (its throttles are released)", detail={"job": job_id})
    location = f"/v1/jobs/{job_id}"  # the protection is gone; the job shows how the stop went
    response.headers["Location"] = location
    return {"job": job_view(job), "location": location}
