"""`X-Request-Id` on every response, and in every error body as `request_id`.

A caller's own id is echoed when it is safe to repeat in a header and a log line
(1-128 characters of `A-Z a-z 0-9 . _ : -`); anything else, or none, gets a fresh one.
One id then names the request in the caller's logs, in ours and in the error it got.
The id lives in a context variable for the request's duration, so an error built
anywhere below (a handler, a middleware, a worker thread) can carry it.
"""

from __future__ import annotations

import re
import uuid
from contextvars import ContextVar
from typing import Any

HEADER = b"x-request-id"
ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
ID_PATTERN = ID_RE.pattern

_current: ContextVar[str | None] = ContextVar("vmplacer_request_id", default=None)


def current_request_id() -> str:
    """The id of the request being served; outside a request, a fresh one (never empty)."""
    return _current.get() or new_request_id()


def new_request_id() -> str:
    return uuid.uuid4().hex


def chosen_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The caller's id when it is valid, else a new one."""
    for name, value in headers:
        if name.lower() == HEADER:
            text = value.decode("latin-1")
            if ID_RE.match(text):
                return text
            break
    return new_request_id()


class RequestIdMiddleware:
    """Pure ASGI, outermost: every answer, the framework's and the middlewares' own, gets the header."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = chosen_id(list(scope.get("headers", ())))
        token = _current.set(request_id)

        async def tagging_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, request_id.encode("ascii"))]}
            await send(message)

        try:
            await self.app(scope, receive, tagging_send)
        finally:
            _current.reset(token)
