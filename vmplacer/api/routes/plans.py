"""Rebalancing plans: a dry run that stores a plan, reading it, applying it (a job), cancelling it.

Planning observes the hosts and runs the policy: about a second per host, so POST
/v1/plans answers with the stored plan; for a fleet, `?wait=S` makes the dry run a `plan`
job (no host lease: it changes nothing) and answers 202 with it unless the plan is ready
within S seconds. Applying changes hosts (repins, live
migrations of minutes), so it is a job: the runner takes the leases of every
host the plan touches (sources and targets) before the executor starts, and
the rebalancer renews them while it works — the same leases `vmplacer
rebalance` takes, so an API apply and a CLI run never act on one host at once.

Listing keeps its old default (every plan, `empty` ones included); `state`
and `include_empty=false` narrow it, in SQL; pages follow `cursor`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Path, Query, Request, Response

from vmplacer.api.deps import Services
from vmplacer.api.actors import acting_store, api_actor, audit
from vmplacer.api.errors import COMMON_RESPONSES, CONFLICT, NOT_FOUND, OUT_OF_MEMORY, ApiError
from vmplacer.api.job_views import POLL_AFTER_S, accepted, job_view, outcome
from vmplacer.api.responses import validated_json
from vmplacer.api.paging import CursorQuery, decode, int_key, paged
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
from vmplacer.app.jobs import Handler, JobCancelled, JobContext, JobFailed

if TYPE_CHECKING:
    from vmplacer.ports import PlanStore
    from vmplacer.api.services import ApiServices

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/plans", tags=["plans"], route_class=StrictJsonRoute)
PLAN_JOB = "plan"
MAX_WAIT_S = 30.0  # a request thread waits at most this long for a dry-run job
WAIT_POLL_S = 0.1


@router.post("", operation_id="createPlan", status_code=201, response_model=None,
             summary="rebalance dry run: observe the hosts, plan moves, store the plan (nothing changes); with "
                     "`wait`, as a job (202) unless it finishes within `wait` seconds (201)",
             responses={**COMMON_RESPONSES, **CONFLICT, **OUT_OF_MEMORY,
                        201: {"model": PlanView, "description": "the stored plan"},
                        202: {"model": JobAccepted, "description": "with `wait`: the dry run is a `plan` job that "
                              "had not finished after `wait` seconds; its result is the plan"}})
def create_plan(request: Request, services: Services, body: PlanRequest,
                wait: float | None = Query(default=None, ge=0, le=MAX_WAIT_S, allow_inf_nan=False,
                                           description="run the dry run as a job and wait at most this many "
                                                       "seconds for it (0: answer 202 at once); without it the "
                                                       "request lasts as long as the dry run (about a second "
                                                       "per host)")) -> Response:
    actor = api_actor(request)
    if wait is not None:
        return _plan_job(services, actor, body, wait)
    plan = make_plan(services, body.hosts, body.max_actions, body.scope, actor.token, drain=body.drain)
    _audit_proposed(services, actor, plan, body.drain)
    return validated_json(PlanView, plan, status_code=201, headers={"Location": f"/v1/plans/{plan['id']}"})


def _audit_proposed(services: ApiServices, actor: Any, plan: dict[str, Any], drain: str | None) -> None:
    audit(services, actor, action="rebalance-propose",
          message=f"plan {plan['id']} ({plan['state']}): {plan['summary']}",
          detail={"plan_id": plan["id"], "state": plan["state"], "hosts": plan["hosts"], "drain": drain,
                  "errors": plan.get("errors", [])})


def _plan_job(services: ApiServices, actor: Any, body: PlanRequest, wait: float) -> Response:
    """Queue the dry run as a job (checked first: a bad request is refused now, not as a failed
    job), then wait up to `wait` seconds: the plan (201) if it is ready by then, else the job (202)."""
    names = plan_request_hosts(services, body.hosts, body.drain)
    if services.runner is None and services.options.run_jobs:
        raise ApiError(503, "not-ready", "the job runner is not running", None, {"Retry-After": "5"})
    params = {"hosts": names, "max_actions": body.max_actions, "scope": list(body.scope), "drain": body.drain,
              "token_id": actor.token_id}
    job = services.jobs.create(PLAN_JOB, [], params, actor.token)  # a dry run holds no host's lease
    if services.runner is not None:
        services.runner.wake()
    deadline = time.monotonic() + wait
    while not job.done and time.monotonic() < deadline:
        time.sleep(min(WAIT_POLL_S, max(deadline - time.monotonic(), 0.0)))
        job = services.jobs.get(job.id) or job
    plan_id = (job.result or {}).get("id") if job.status == "succeeded" else None
    if isinstance(plan_id, int):
        plan = plan_store(services).get(plan_id)
        if plan is not None:
            data = plan_view(plan)
            data["notes"] = (job.result or {}).get("notes", [])
            return validated_json(PlanView, data, status_code=201, headers={"Location": f"/v1/plans/{plan_id}"})
    location = f"/v1/jobs/{job.id}"
    return validated_json(JobAccepted, {"job": job_view(job), "location": location}, status_code=202,
                          headers={"Location": location, "Retry-After": POLL_AFTER_S})


@router.get("", operation_id="listPlans", response_model=PlanList,
            summary="plans, newest first (by id); a page at a time (`next`)", responses=COMMON_RESPONSES)
def list_plans(request: Request, services: Services, response: Response,
               limit: int = Query(default=20, ge=1, le=500),
               state: list[PlanState] | None = Query(default=None, description="only plans in these states "
                                                     "(repeatable; default: every state)"),
               include_empty: bool = Query(default=True, description="false: leave out `empty` plans (runs "
                                           "that found nothing to do)"),
               cursor: str | None = CursorQuery) -> dict[str, Any]:
    from vmplacer.core.rebalance.plan import PLAN_STATES

    states = sorted(set(state)) if state else list(PLAN_STATES)
    if not include_empty:
        states = [s for s in states if s != "empty"]
    wanted = None if set(states) == set(PLAN_STATES) else sorted(states)
    filters = {"state": wanted or [], "all": wanted is None}
    before = decode(cursor, "plans", filters, int_key)
    plans, last = services.container.pages.plans(limit=limit, before_id=before, states=wanted)
    return {"plans": [with_api_times(plan, "created_at") for plan in plans],
            **paged(request, response, "plans", filters, None if last is None else [last])}


@router.get("/{plan_id}", operation_id="getPlan", response_model=PlanView,
            summary="a plan: actions, reasons, predicted gain, outcome",
            responses={**COMMON_RESPONSES, **NOT_FOUND})
def get_plan(services: Services, plan_id: int = Path(ge=1, le=2**31 - 1)) -> dict[str, Any]:
    plan = plan_store(services).get(plan_id)
    if plan is None:
        raise ApiError(404, "not-found", f"plan {plan_id} does not exist", {"plan": plan_id})
    return plan_view(plan)


@router.post("/{plan_id}/apply", operation_id="applyPlan", status_code=202, response_model=JobAccepted,
             summary="apply a proposed plan (a background job); 409 if it is already applied or applying",
             responses={**COMMON_RESPONSES, **NOT_FOUND, **CONFLICT})
def apply_plan(request: Request, services: Services, response: Response,
               plan_id: int = Path(ge=1, le=2**31 - 1)) -> dict[str, Any]:
    actor = api_actor(request)
    job = start_apply(services, plan_id, actor.token, actor.token_id)
    audit(services, actor, action="rebalance-apply-queued", message=f"plan {plan_id}: job {job.id} queued",
          detail={"plan_id": plan_id, "job": job.id, "hosts": list(job.hosts)})
    return accepted(services, job, response, f"/v1/jobs/{job.id}")


@router.post("/{plan_id}/cancel", operation_id="cancelPlan", response_model=PlanCancelView,
             summary="cancel a plan: at once if proposed or approved, before its next action if running "
                     "(done actions stay applied); 409 if it is already final",
             responses={**COMMON_RESPONSES, **NOT_FOUND, **CONFLICT})
def cancel_plan(request: Request, services: Services, body: PlanCancelRequest | None = None,
                plan_id: int = Path(ge=1, le=2**31 - 1)) -> dict[str, Any]:
    from vmplacer.app.rebalance.rebalancer import PlanNotFound, PlanStateError, RebalanceError
    from vmplacer.app.rebalance.rebalancer import cancel_plan as cancel

    actor = api_actor(request)
    try:
        done = cancel(plan_store(services), plan_id, by=actor.name,
                         reason=body.reason if body else "", audit=acting_store(services, actor))
    except PlanNotFound:
        raise ApiError(404, "not-found", f"plan {plan_id} does not exist", {"plan": plan_id}) from None
    except PlanStateError as exc:
        raise ApiError(409, "conflict", str(exc), {"plan": plan_id, "state": exc.state}) from None
    except RebalanceError as exc:
        raise ApiError(409, "conflict", str(exc), {"plan": plan_id}) from None
    if done.status == "cancelled":  # its apply job, if one is queued, has nothing left to do
        for job in services.jobs.list(limit=1000, status="queued", kind=APPLY_JOB):
            if (job.parameters or {}).get("plan_id") == plan_id:
                services.jobs.cancel(job.id, actor.name)
    return {"status": done.status, "plan": plan_view(done.plan)}


def cancel_plan_of_job(services: ApiServices, actor: Any, job: Any) -> None:
    """Cancelling an apply job cancels its plan: at once if it has not started, before its next
    action if it runs (the executor reads the request between actions). A plan already final
    is left as it is."""
    from vmplacer.app.rebalance.rebalancer import RebalanceError
    from vmplacer.app.rebalance.rebalancer import cancel_plan as cancel

    plan_id = (job.parameters or {}).get("plan_id")
    if not isinstance(plan_id, int):
        return
    try:
        cancel(plan_store(services), plan_id, by=actor.name, reason=f"job {job.id} cancelled",
               audit=acting_store(services, actor))
    except RebalanceError:  # PlanNotFound and PlanStateError too: nothing left to stop
        pass


# ----- the resource's work beyond HTTP
APPLY_JOB = "apply-plan"


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

    names = plan_request_hosts(services, hosts, drain)
    notes: list[str] = []
    rebalancer = services.rebalancer(f"api:{created_by}@{services.instance}")
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


def plan_request_hosts(services: ApiServices, hosts: list[str] | None, drain: str | None) -> list[str]:
    """The hosts a dry run observes (each once; default: every configured host): 422 naming the
    field for a host not configured or a `drain` outside them, 409 when the host to drain is not
    in maintenance."""
    names = list(dict.fromkeys(hosts)) if hosts else services.host_names
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
    return names


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

        rebalancer = services.rebalancer(services.instance)  # the runner's lease holder
        ttl = services.options.lease_ttl_s
        token_id = params.get("token_id")
        actor = ApiActor(ctx.job.created_by, token_id if isinstance(token_id, int) else None, services.instance)
        try:
            plan = rebalancer.apply(plan_id, lease_ttl_s=ttl, wait_s=0.0, audit=acting_store(services, actor))
        except RebalanceError as exc:
            stored = plan_store(services).get(plan_id)
            if stored is not None and stored.state == "cancelled":  # cancelled before its first action
                raise JobCancelled(f"plan {plan_id} cancelled: {stored.message}",
                                   result=outcome(plan_view(stored), "the plan was cancelled before it "
                                                  "started")) from None
            raise JobFailed(str(exc), code="invalid" if exc.bad_input else "conflict",
                            details={"plan": plan_id}) from None
        finally:
            for host in ctx.job.hosts:
                services.snapshots.invalidate(host)
        result = plan_view(plan)
        if plan.state == "cancelled":  # stopped before its next action: done actions stay applied
            done = sum(1 for action in plan.actions if action.state == "succeeded")
            raise JobCancelled(f"plan {plan_id} cancelled: {plan.message}",
                               result=outcome(result, None if done else "cancelled before any action"))
        if plan.state != "succeeded":
            raise JobFailed(f"plan {plan_id} {plan.state}: {plan.message}", code=plan.state, details=result)
        return result

    return run


def plan_handler(services: ApiServices) -> Handler:
    """A dry run as a job (`POST /v1/plans?wait=`): the stored plan is its result; a refusal
    fails the job with the HTTP answer's code and details."""

    def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        from vmplacer.api.actors import ApiActor
        from vmplacer.api.errors import problems

        hosts = list(params.get("hosts") or [])
        ctx.progress(0.0, f"observing {len(hosts)} host(s)")
        token_id = params.get("token_id")
        actor = ApiActor(ctx.job.created_by, token_id if isinstance(token_id, int) else None, services.instance)
        try:
            plan = make_plan(services, hosts, params.get("max_actions"), list(params.get("scope") or []),
                             ctx.job.created_by, drain=params.get("drain"))
        except ApiError as exc:
            raise JobFailed(exc.message, code=exc.code, details=problems(exc.details, exc.code, exc.message)) from None
        _audit_proposed(services, actor, plan, params.get("drain"))
        return outcome(plan, "nothing worth doing was found" if plan["state"] == "empty" else None)

    return run


def job_handlers(services: ApiServices) -> dict[str, Handler]:
    try:
        import vmplacer.app.rebalance.rebalancer  # noqa: F401
    except ImportError:
        return {}
    return {APPLY_JOB: apply_handler(services), PLAN_JOB: plan_handler(services)}
