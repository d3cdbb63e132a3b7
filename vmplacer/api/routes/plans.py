"""Rebalancing plans: a dry run that stores a plan, reading it, applying it (a job), cancelling it.

Planning observes the hosts and runs the policy: seconds at most, so POST
/v1/plans answers with the stored plan. Applying changes hosts (repins, live
migrations of minutes), so it is a job: the runner takes the leases of every
host the plan touches (sources and targets) before the executor starts, and
the rebalancer renews them while it works — the same leases `vmplacer
rebalance` takes, so an API apply and a CLI run never act on one host at once.

Listing keeps its old default (every plan, `empty` ones included); `state`
and `include_empty=false` narrow it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Path, Query, Request, Response

from vmplacer.api.actors import acting_store, api_actor, audit
from vmplacer.api.errors import COMMON_RESPONSES, CONFLICT, NOT_FOUND, OUT_OF_MEMORY, ApiError
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
from vmplacer.app.jobs import Handler, JobContext, JobFailed

if TYPE_CHECKING:
    from vmplacer.ports import PlanStore
    from vmplacer.api.services import ApiServices
    from vmplacer.app.rebalance.rebalancer import Rebalancer

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/plans", tags=["plans"], route_class=StrictJsonRoute)


@router.post("", operation_id="createPlan", status_code=201, response_model=PlanView,
             summary="rebalance dry run: observe the hosts, plan moves, store the plan (nothing changes)",
             responses={**COMMON_RESPONSES, **CONFLICT, **OUT_OF_MEMORY})
def create_plan(request: Request, body: PlanRequest, response: Response) -> dict[str, Any]:
    services = request.app.state.services
    actor = api_actor(request)
    plan = make_plan(services, body.hosts, body.max_actions, body.scope, actor.token,
                                   drain=body.drain)
    audit(services, actor, action="rebalance-propose",
          message=f"plan {plan['id']} ({plan['state']}): {plan['summary']}",
          detail={"plan_id": plan["id"], "state": plan["state"], "hosts": plan["hosts"], "drain": body.drain,
                  "errors": plan.get("errors", [])})
    response.headers["Location"] = f"/v1/plans/{plan['id']}"
    return plan


@router.get("", operation_id="listPlans", response_model=PlanList, summary="recent plans, newest first",
            responses=COMMON_RESPONSES)
def list_plans(request: Request, limit: int = Query(default=20, ge=1, le=500),
               state: list[PlanState] | None = Query(default=None, description="only plans in these states "
                                                     "(repeatable; default: every state)"),
               include_empty: bool = Query(default=True, description="false: leave out `empty` plans (runs "
                                           "that found nothing to do)")) -> dict[str, Any]:
    from vmplacer.core.rebalance.plan import PLAN_STATES

    states = list(state) if state else list(PLAN_STATES)
    if not include_empty:
        states = [s for s in states if s != "empty"]
    wanted = None if set(states) == set(PLAN_STATES) else states
    recent = plan_store(request.app.state.services).recent(limit, states=wanted)
    return {"plans": [with_api_times(plan, "created_at") for plan in recent]}


@router.get("/{plan_id}", operation_id="getPlan", response_model=PlanView,
            summary="a plan: actions, reasons, predicted gain, outcome",
            responses={**COMMON_RESPONSES, **NOT_FOUND})
def get_plan(request: Request, plan_id: int = Path(ge=1, le=2**31 - 1)) -> dict[str, Any]:
    plan = plan_store(request.app.state.services).get(plan_id)
    if plan is None:
        raise ApiError(404, "not-found", f"plan {plan_id} does not exist", {"plan": plan_id})
    return plan_view(plan)


@router.post("/{plan_id}/apply", operation_id="applyPlan", status_code=202, response_model=JobAccepted,
             summary="apply a proposed plan (a background job); 409 if it is already applied or applying",
             responses={**COMMON_RESPONSES, **NOT_FOUND, **CONFLICT})
def apply_plan(request: Request, response: Response, plan_id: int = Path(ge=1, le=2**31 - 1)) -> dict[str, Any]:
    services = request.app.state.services
    actor = api_actor(request)
    job = start_apply(services, plan_id, actor.token, actor.token_id)
    audit(services, actor, action="rebalance-apply-queued", message=f"plan {plan_id}: job {job.id} queued",
          detail={"plan_id": plan_id, "job": job.id, "hosts": list(job.hosts)})
    return accepted(services, job, response, f"/v1/jobs/{job.id}")


@router.post("/{plan_id}/cancel", operation_id="cancelPlan", response_model=PlanCancelView,
             summary="cancel a plan: at once if proposed or approved, before its next action if running "
                     "(done actions stay applied); 409 if it is already final",
             responses={**COMMON_RESPONSES, **NOT_FOUND, **CONFLICT})
def cancel_plan(request: Request, body: PlanCancelRequest | None = None,
                plan_id: int = Path(ge=1, le=2**31 - 1)) -> dict[str, Any]:
    from vmplacer.app.rebalance.rebalancer import PlanNotFound, PlanStateError, RebalanceError
    from vmplacer.app.rebalance.rebalancer import cancel_plan as cancel

    services = request.app.state.services
    actor = api_actor(request)
    try:
        outcome = cancel(plan_store(services), plan_id, by=actor.name,
                         reason=body.reason if body else "", audit=acting_store(services, actor))
    except PlanNotFound:
        raise ApiError(404, "not-found", f"plan {plan_id} does not exist", {"plan": plan_id}) from None
    except PlanStateError as exc:
        raise ApiError(409, "conflict", str(exc), {"plan": plan_id, "state": exc.state}) from None
    except RebalanceError as exc:
        raise ApiError(409, "conflict", str(exc), {"plan": plan_id}) from None
    return {"status": outcome.status, "plan": plan_view(outcome.plan)}


# ----- the resource's work beyond HTTP
APPLY_JOB = "apply-plan"


def build_rebalancer(services: ApiServices, holder: str) -> Rebalancer:
    """The rebalancer as the CLI builds it (stored model, learning, vCPU demand, probes),
    acting under `holder` in the host leases; the trials of the plans it applies are counted in
    this instance's metrics."""
    from vmplacer.bootstrap.rebalance import build_rebalancer as compose

    return compose(services.container, holder=holder, on_trial=services.metrics.rebalance_trial)


