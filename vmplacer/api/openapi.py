"""The OpenAPI document: the contract clients are generated from.

It is the same for every deployment (no host names, no configured limits: a client
generated once keeps working when hosts come and go), and it declares what the
routes' own signatures cannot:

- the token: public paths need none (the check is app-wide, so the framework marks
  every operation as needing one);
- `Idempotency-Key` on every POST (vmplacer.api.idempotency honours it on all of them);
- the response headers a client acts on: `X-Request-Id` everywhere, `Location` on
  201/202, `Retry-After` where the server sets it (202s, polling an unfinished job),
  `Idempotent-Replayed` on POSTs, `Link` to a list's next page, `Allow` on a 405 (the
  `default` answer: any status an operation does not list, in the one error shape);
- an optional body as optional (`required: false`, the model itself), not as a
  required "model or null" a generator turns into a mandatory argument;
- links: which answer names what another operation takes (a placement made → read it or
  remove it; a job accepted → poll it or cancel it), so a client can follow them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from vmplacer.api.auth import PUBLIC_PATHS
from vmplacer.api.idempotency import KEY_PATTERN, KEY_RULE
from vmplacer.api.request_id import ID_PATTERN

TAGS = [
    {"name": "placements", "description": "place guests (dry run, reserve, define, start), read and remove them"},
    {"name": "hosts", "description": "configured hosts, their topology, maintenance"},
    {"name": "plans", "description": "rebalancing plans: dry run, apply (a job), cancel"},
    {"name": "profiles", "description": "Freeze'nSense interference profiling (a job) and its results"},
    {"name": "protect", "description": "protection loops (a job per host)"},
    {"name": "jobs", "description": "background jobs: state, progress, result"},
    {"name": "reconcile", "description": "make placement records agree with libvirt"},
    {"name": "audit", "description": "the audit log"},
    {"name": "operations", "description": "liveness, readiness, metrics"},
]

IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": f"{KEY_RULE}. A retry with the same key, token and request (method, path, query, body as "
                   "canonical JSON) gets the first answer back (any status below 500, kept 24 hours) with "
                   "`Idempotent-Replayed: true`; while the first still runs it waits up to 10 s (then 409 "
                   "`idempotency-key-in-use` with Retry-After); the same key with another request is 422 "
                   "`idempotency-key-reused`; a malformed key is 422 naming `Idempotency-Key`.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": KEY_PATTERN},
}

HEADERS: dict[str, dict[str, Any]] = {
    "X-Request-Id": {
        "description": "this request's id: the caller's own `X-Request-Id` when it matches the pattern, "
                       "else a new one; error bodies repeat it as `request_id`",
        "required": True,
        "schema": {"type": "string", "pattern": ID_PATTERN, "maxLength": 128},
    },
    "Location": {
        "description": "where to follow the result: the placement, the plan, or the job to poll",
        "required": True,
        "schema": {"type": "string"},
    },
    "Retry-After": {
        "description": "seconds to wait before asking again",
        "schema": {"type": "integer", "minimum": 0},
    },
    "Idempotent-Replayed": {
        "description": "`true`: the stored answer to an earlier request with this Idempotency-Key",
        "schema": {"type": "string", "enum": ["true"]},
    },
    "Link": {
        "description": "`<PATH?QUERY>; rel=\"next\"`: the next page of a list (the body's `next`); absent on the "
                       "last page",
        "schema": {"type": "string"},
    },
    "WWW-Authenticate": {
        "description": "`Bearer`: the scheme the token goes in",
        "schema": {"type": "string"},
    },
    "Allow": {
        "description": "on a 405: the methods the path offers, e.g. `GET, POST`",
        "schema": {"type": "string"},
    },
}

# Which headers each kind of response has (beyond X-Request-Id on all): Location and
# Retry-After on every 202 (the job to poll, and when); the others where some answer sets them.
REQUIRED_RETRY_AFTER = {"202"}
OPTIONAL_RETRY_AFTER = {"503"}
POST_RETRY_AFTER = {"409"}  # idempotency-key-in-use
# Reads of something that is still under way: their 200 carries Retry-After until it is final.
POLLED = {"/v1/jobs/{job_id}"}
# Lists paged by cursor: their 200 links the next page.
PAGED = {"/v1/placements", "/v1/jobs", "/v1/plans", "/v1/audit"}



def _link(operation: str, description: str, **parameters: str) -> dict[str, Any]:
    return {"operationId": operation, "parameters": parameters, "description": description}


_JOB_LINKS = {
    "GetJob": _link("getJob", "poll the job", job_id="$response.body#/job/id"),
    "CancelJob": _link("cancelJob", "cancel the job", job_id="$response.body#/job/id"),
}
# (path, method, status) -> the links of that answer: each names the operation and where its
# parameters come from (a runtime expression on this request or answer).
LINKS: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {
    ("/v1/placements", "post", "201"): {
        "GetPlacement": _link("getPlacement", "the recorded placement", guest="$response.body#/guest"),
        "DeletePlacement": _link("deletePlacement", "remove it again", guest="$response.body#/guest"),
    },
    ("/v1/placements", "get", "200"): {
        "GetPlacement": _link("getPlacement", "the first placement listed",
                              guest="$response.body#/placements/0/guest"),
    },
    ("/v1/placements/{guest}", "get", "200"): {
        "DeletePlacement": _link("deletePlacement", "remove it", guest="$response.body#/guest"),
    },
    ("/v1/hosts", "get", "200"): {
        "GetHostTopology": _link("getHostTopology", "the first host's topology", host="$response.body#/hosts/0/name"),
        "EnterMaintenance": _link("enterMaintenance", "put the first host into maintenance",
                                  host="$response.body#/hosts/0/name"),
        "LeaveMaintenance": _link("leaveMaintenance", "bring the first host back into service",
                                  host="$response.body#/hosts/0/name"),
    },
    ("/v1/hosts/{host}/maintenance", "put", "200"): {
        "LeaveMaintenance": _link("leaveMaintenance", "bring the host back into service", host="$response.body#/host"),
    },
    ("/v1/hosts/{host}/maintenance", "delete", "200"): {
        "EnterMaintenance": _link("enterMaintenance", "put the host into maintenance again",
                                  host="$response.body#/host"),
    },
    ("/v1/plans", "post", "201"): {
        "GetPlan": _link("getPlan", "the stored plan", plan_id="$response.body#/id"),
        "ApplyPlan": _link("applyPlan", "apply it (a job)", plan_id="$response.body#/id"),
        "CancelPlan": _link("cancelPlan", "cancel it", plan_id="$response.body#/id"),
    },
    ("/v1/plans", "post", "202"): _JOB_LINKS,
    ("/v1/plans", "get", "200"): {
        "GetPlan": _link("getPlan", "the newest plan listed", plan_id="$response.body#/plans/0/id"),
    },
    ("/v1/plans/{plan_id}", "get", "200"): {
        "ApplyPlan": _link("applyPlan", "apply it (a job)", plan_id="$response.body#/id"),
        "CancelPlan": _link("cancelPlan", "cancel it", plan_id="$response.body#/id"),
    },
    ("/v1/plans/{plan_id}/apply", "post", "202"): {
        **_JOB_LINKS, "GetPlan": _link("getPlan", "the plan being applied", plan_id="$request.path.plan_id"),
        "CancelPlan": _link("cancelPlan", "cancel the plan (and its job)", plan_id="$request.path.plan_id"),
    },
    ("/v1/plans/{plan_id}/cancel", "post", "200"): {
        "GetPlan": _link("getPlan", "the plan", plan_id="$response.body#/plan/id"),
    },
    ("/v1/profiles", "post", "202"): _JOB_LINKS,
    ("/v1/protect", "post", "202"): {
        **_JOB_LINKS,
        "GetProtection": _link("getProtection", "the loop's state", job_id="$response.body#/job/id"),
        "StopProtection": _link("stopProtection", "stop the loop", job_id="$response.body#/job/id"),
    },
    ("/v1/protect/{job_id}", "delete", "202"): {
        "GetJob": _link("getJob", "how the stop goes", job_id="$response.body#/job/id"),
    },
    ("/v1/jobs", "get", "200"): {
        "GetJob": _link("getJob", "the newest job listed", job_id="$response.body#/jobs/0/id"),
        "CancelJob": _link("cancelJob", "cancel it", job_id="$response.body#/jobs/0/id"),
    },
    ("/v1/jobs/{job_id}", "get", "200"): {
        "CancelJob": _link("cancelJob", "cancel it", job_id="$response.body#/id"),
    },
    ("/v1/jobs/{job_id}/cancel", "post", "200"): {
        "GetJob": _link("getJob", "the cancelled job", job_id="$response.body#/job/id"),
    },
    ("/v1/jobs/{job_id}/cancel", "post", "202"): {
        "GetJob": _link("getJob", "poll it until it stops", job_id="$response.body#/job/id"),
    },
}


def operation_id(route: APIRoute) -> str:
    """The route's own name as a camelCase operationId (`create_placement` → `createPlacement`): stable
    as long as the route keeps its name, whatever its path or method (routes set theirs explicitly)."""
    head, *rest = route.name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def install_contract(app: FastAPI) -> None:
    """Let `app.openapi()` build the finished document once (the framework caches it)."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = finish(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def finish(schema: dict[str, Any]) -> dict[str, Any]:
    components = schema.setdefault("components", {})
    components["parameters"] = {"IdempotencyKey": IDEMPOTENCY_KEY}
    components["headers"] = {_component(name): definition for name, definition in HEADERS.items()}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            if path in PUBLIC_PATHS:
                operation["security"] = []
            if method == "post":
                operation.setdefault("parameters", []).append({"$ref": "#/components/parameters/IdempotencyKey"})
            _optional_body(operation)
            for status, response in operation.get("responses", {}).items():
                response["headers"] = _headers(method, status)
                links = LINKS.get((path, method, status))
                if links:
                    response["links"] = links
                if method == "get" and status == "200" and path in PAGED:
                    response["headers"]["Link"] = {"$ref": "#/components/headers/Link"}
                if method == "get" and status == "200" and path in POLLED:
                    response["headers"]["Retry-After"] = {
                        **HEADERS["Retry-After"],
                        "description": "present while the job has not finished: seconds before the next look"}
    return schema


