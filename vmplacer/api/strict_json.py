"""Requests as the contract has them, checked by every API route (`StrictJsonRoute`).

- A body of JSON `null` is refused (an optional body is left out instead).
- Bodies are JSON as RFC 8259 defines it: `NaN`, `Infinity` and `-Infinity` are refused.
  Python's parser accepts them as numbers, and a NaN label or extra spec would be stored and
  later compare unequal to itself. The refusal is a 422 naming every field that holds one.
- Query parameters the route does not declare are refused, as unknown body keys are: a
  misspelt or unsupported filter (`?untill=`) silently ignored would answer a question the
  caller did not ask. The 422 has the shape of a body's unknown key (`extra_forbidden`),
  naming `query.<name>`; it comes after the token check, like every other validation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from vmplacer.api.errors import ApiError, field_problems


class _NotANumber:
    """Where the parser met NaN or ±Infinity."""

    def __init__(self, token: str):
        self.token = token


def refuse_non_finite(body: bytes | str) -> None:
    """A 422 naming every field of a JSON body that holds NaN or ±Infinity. A body that is not
    JSON at all is left to the framework, which reports where it breaks."""
    try:
        document = json.loads(body, parse_constant=_NotANumber)
    except ValueError:
        return
    found: list[tuple[str, str]] = []
    _collect(document, "", found)
    if found:
        problems = [(path or "body", f"{token} is not a JSON number (RFC 8259 has no NaN or Infinity)")
                    for path, token in found]
        raise ApiError(422, "validation", "; ".join(f"field {f}: {r}" for f, r in problems),
                       field_problems(problems))


def refuse_null(body: bytes) -> None:
    """A body of JSON `null` is refused: the contract's bodies are objects, an optional one is
    left out (the framework would take `null` for "no body" and let it pass unseen)."""
    if body.strip() == b"null":
        reason = "the body must be a JSON object (or, where it is optional, no body at all), not null"
        raise ApiError(422, "validation", f"field body: {reason}", field_problems([("body", reason)], "model_type"))


def _collect(value: Any, path: str, found: list[tuple[str, str]]) -> None:
    if isinstance(value, _NotANumber):
        found.append((path, value.token))
    elif isinstance(value, dict):
        for key, item in value.items():
            _collect(item, f"{path}.{key}" if path else str(key), found)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _collect(item, f"{path}.{index}" if path else str(index), found)


def declared_query(route: APIRoute) -> frozenset[str]:
    """The query parameter names a route takes (its own and its dependencies'), by alias."""
    names = getattr(route, "_declared_query", None)
    if names is None:
        found: set[str] = set()
        pending = [route.dependant]
        while pending:
            dependant = pending.pop()
            found.update(param.alias for param in dependant.query_params)
            pending.extend(dependant.dependencies)
        names = frozenset(found)
        route._declared_query = names  # type: ignore[attr-defined]
    return names


async def refuse_unknown_query(request: Request) -> None:
    """The last dependency of every API route (on the event loop: no worker thread for it): a 422
    naming each query parameter the route does not take."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    known = declared_query(route)
    unknown = list(dict.fromkeys(name for name in request.query_params.keys() if name not in known))
    if unknown:
        raise RequestValidationError([
            {"type": "extra_forbidden", "loc": ("query", name), "msg": "Extra inputs are not permitted",
             "input": request.query_params.get(name)} for name in unknown])


class StrictJsonRoute(APIRoute):
    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any):
        kwargs["dependencies"] = [*(kwargs.get("dependencies") or ()), Depends(refuse_unknown_query)]
        super().__init__(path, endpoint, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            body = await request.body()  # kept by the request: the route reads it again
            if body and "json" in request.headers.get("content-type", "application/json"):
                refuse_null(body)
                refuse_non_finite(body)
            return await handler(request)

        return strict
