"""Freeze'nSense: start a profiling job, read a VM's distributions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic_core import PydanticCustomError

from vmplacer.api.actors import api_actor, audit
from vmplacer.api.errors import COMMON_RESPONSES, CONFLICT, HOST_ERROR, NOT_FOUND, ApiError, field_problems
from vmplacer.api.fields import DOMAIN_NAME_MAX_BYTES, DOMAIN_NAME_PATTERN, DOMAIN_NAME_RULE, check_domain_name
from vmplacer.api.placing import Placer
from vmplacer.api.profiling import PROFILE_JOB, check_vms, profiler_config, stored_profile
from vmplacer.api.routes.jobs import accepted, check_can_queue
from vmplacer.api.schemas import HOST_NAME, JobAccepted, ProfileRequest, ProfileView
from vmplacer.api.strict_json import StrictJsonRoute

router = APIRouter(prefix="/v1/profiles", tags=["profiles"], route_class=StrictJsonRoute)


@router.post("", status_code=202, response_model=JobAccepted,
             summary="start Freeze'nSense on a host (a background job; poll GET /v1/jobs/{id})",
             responses={**COMMON_RESPONSES, **CONFLICT, **HOST_ERROR})
def start_profile(request: Request, body: ProfileRequest, response: Response) -> dict[str, Any]:
    services = request.app.state.services
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


@router.get("/{guest}", response_model=ProfileView,
            summary="a VM's ζ (shared), ζb (neighbours frozen) and degradation distributions",
            responses={**COMMON_RESPONSES, **NOT_FOUND})
def get_profile(request: Request,
                guest: str = Path(min_length=1, max_length=DOMAIN_NAME_MAX_BYTES, description=DOMAIN_NAME_RULE,
                                  json_schema_extra={"pattern": DOMAIN_NAME_PATTERN}),
                run_id: int | None = Query(default=None, ge=1, le=2**31 - 1),
                host: str | None = Query(default=None, pattern=HOST_NAME, max_length=63)) -> dict[str, Any]:
    try:  # any libvirt domain name, by the rule POST /v1/profiles applies to `vms`
        check_domain_name(guest)
    except PydanticCustomError as exc:
        raise ApiError(422, "validation", f"field guest: {exc}", field_problems([("guest", str(exc))])) from None
    return stored_profile(request.app.state.services, guest, run_id, host)
