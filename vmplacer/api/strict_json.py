"""Request bodies are JSON as RFC 8259 defines it: `NaN`, `Infinity` and `-Infinity` are refused.

Python's parser accepts them as numbers, and a NaN label or extra spec would be stored and
later compare unequal to itself. The refusal is a 422 naming every field that holds one.
Every router uses `StrictJsonRoute`, so each route checks its body this way first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
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


def _collect(value: Any, path: str, found: list[tuple[str, str]]) -> None:
    if isinstance(value, _NotANumber):
        found.append((path, value.token))
    elif isinstance(value, dict):
        for key, item in value.items():
            _collect(item, f"{path}.{key}" if path else str(key), found)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _collect(item, f"{path}.{index}" if path else str(index), found)


class StrictJsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            body = await request.body()  # kept by the request: the route reads it again
            if body and "json" in request.headers.get("content-type", "application/json"):
                refuse_non_finite(body)
            return await handler(request)

        return strict
