"""One error shape for every failure, and the mapping from domain errors to HTTP.

    {"error": {"code": "no-fit", "message": "...", "details": [{"field", "rule", "reason", ...}],
               "request_id": "..."}}

`details` is always a list (empty when there is nothing to add): one entry per problem, each
naming the `field` at fault (null when no field is), the `rule` broken (a machine-readable
kind) and the `reason` in words, plus what that kind of error knows (host, guest, reasons, …).
A client reads every error the same way, whatever the route.

- bad input (request validation, guest spec problems, invalid base XML) → 422, each
  problem naming its field;
- a guest that does not fit → 409 with every NoFit reason; a lost race → 409;
- a host that cannot be reached → 503 naming the host; a host refusing an
  operation → 502 naming the host and the domain;
- the database unreachable → 503;
- the process out of memory → 503 `out-of-memory` (planning: naming the hosts and the setting).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, RootModel
from sqlalchemy.exc import OperationalError as DatabaseOperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from vmplacer.adapters.domain_xml import DomainXmlError
from vmplacer.adapters.libvirt_errors import EXISTS, DomainRefused
from vmplacer.api.limits import BodyTooLarge, too_large_body
from vmplacer.api.request_id import chosen_id, current_request_id
from vmplacer.config import ConfigError
from vmplacer.core.placement.guest import GuestSpecError
from vmplacer.core.placement.nofit import NoFit
from vmplacer.ports import ClaimConflict, HypervisorError

log = logging.getLogger(__name__)


class Problem(BaseModel):
    """One entry of an error's `details`."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": True})

    field: str | None = Field(description="the request field at fault, dotted (`labels.env`, `query.limit`, "
                              "`Idempotency-Key`); null when no single field is")
    rule: str = Field(description="the rule broken, machine-readable: a validation kind (`missing`, "
                      "`extra_forbidden`, `string_pattern_mismatch`, …) or the error's code")
    reason: str = Field(description="what is wrong, in words")


class ErrorDetails(RootModel[list[Problem]]):
    """Every problem of one error; structured data of the error's kind rides along in each entry."""


class ErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable kind, e.g. validation, no-fit, host-unavailable")
    message: str = Field(description="what went wrong, naming the guest, host, field")
    details: ErrorDetails = Field(description="one entry per problem (empty: nothing to add to the message)")
    request_id: str = Field(description="this request's id, as in the X-Request-Id response header")