def plan_store(services: ApiServices) -> PlanStore:
    return services.container.plan_store


def plan_hosts(plan: Any) -> list[str]:
    """Every host a plan acts on: action hosts and migration targets."""
    return sorted({a.host for a in plan.actions} | {a.target_host for a in plan.actions if a.target_host})


def make_plan(services: ApiServices, hosts: list[str] | None, max_actions: int | None, scope: list[str],
              created_by: str, drain: str | None = None) -> dict[str, Any]:
    """A stored rebalance plan, or with `drain` the migrations that empty that host (which
    must be in maintenance already: a dry run changes nothing, maintenance included)."""
    from vmplacer.app.rebalance.rebalancer import PlanInputRefused, PlanningOutOfMemory, RebalanceError

    names = list(dict.fromkeys(hosts)) if hosts else services.host_names  # each host once
    unknown = sorted(set(names) - set(services.host_names))
    if unknown:
        reason = f"not configured: {', '.join(unknown)} (configured: {', '.join(services.host_names)})"
        raise ApiError(422, "validation", f"field hosts: {reason}",
                       [{"field": "hosts", "rule": "not_configured", "reason": reason}])
    if drain is not None:
        if drain not in names:
            reason = f"host {drain!r} is not among the plan's hosts ({', '.join(names)})"
            raise ApiError(422, "validation", f"field drain: {reason}", [{"field": "drain", "reason": reason}])
        if services.container.maintenance.get(drain) is None:
            raise ApiError(409, "not-in-maintenance", f"host {drain} is not in maintenance: "
                           f"PUT /v1/hosts/{drain}/maintenance first, so that nothing new lands on it",
                           {"host": drain})
    notes: list[str] = []
    rebalancer = build_rebalancer(services, f"api:{created_by}@{services.instance}")
    try:
        plan = rebalancer.make_plan(names, max_actions=max_actions, scope=scope or ("*",), notes=notes,
                                    drain=drain, need_a_host=True)
    except PlanInputRefused as exc:
        raise ApiError(422, "validation", str(exc), refusal_details(exc, drain)) from None
    except PlanningOutOfMemory as exc:
        log.error("POST /v1/plans: %s", exc)
        raise ApiError(503, "out-of-memory", str(exc), {"hosts": exc.hosts, "setting": exc.setting}) from None
    except RebalanceError as exc:
        if exc.bad_input:
            raise ApiError(422, "validation", str(exc), [{"field": "hosts", "reason": str(exc)}]) from None
        raise ApiError(409, "conflict", str(exc)) from None
    data = plan_view(plan)
    data["notes"] = notes
    return data


