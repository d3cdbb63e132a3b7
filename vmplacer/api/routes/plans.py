"""Rebalancing plans: a dry run that stores a plan, reading it, applying it (a job)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Query, Request, Response

from vmplacer.api import plans_support
from vmplacer.api.auth import require_principal
from vmplacer.api.errors import COMMON_RESPONSES, CONFLICT, NOT_FOUND, ApiError
from vmplacer.api.routes.jobs import job_view
from vmplacer.api.schemas import JobAccepted, PlanList, PlanRequest, PlanView

router = APIRouter(prefix="/v1/plans", tags=["plans"])


@router.post("", status_code=201, response_model=PlanView,
             summary="rebalance dry run: observe the hosts, plan moves, store the plan (nothing changes)",
             responses={**COMMON_RESPONSES, **CONFLICT})
def create_plan(request: Request, body: PlanRequest, response: Response) -> dict[str, Any]:
    services = request.app.state.services
    principal = require_principal(request)
    plan = plans_support.make_plan(services, body.hosts, body.max_actions, body.scope, principal.name)
    response.headers["Location"] = f"/v1/plans/{plan['id']}"
    return plan


@router.get("", response_model=PlanList, summary="recent plans, newest first", responses=COMMON_RESPONSES)
def list_plans(request: Request, limit: int = Query(default=20, ge=1, le=500)) -> dict[str, Any]:
    return {"plans": plans_support.plan_store(request.app.state.services).recent(limit)}


@router.get("/{plan_id}", response_model=PlanView, summary="a plan: actions, reasons, predicted gain, outcome",
            responses={**COMMON_RESPONSES, **NOT_FOUND})
def get_plan(request: Request, plan_id: int = Path(ge=1, le=2**31 - 1)) -> dict[str, Any]:
    plan = plans_support.plan_store(request.app.state.services).get(plan_id)
    if plan is None:
        raise ApiError(404, "not-found", f"plan {plan_id} does not exist", {"plan": plan_id})
    return plan.to_dict()


@router.post("/{plan_id}/apply", status_code=202, response_model=JobAccepted,
             summary="apply a proposed plan (a background job); 409 if it is already applied or applying",
             responses={**COMMON_RESPONSES, **NOT_FOUND, **CONFLICT})
def apply_plan(request: Request, response: Response, plan_id: int = Path(ge=1, le=2**31 - 1)) -> dict[str, Any]:
    services = request.app.state.services
    principal = require_principal(request)
    job = plans_support.start_apply(services, plan_id, principal.name)
    if services.runner is not None:
        services.runner.wake()
    location = f"/v1/jobs/{job.id}"
    response.headers["Location"] = location
    return {"job": job_view(job), "location": location}