class ErrorBody(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """An answer other than success, raised anywhere below a route."""

    def __init__(self, status: int, code: str, message: str, details: Any = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers


def error_response(status: int, code: str, message: str, details: Any = None,
                   headers: dict[str, str] | None = None, *, request_id: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(code, message, details, request_id=request_id), status_code=status,
                        headers=headers)


def error_body(code: str, message: str, details: Any = None, *, request_id: str | None = None) -> dict[str, Any]:
    """The one error document: `details` as a list of problems, the request's id (default: the
    request being served)."""
    return {"error": {"code": code, "message": message, "details": problems(details, code, message),
                      "request_id": request_id or current_request_id()}}


def problems(details: Any, code: str, message: str) -> list[dict[str, Any]]:
    """`details` in the one shape: a list of {field, rule, reason, ...}. An object becomes one
    entry carrying its keys; an entry without a rule or reason takes the error's code and message."""
    if details is None:
        return []
    items = details if isinstance(details, list) else [details]
    result = []
    for item in items:
        entry = dict(item) if isinstance(item, dict) else {"reason": str(item)}
        result.append({"field": entry.pop("field", None), "rule": entry.pop("rule", None) or code,
                       "reason": entry.pop("reason", None) or message, **entry})
    return result


def field_problems(pairs: list[tuple[str, str]], rule: str | None = None) -> list[dict[str, str]]:
    """(field, reason) pairs as problems; without `rule`, each takes the error's code."""
    return [{"field": f, "reason": r, **({"rule": rule} if rule else {})} for f, r in pairs]


def _describe(status: int, text: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": text}


# Any other status, in the same shape: 500 `internal`, 405 `method-not-allowed` (with `Allow`),
# 400 `bad-request` (an unreadable Content-Length). Declared so that a generated client reads them
# as an ErrorBody instead of failing on a status the operation does not list.
UNEXPECTED: dict[int | str, dict[str, Any]] = {
    "default": {"model": ErrorBody, "description": "any other error, in the same shape: 500 `internal` (see the "
                "server log), 405 `method-not-allowed` (`Allow` lists the path's methods), 400 `bad-request`"}}
# Documented on every route (the OpenAPI schema lists what a client may see).
COMMON_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _describe(401, "no bearer token, or an unknown one"),
    403: _describe(403, "the token's scope does not allow this (read tokens cannot change anything)"),
    413: _describe(413, "request body larger than api.max_request_bytes"),
    422: _describe(422, "invalid request: each problem names its field"),
    503: _describe(503, "the database or a host is unreachable (the host is named)"),
    **UNEXPECTED,
}
NOT_FOUND = {404: _describe(404, "no such object")}
CONFLICT = {409: _describe(409, "conflicts with the current state (no fit, already exists, busy); on a POST also "
                                "`idempotency-key-in-use`: a request with the same Idempotency-Key is still "
                                "being answered (retry after Retry-After)")}
HOST_ERROR = {502: _describe(502, "a host refused the operation (the host and domain are named)")}
OUT_OF_MEMORY = {503: _describe(503, "the database or a host is unreachable (the host is named), or planning ran "
                                     "out of memory (`out-of-memory`: the hosts and the setting to lower are named)")}


def _validation_field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "body"


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route offers on this path (the framework names only the first route's)."""
    from fastapi.routing import iter_route_contexts
    from starlette.routing import Match

    methods: set[str] = set()
    for route in iter_route_contexts(request.app.routes):
        try:
            match, _ = route.matches(request.scope)
        except Exception:  # noqa: BLE001 - a route that cannot say is not one of ours
            continue
        if match in (Match.FULL, Match.PARTIAL) and route.methods:
            methods |= set(route.methods)
    return sorted(methods)


def _invalid_json(item: dict[str, Any], document: Any) -> JSONResponse:
    """The parser's complaint at a line and column (its offset alone reads like a field name)."""
    loc = tuple(item.get("loc", ()))
    offset = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else 0
    text = document if isinstance(document, str) else ""
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    what = str((item.get("ctx") or {}).get("error") or "invalid JSON")
    reason = f"{what} at line {line}, column {column} (character {offset})"
    return error_response(422, "invalid-json", f"request body is not valid JSON: {reason}",
                          [{"field": "body", "rule": "json", "reason": reason, "line": line, "column": column}])


def install_error_handlers(app: FastAPI, on_libvirt_error=None) -> None:  # type: ignore[no-untyped-def]
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        invalid_json = next((item for item in exc.errors() if item.get("type") == "json_invalid"), None)
        if invalid_json is not None:
            return _invalid_json(invalid_json, exc.body)
        found = []
        for item in exc.errors():
            loc = tuple(item.get("loc", ()))
            where = loc[0] if loc else "body"
            field = _validation_field(loc) if where == "body" else ".".join(str(p) for p in loc)
            found.append({"field": field, "rule": str(item.get("type") or "invalid"),
                          "reason": str(item.get("msg", "invalid"))})
        message = "; ".join(f"field {p['field']}: {p['reason']}" for p in found) or "invalid request"
        return error_response(422, "validation", message, found)

    @app.exception_handler(GuestSpecError)
    async def _guest_spec(_request: Request, exc: GuestSpecError) -> JSONResponse:
        return error_response(422, "validation", str(exc),
                              field_problems([(p.field, p.reason) for p in exc.problems], "guest_spec"))

    @app.exception_handler(DomainXmlError)
    async def _domain_xml(_request: Request, exc: DomainXmlError) -> JSONResponse:
        # rendering merges the caller's base XML and validates the result against libvirt's schema
        return error_response(422, "invalid-xml", str(exc), field_problems([("base_xml", str(exc))], "xml"))

    @app.exception_handler(NoFit)
    async def _no_fit(_request: Request, exc: NoFit) -> JSONResponse:
        return error_response(409, "no-fit", str(exc), exc.to_dict())

    @app.exception_handler(ClaimConflict)
    async def _claim(_request: Request, exc: ClaimConflict) -> JSONResponse:
        return error_response(409, "conflict", str(exc))

    @app.exception_handler(DomainRefused)
    async def _refused(_request: Request, exc: DomainRefused) -> JSONResponse:
        # the caller's XML, not the host, is at fault: retrying the same request fails again
        if exc.reason == EXISTS:
            return error_response(409, "exists", str(exc), {"guest": exc.domain or None, "host": exc.host or None,
                                                           "field": "base_xml"})
        return error_response(422, "invalid-xml", str(exc),
                              [{"field": "base_xml", "reason": str(exc), "host": exc.host or None}])

    @app.exception_handler(HypervisorError)
    async def _hypervisor(_request: Request, exc: HypervisorError) -> JSONResponse:
        if on_libvirt_error is not None:
            on_libvirt_error(exc)
        details = {"host": exc.host or None, "domain": exc.domain or None, "retriable": exc.retriable}
        if exc.retriable:
            return error_response(503, "host-unavailable", str(exc), details, {"Retry-After": "5"})
        return error_response(502, "host-error", str(exc), details)

    @app.exception_handler(DatabaseOperationalError)
    async def _database(_request: Request, exc: DatabaseOperationalError) -> JSONResponse:
        log.error("database unavailable: %s", exc.orig if exc.orig is not None else exc)
        return error_response(503, "database-unavailable", "the database is unreachable or busy; retry later",
                              None, {"Retry-After": "5"})

    @app.exception_handler(ConfigError)
    async def _config(_request: Request, exc: ConfigError) -> JSONResponse:
        return error_response(422, "validation", str(exc), field_problems([("host", str(exc))]))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {401: "unauthorized", 403: "forbidden", 404: "not-found", 405: "method-not-allowed",
                 413: "too-large"}
        headers = dict(exc.headers) if exc.headers else {}
        if isinstance(exc, BodyTooLarge):  # counted while streaming: the body of a refused Content-Length
            return JSONResponse(too_large_body(exc.limit, current_request_id()), status_code=413,
                                headers={"Connection": "close"})
        if exc.status_code == 400:  # the framework could not even decode the body (e.g. not UTF-8)
            return error_response(422, "invalid-json", "request body is not valid JSON (UTF-8)",
                                  field_problems([("body", str(exc.detail))], "utf-8"))
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return error_response(exc.status_code, codes.get(exc.status_code, "http"), str(exc.detail),
                              None, headers or None)

    @app.exception_handler(MemoryError)
    async def _out_of_memory(request: Request, exc: MemoryError) -> JSONResponse:
        # never a bare 500: the process lives on, the request's work is dropped (routes that know
        # what ran out, e.g. planning, answer their own 503 naming the hosts and the setting)
        log.error("%s %s ran out of memory", request.method, request.url.path)
        return error_response(503, "out-of-memory", "the server ran out of memory handling this request; "
                              "nothing it was doing is kept (see the server log)")

    app.add_middleware(InternalErrors)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        """A middleware's own failure, answered outside every middleware: the request's id is gone
        by then, so the caller's own (or a new one) is named, in the header as in the body."""
        log.exception("%s %s failed", request.method, request.url.path)
        request_id = chosen_id(list(request.scope.get("headers", ())))
        return error_response(500, "internal", internal_message(exc), None, {"X-Request-Id": request_id},
                              request_id=request_id)


def internal_message(exc: BaseException) -> str:
    return f"internal error ({exc.__class__.__name__}); see the server log"


class InternalErrors:
    """Pure ASGI, just outside the framework's exception handlers: an exception none of them took
    becomes the 500 `internal` here, inside the other middlewares, while the request's id is still
    set: the answer names the request in its body and X-Request-Id header, as every other answer
    does (the framework's own last resort runs outside every middleware)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:  # half an answer is out: nothing sound can follow it
                raise
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            await error_response(500, "internal", internal_message(exc))(scope, receive, send)
