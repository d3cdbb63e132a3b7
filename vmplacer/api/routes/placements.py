"""POST/GET/DELETE placements."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Query, Request, Response

from vmplacer.adapters.domain_xml_policy import DomainXmlPolicyError
from vmplacer.api.deps import Services
from vmplacer.api.actors import acting_placement, acting_store, api_actor
from vmplacer.api.fields import LABEL_FILTER_HELP, LabelFilter, label_filter
from vmplacer.api.errors import COMMON_RESPONSES, CONFLICT, HOST_ERROR, NOT_FOUND, ApiError
from vmplacer.api.paging import CursorQuery, decode, int_key, paged
from vmplacer.api.placing import Placer, check_base_xml
from vmplacer.api.responses import validated_json
from vmplacer.api.schemas import (
    GUEST_NAME,
    HOST_NAME,
    PlacementList,
    PlacementRecord,
    PlacementRequest,
    PlacementState,
    PlacementView,
    Removed,
)
from vmplacer.api.strict_json import StrictJsonRoute
from vmplacer.api.xml_policy import admit_base_xml, policy_refusal
from vmplacer.core.placement.guest import GuestSpec

router = APIRouter(prefix="/v1/placements", tags=["placements"], route_class=StrictJsonRoute)


@router.post(
    "",
    operation_id="createPlacement",
    response_model=PlacementView,
    summary="place a guest: pinning, memory nodes and domain XML (dry run, reserve, define, start)",
    responses={**COMMON_RESPONSES, **CONFLICT, **HOST_ERROR,
               201: {"model": PlacementView, "description": "placed (reserved, defined or running)"}},
)
def create_placement(request: Request, services: Services, body: PlacementRequest) -> Response:
    actor = api_actor(request)
    spec = GuestSpec.from_mapping(body.guest_fields())
    if body.base_xml is not None and len(body.base_xml) > services.base_xml_limit:
        reason = f"at most {services.base_xml_limit} characters (half of api.max_request_bytes)"
        raise ApiError(422, "validation", f"field base_xml: {reason}", [{"field": "base_xml", "reason": reason}])
    base_xml = check_base_xml(body.base_xml, spec.name)
    placer = Placer(services, acting_placement(services, actor))
    hosts = placer.candidates(body.host, dry_run=body.dry_run, batched=body.define)
    if body.start and not body.define:
        raise ApiError(422, "validation", "start needs define (a reserved guest is defined by the caller)",
                       [{"field": "start", "reason": "start=true requires define=true"}])
    hosts = admit_base_xml(services, spec.name, hosts, base_xml)  # before any fit, claim or define
    try:
        if body.dry_run:  # the dry-run renderer holds its XML to the policy too (services._render)
            return validated_json(PlacementView, placer.plan(spec, hosts, base_xml).to_dict())
        outcome = placer.place(spec, hosts, base_xml, define=body.define, start=body.start, actor=actor.detail())
    except DomainXmlPolicyError as exc:  # the rendered XML, refused before libvirt saw it (claim undone)
        raise policy_refusal(exc) from None
    return validated_json(PlacementView, outcome.to_dict(), status_code=201,
                          headers={"Location": f"/v1/placements/{spec.name}"})


@router.get("", operation_id="listPlacements", response_model=PlacementList,
            summary="placements vmplacer recorded, newest first; a page at a time (`next`)",
            responses=COMMON_RESPONSES)
def list_placements(request: Request, services: Services, response: Response,
                    host: str | None = Query(default=None, pattern=HOST_NAME, max_length=63),
                    state: list[PlacementState] | None = Query(default=None, description="only placements in these "
                                                               "states (repeatable; default: every state)"),
                    label: list[LabelFilter] | None = Query(default=None, max_length=16,
                                                            description=LABEL_FILTER_HELP),
                    limit: int = Query(default=1000, ge=1, le=10_000),
                    cursor: str | None = CursorQuery) -> dict[str, Any]:
    labels = label_filter(label or [])
    states = sorted(set(state or ()))
    filters = {"host": host, "state": states, "label": sorted(f"{k}={v}" for k, v in labels.items())}
    before = decode(cursor, "placements", filters, int_key)
    records, last = services.container.pages.placements(
        limit=limit, before_id=before, host=host, states=states or None, labels=labels)
    return {"placements": records,
            **paged(request, response, "placements", filters, None if last is None else [last])}




@router.get("/{guest}", operation_id="getPlacement", response_model=PlacementRecord, summary="one recorded placement",
            responses={**COMMON_RESPONSES, **NOT_FOUND})
def get_placement(services: Services, guest: str = Path(pattern=GUEST_NAME, max_length=64)) -> dict[str, Any]:
    record = services.container.placement_store.get(guest)
    if record is None:
        raise ApiError(404, "not-found", f"guest {guest}: no placement recorded", {"guest": guest})
    return record


@router.delete("/{guest}", operation_id="deletePlacement", response_model=Removed,
               summary="forget a placement and free its pCPUs; by default also destroy and undefine the domain",
               responses={**COMMON_RESPONSES, **NOT_FOUND, **HOST_ERROR})
def delete_placement(request: Request, services: Services, guest: str = Path(pattern=GUEST_NAME, max_length=64),
                     undefine: bool = Query(default=True, description="destroy and undefine the domain too "
                                            "(never for a reservation: its domain belongs to the caller)")
                     ) -> dict[str, Any]:
    actor = api_actor(request)
    store = acting_store(services, actor)
    record = store.get(guest)
    if record is None:
        raise ApiError(404, "not-found", f"guest {guest}: no placement recorded", {"guest": guest})
    host_name = record["host"]
    do_undefine = undefine and record["state"] != "planned"
    if host_name in services.host_names:
        host = services.container.hypervisor(host_name)
        if do_undefine:
            _reachable(host, guest)
        try:
            domain = services.placement.acting_through(store).remove(host, guest, undefine=do_undefine)
        finally:
            services.snapshots.invalidate(host_name)
    else:  # the host left the configuration: only the record can go
        store.forget(guest)
        domain = "kept"
        store.audit(action="remove", outcome="ok", host=host_name, guest=guest,
                    message="host no longer configured: record only, the domain was not touched",
                    detail={"undefine": undefine, "undefined": False, "domain": domain})
    return {"guest": guest, "host": host_name, "undefined": domain == "undefined", "domain": domain}


def _reachable(host: Any, guest: str) -> None:
    """Undefining on a host that does not answer would forget the record but leave the
    domain: answer 503 (naming the host) and keep the record instead."""
    from vmplacer.ports import DomainGone

    try:
        host.domain_state(guest)
    except DomainGone:
        pass
