"""Rebalancing plans: a dry run that stores a plan, reading it, applying it (a job), cancelling it.

Listing keeps its old default (every plan, `empty` ones included); `state`
and `include_empty=false` narrow it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Query, Request, Response

from vmplacer.api import plans_support
from vmplacer.api.actors import acting_store, api_actor, audit
from vmplacer.api.errors import COMMON_RESPONSES, CONFLICT, NOT_FOUND, ApiError
from vmplacer.api.routes.jobs import accepted
from vmplacer.api.schemas import (
    JobAccepted,
    PlanCancelRequest,
    PlanCancelView,
    PlanList,
    PlanRequest,
    PlanState,
    PlanView,
)
from vmplacer.api.strict_json import StrictJsonRoute
from vmplacer.api.times import with_api_times

router = APIRouter(prefix="/v1/plans", tags=["plans"], route_class=StrictJsonRoute)


@router.post("", status_code=201, response_model=PlanView,
             summary="rebalance dry run: observe the hosts, plan moves, store the plan (nothing changes)",
             responses={**COMMON_RESPONSES, **CONFLICT})
def create_plan(request: Request, body: PlanRequest, response: Response) -> dict[str, Any]:
    services = request.app.state.services
    actor = api_actor(request)
    plan = plans_support.make_plan(services, body.hosts, body.max_actions, body.scope, actor.token,
                                   drain=body.drain)
    audit(services, actor, action="rebalance-propose",
          message=f"plan {plan['id']} ({plan['state']}): {plan['summary']}",
          detail={"plan_id": plan["id"], "state": plan["state"], "hosts": plan["hosts"], "drain": body.drain,
                  "errors": plan.get("errors", [])})
    response.headers["Location"] = f"/v1/plans/{plan['id']}"
    return plan


@router.get("", response_model=PlanList, summary="recent plans, newest first", responses=COMMON_RESPONSES)
def list_plans(request: Request, limit: int = Query(default=20, ge=1, le=500),
               state: list[PlanState] | None = Query(default=None, description="only plans in these states "
                                                     "(repeatable; default: every state)"),
               include_empty: bool = Query(default=True, description="false: leave out `empty` plans (runs "
                                           "that found nothing to do)")) -> dict[str, Any]:
    from vmplacer.core.plan import PLAN_STATES

    states = list(state) if state else list(PLAN_STATES)
    if not include_empty:
        states = [s for s in states if s != "empty"]
    wanted = None if set(states) == set(PLAN_STATES) else states
    recent = plans_support.plan_store(request.app.state.services).recent(limit, states=wanted)
    return {"plans": [with_api_times(plan, "created_at") for plan in recent]}


@router.get("/{plan_id}", response_model=PlanView, summary="a plan: actions, reasons, predicted gain, outcome",
            responses={**COMMON_RESPONSES, **NOT_FOUND})
def get_plan(request: Request, plan_id: int = Path(ge=1, le=2**31 - 1)) -> dict[str, Any]:
    plan = plans_support.plan_store(request.app.state.services).get(plan_id)
    if plan is None:
        raise ApiError(404, "not-found", f"plan {plan_id} does not exist", {"plan": plan_id})
    return plans_support.plan_view(plan)


@router.post("/{plan_id}/apply", status_code=202, response_model=JobAccepted,
             summary="apply a proposed plan (a background job); 409 if it is already applied or applying",
             responses={**COMMON_RESPONSES, **NOT_FOUND, **CONFLICT})
def apply_plan(request: Request, response: Response, plan_id: int = Path(ge=1, le=2**31 - 1)) -> dict[str, Any]:
    services = request.app.state.services
    actor = api_actor(request)
    job = plans_support.start_apply(services, plan_id, actor.token, actor.token_id)
    audit(services, actor, action="rebalance-apply-queued", message=f"plan {plan_id}: job {job.id} queued",
          detail={"plan_id": plan_id, "job": job.id, "hosts": list(job.hosts)})
    return accepted(services, job, response, f"/v1/jobs/{job.id}")


@router.post("/{plan_id}/cancel", response_model=PlanCancelView,
             summary="cancel a plan: at once if proposed or approved, before its next action if running "
                     "(done actions stay applied); 409 if it is already final",
             responses={**COMMON_RESPONSES, **NOT_FOUND, **CONFLICT})
def cancel_plan(request: Request, body: PlanCancelRequest | None = None,
                plan_id: int = Path(ge=1, le=2**31 - 1)) -> dict[str, Any]:
    from vmplacer.app.rebalance import PlanNotFound, PlanStateError, RebalanceError
    from vmplacer.app.rebalance import cancel_plan as cancel

    services = request.app.state.services
    actor = api_actor(request)
    try:
        outcome = cancel(plans_support.plan_store(services), plan_id, by=actor.name,
                         reason=body.reason if body else "", audit=acting_store(services, actor))
    except PlanNotFound:
        raise ApiError(404, "not-found", f"plan {plan_id} does not exist", {"plan": plan_id}) from None
    except PlanStateError as exc:
        raise ApiError(409, "conflict", str(exc), {"plan": plan_id, "state": exc.state}) from None
    except RebalanceError as exc:
        raise ApiError(409, "conflict", str(exc), {"plan": plan_id}) from None
    return {"status": outcome.status, "plan": plans_support.plan_view(outcome.plan)}