def refusal_details(exc: Any, drain: str | None) -> list[dict[str, Any]]:
    """A 422's details when the planner refused every host of a plan (or the host to drain):
    per host, the reason, where its pCPUs were read from, and each guest pinned to pCPUs
    that source does not list; then the hosts that could not be read."""
    details: list[dict[str, Any]] = [
        {"field": "drain" if r.host == drain else "hosts", "reason": r.message, "host": r.host,
         "capabilities": r.capabilities, "guests": [{"guest": g, "pcpus": list(p)} for g, p in r.guests]}
        for r in exc.refused.values()]
    details += [{"field": "hosts", "reason": f"not read: {error}", "host": host}
                for host, error in exc.unreadable.items()]
    return details


def plan_view(plan: Any) -> dict[str, Any]:
    """A plan as the API shows it: `errors` names each host left out when it was made (its
    guests were not considered): `unreadable` ones, then those the planner `refused`."""
    data = with_api_times(plan.to_dict(), "created_at")
    if data.get("cancel_request"):
        data["cancel_request"] = with_api_times(data["cancel_request"], "at")
    data["errors"] = ([{**entry, "kind": "unreadable"} for entry in plan.settings.get("unreadable", ())]
                      + [{"host": entry["host"], "error": entry["error"], "kind": "refused"}
                         for entry in plan.settings.get("refused", ())])
    return data


def start_apply(services: ApiServices, plan_id: int, created_by: str, token_id: int | None = None) -> Any:
    """Approve the plan and queue the job that applies it (one of racing callers wins); 409 otherwise.
    The job keeps the token's name and id: the executor's audit entries name them."""
    from vmplacer.ports import ApplyRefused

    plan = plan_store(services).get(plan_id)
    if plan is None:
        raise ApiError(404, "not-found", f"plan {plan_id} does not exist", {"plan": plan_id})
    hosts = plan_hosts(plan)
    unknown = sorted(set(hosts) - set(services.host_names))
    if unknown:
        raise ApiError(409, "conflict", f"plan {plan_id} acts on hosts no longer configured: {', '.join(unknown)}",
                       {"plan": plan_id, "hosts": unknown})
    try:
        return services.container.queue_plan_apply(plan_id, hosts, created_by, APPLY_JOB, token_id=token_id)
    except LookupError:
        raise ApiError(404, "not-found", f"plan {plan_id} does not exist", {"plan": plan_id}) from None
    except ApplyRefused as exc:
        raise ApiError(409, "conflict", str(exc), {"plan": plan_id, "state": exc.state, "job": exc.job}) from None


def apply_handler(services: ApiServices) -> Handler:
    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        from vmplacer.app.rebalance.rebalancer import RebalanceError

        plan_id = int(params["plan_id"])
        ctx.progress(0.0, f"applying plan {plan_id}")
        from vmplacer.api.actors import ApiActor, acting_store

        rebalancer = build_rebalancer(services, services.instance)  # the runner's lease holder
        ttl = services.options.lease_ttl_s
        token_id = params.get("token_id")
        actor = ApiActor(ctx.job.created_by, token_id if isinstance(token_id, int) else None, services.instance)
        try:
            plan = rebalancer.apply(plan_id, lease_ttl_s=ttl, wait_s=0.0, audit=acting_store(services, actor))
        except RebalanceError as exc:
            raise JobFailed(str(exc), code="invalid" if exc.bad_input else "conflict",
                            details={"plan": plan_id}) from None
        finally:
            for host in ctx.job.hosts:
                services.snapshots.invalidate(host)
        result = plan_view(plan)
        if plan.state != "succeeded":
            raise JobFailed(f"plan {plan_id} {plan.state}: {plan.message}", code=plan.state, details=result)
        return result

    return run


def job_handlers(services: ApiServices) -> dict[str, Handler]:
    try:
        import vmplacer.app.rebalance.rebalancer  # noqa: F401
    except ImportError:
        return {}
    return {APPLY_JOB: apply_handler(services)}
