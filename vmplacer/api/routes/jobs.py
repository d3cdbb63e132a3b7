"""Background jobs: GET their state and progress, cancel any of them.

POST /v1/jobs/{id}/cancel is the one cancel verb for every kind: a queued job ends
`cancelled` at once (it never starts, and no longer holds its host against a new job of its
kind); a running one is asked to stop and does so between steps — a profile ends
`cancelled` with what it sampled so far, an apply job cancels its plan (before the plan's
next action; done actions stay applied), a protection loop releases its throttles and ends
`succeeded` (stopping is how a protection ends). DELETE /v1/protect/{id} and POST
/v1/plans/{id}/cancel remain as aliases for their kinds.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Path, Query, Request, Response

from vmplacer.api.deps import Services
from vmplacer.api.actors import api_actor, audit
from vmplacer.api.errors import COMMON_RESPONSES, CONFLICT, NOT_FOUND, ApiError
from vmplacer.api.job_views import JOB_ID, POLL_AFTER_S, following, job_view
from vmplacer.api.paging import CursorQuery, decode, paged
from vmplacer.api.routes.plans import APPLY_JOB, cancel_plan_of_job
from vmplacer.api.schemas import JobCancelView, JobKind, JobList, JobStatus, JobView
from vmplacer.api.strict_json import StrictJsonRoute

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=StrictJsonRoute)


@router.get("/{job_id}", operation_id="getJob", response_model=JobView, summary="a job's state, progress and result",
            description="While the job has not finished the answer carries `Retry-After` (seconds before the "
                        "next look).",
            responses={**COMMON_RESPONSES, **NOT_FOUND})
def get_job(services: Services, response: Response,
            job_id: str = Path(pattern=JOB_ID, max_length=36)) -> dict[str, Any]:
    job = services.jobs.get(job_id)
    if job is None:
        raise ApiError(404, "not-found", f"job {job_id} does not exist", {"job": job_id})
    if not job.done:
        response.headers["Retry-After"] = POLL_AFTER_S
    return job_view(job)


@router.get("", operation_id="listJobs", response_model=JobList,
            summary="jobs, newest first (creation time, then id); a page at a time (`next`)",
            responses=COMMON_RESPONSES)
def list_jobs(request: Request, services: Services, response: Response,
              status: list[JobStatus] | None = Query(default=None, description="only jobs in these states "
                                                     "(repeatable; default: every state)"),
              kind: JobKind | None = Query(default=None, description="only jobs of this kind"),
              limit: int = Query(default=100, ge=1, le=1000),
              cursor: str | None = CursorQuery) -> dict[str, Any]:
    statuses = sorted(set(status or ()))
    filters = {"status": statuses, "kind": kind}
    after = decode(cursor, "jobs", filters, _job_key)
    jobs, last = services.container.pages.jobs(limit=limit, after=after, statuses=statuses or None, kind=kind)
    key = None if last is None else [last[0].astimezone(timezone.utc).isoformat(), last[1]]
    return {"jobs": [job_view(job) for job in jobs], **paged(request, response, "jobs", filters, key)}


def _job_key(values: list[Any]) -> tuple[datetime, str]:
    at, job_id = values
    moment = datetime.fromisoformat(at)
    if moment.tzinfo is None or not re.match(JOB_ID, job_id):
        raise ValueError("bad job key")
    return moment.astimezone(timezone.utc), job_id


@router.post("/{job_id}/cancel", operation_id="cancelJob", status_code=202, response_model=JobCancelView,
             summary="cancel a job of any kind: a queued one at once (200, `cancelled`), a running one between "
                     "its steps (202, `cancel-requested`: poll the job); 409 if it already finished",
             responses={**COMMON_RESPONSES, **NOT_FOUND, **CONFLICT,
                        200: {"model": JobCancelView, "description": "cancelled at once: the job never started"}})
def cancel_job(request: Request, services: Services, response: Response,
               job_id: str = Path(pattern=JOB_ID, max_length=36)) -> dict[str, Any]:
    actor = api_actor(request)
    job = services.jobs.get(job_id)
    if job is None:
        raise ApiError(404, "not-found", f"job {job_id} does not exist", {"job": job_id})
    if not job.done:  # it may still finish on its own meanwhile: then there is nothing to cancel
        job = services.jobs.cancel(job_id, actor.name) or job
        finished = job.done and job.status != "cancelled"
    else:
        finished = True
    if finished:
        raise ApiError(409, "conflict", f"job {job_id} already {job.status}", {"job": job_id, "status": job.status})
    if job.kind == APPLY_JOB:  # the plan stops too: at once, or before its next action
        cancel_plan_of_job(services, actor, job)
        job = services.jobs.get(job_id) or job
    host = job.hosts[0] if len(job.hosts) == 1 else None
    cancelled = job.status == "cancelled"
    audit(services, actor, action="job-cancel", host=host,
          message=f"{job.kind} job {job_id}: " + ("cancelled before it started" if cancelled else "stop requested"),
          detail={"job": job_id, "kind": job.kind, "status": job.status})
    location = f"/v1/jobs/{job_id}"
    if cancelled:
        response.status_code = 200  # final already: nothing to follow
    else:
        following(response, location)
    return {"status": "cancelled" if cancelled else "cancel-requested", "job": job_view(job), "location": location}

