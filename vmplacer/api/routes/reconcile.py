"""Reconcile: make placement records agree with what libvirt runs (see docs/operations.md).

An orchestrator that undefines or migrates domains itself calls this so the
pCPUs those domains held count as free again. It takes a few libvirt and
database calls per host, so it answers directly; a host another run holds
(its lease) or that does not answer is named in the report, and the others
are still reconciled. Rebalancing plans a stopped process left `running` are
closed first (`closed_plans`).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from fastapi import APIRouter, Request

from vmplacer.api.deps import Services
from vmplacer.api.actors import api_actor
from vmplacer.api.errors import COMMON_RESPONSES, CONFLICT, ApiError
from vmplacer.api.schemas import ReconcileRequest, ReconcileView
from vmplacer.api.strict_json import StrictJsonRoute

router = APIRouter(prefix="/v1/reconcile", tags=["reconcile"], route_class=StrictJsonRoute)


@router.post("", operation_id="reconcileHosts", response_model=ReconcileView,
             summary="release records of domains undefined or moved outside vmplacer, follow libvirt's states",
             responses={**COMMON_RESPONSES, **CONFLICT})
def reconcile(request: Request, services: Services, body: ReconcileRequest) -> dict[str, Any]:
    from vmplacer.app.observe.reconcile import ReconcileError

    actor = api_actor(request)
    names = list(dict.fromkeys(body.hosts)) if body.hosts else services.host_names
    unknown = sorted(set(names) - set(services.host_names))
    if unknown:
        reason = f"not configured: {', '.join(unknown)} (configured: {', '.join(services.host_names)})"
        raise ApiError(422, "validation", f"field hosts: {reason}",
                       [{"field": "hosts", "rule": "not_configured", "reason": reason}])
    holder = f"api:{actor.token}@{services.instance}:{socket.gethostname()}:{os.getpid()}"
    # the store auditing as the caller, as `actors.acting_store` builds it (typed as the container takes it)
    reconciler = services.container.reconciler(holder, services.container.placement_store_as(actor.name,
                                                                                              actor.detail()))
    try:
        report = reconciler.run(
            names, dry_run=body.dry_run, planned_grace_s=body.reservation_grace_s, settle_s=body.settle_s)
    except ReconcileError as exc:
        raise ApiError(422 if exc.bad_input else 409, "validation" if exc.bad_input else "conflict",
                       str(exc)) from None
    data = report.to_dict()
    for host in data["hosts"]:
        for finding in host["findings"]:
            services.metrics.reconcile_findings.labels(host["host"], finding["kind"], finding["outcome"]).inc()
    return data
