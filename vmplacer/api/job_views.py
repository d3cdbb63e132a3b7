"""How every resource shows its jobs: the job document, the 202 that queues one, the
headers that say where and when to look again.

Shared by the routes that queue jobs (profiles, plans, protect) and by /v1/jobs, which
imports those routes (to cancel each kind its own way): this module imports none of them.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from fastapi import Response

from vmplacer.api.errors import ApiError
from vmplacer.api.times import with_api_times
from vmplacer.ports import JobRecord

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices

JOB_ID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
# When to look (again) at a job that has not finished: a queued job is picked up within a
# second or so, and a running one reports progress at least that often.
POLL_AFTER_S = "1"
# The kinds whose result is a plan (vmplacer.api.routes.plans names them): its id shows as `plan_id` too.
PLAN_JOB_KINDS = ("plan", "apply-plan")


def job_view(job: JobRecord) -> dict[str, Any]:
    data = asdict(job)
    data["hosts"] = list(job.hosts)
    data.pop("heartbeat_at", None)
    stop = (data.get("parameters") or {}).get("stop")
    if isinstance(stop, dict):  # a stop request's moment, stored as epoch seconds
        data["parameters"] = {**data["parameters"], "stop": with_api_times(stop, "at")}
    result = data.get("result")
    if isinstance(result, dict):  # results stored before `empty` existed produced something
        data["result"] = {"empty": False, "empty_reason": None, **result}
        if job.kind in PLAN_JOB_KINDS and isinstance(result.get("id"), int):  # the result is the plan
            data["result"].setdefault("plan_id", result["id"])
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


def outcome(result: dict[str, Any], empty_reason: str | None) -> dict[str, Any]:
    """A job's result saying whether it produced anything: `empty` with the reason when not."""
    return {**result, "empty": empty_reason is not None, "empty_reason": empty_reason}
