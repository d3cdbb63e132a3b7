"""Background jobs: GET their state and progress."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal, TYPE_CHECKING

from fastapi import APIRouter, Path, Query, Request, Response

from vmplacer.api.errors import COMMON_RESPONSES, NOT_FOUND, ApiError
from vmplacer.api.schemas import JobList, JobView
from vmplacer.api.strict_json import StrictJsonRoute
from vmplacer.api.times import with_api_times
from vmplacer.ports import JobRecord

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=StrictJsonRoute)
JOB_ID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
# A queued job's 202 says when to look first: a job is picked up within a second or so.
POLL_AFTER_S = "1"


def job_view(job: JobRecord) -> dict[str, Any]:
    data = asdict(job)
    data["hosts"] = list(job.hosts)
    data.pop("heartbeat_at", None)
    stop = (data.get("parameters") or {}).get("stop")
    if isinstance(stop, dict):  # a stop request's moment, stored as epoch seconds
        data["parameters"] = {**data["parameters"], "stop": with_api_times(stop, "at")}
    return with_api_times(data, "created_at", "started_at", "finished_at")


def check_can_queue(services: ApiServices, kind: str, host: str, what: str) -> None:
    """409 when a job of `kind` is already active on `host` (`what` names it), 503 when no runner
    would ever pick a new one up: a job is queued only where it can run."""
    busy = services.jobs.active_on(kind, host)
    if busy:
        raise ApiError(409, "busy", f"host {host}: {what} job {busy[0].id} is already {busy[0].status}",
                       {"host": host, "job": busy[0].id})
    if services.runner is None and services.options.run_jobs:
        raise ApiError(503, "not-ready", "the job runner is not running", None, {"Retry-After": "5"})


def accepted(services: ApiServices, job: JobRecord, response: Response, location: str) -> dict[str, Any]:
    """The 202 answer for a queued job: the runner woken, `Location` set to where to follow it,
    `Retry-After` to when."""
    if services.runner is not None:
        services.runner.wake()
    following(response, location)
    return {"job": job_view(job), "location": location}


def following(response: Response, location: str) -> None:
    """The headers of every 202: where to poll, and how soon."""
    response.headers["Location"] = location
    response.headers["Retry-After"] = POLL_AFTER_S


@router.get("/{job_id}", operation_id="getJob", response_model=JobView, summary="a job's state, progress and result",
            responses={**COMMON_RESPONSES, **NOT_FOUND})
def get_job(request: Request, job_id: str = Path(pattern=JOB_ID, max_length=36)) -> dict[str, Any]:
    job = request.app.state.services.jobs.get(job_id)
    if job is None:
        raise ApiError(404, "not-found", f"job {job_id} does not exist", {"job": job_id})
    return job_view(job)


@router.get("", operation_id="listJobs", response_model=JobList, summary="recent jobs, newest first",
            responses=COMMON_RESPONSES)
def list_jobs(request: Request,
              status: Literal["queued", "running", "succeeded", "failed"] | None = None,
              kind: str | None = Query(default=None, pattern=r"^[a-z-]{1,32}$"),
              limit: int = Query(default=100, ge=1, le=1000)) -> dict[str, Any]:
    jobs = request.app.state.services.jobs.list(limit=limit, status=status, kind=kind)
    return {"jobs": [job_view(job) for job in jobs]}