def _component(header: str) -> str:
    return header.replace("-", "")


def _headers(method: str, status: str) -> dict[str, Any]:
    names = ["X-Request-Id"]
    if status in ("201", "202"):
        names.append("Location")
    if status in REQUIRED_RETRY_AFTER or status in OPTIONAL_RETRY_AFTER or (
            method == "post" and status in POST_RETRY_AFTER):
        names.append("Retry-After")
    if method == "post":
        names.append("Idempotent-Replayed")
    if status == "401":
        names.append("WWW-Authenticate")
    if status == "default":
        names.append("Allow")
    headers: dict[str, Any] = {name: {"$ref": f"#/components/headers/{_component(name)}"} for name in names}
    if status in REQUIRED_RETRY_AFTER:  # a $ref cannot be overridden: this one spelled out, required
        headers["Retry-After"] = {**HEADERS["Retry-After"], "required": True,
                                  "description": "seconds before the first look at the job"}
    return headers


def _optional_body(operation: dict[str, Any]) -> None:
    """`anyOf: [Model, null]` (a body parameter defaulting to None) → the model, `required: false`."""
    body = operation.get("requestBody")
    if not body:
        return
    for media in body.get("content", {}).values():
        schema = media.get("schema", {})
        options = schema.get("anyOf")
        if options and len(options) == 2 and {"type": "null"} in options:
            media["schema"] = next(option for option in options if option != {"type": "null"})
            body["required"] = False
