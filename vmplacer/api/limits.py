"""Request body size limit (api.max_request_bytes → 413), before anything reads the body.

A declared Content-Length over the limit is refused at once; a chunked body is
counted as it arrives and refused as soon as it passes the limit, so a client
cannot make the server buffer more than the limit.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException

from vmplacer.api.request_id import current_request_id

Scope = dict[str, Any]
Message = dict[str, Any]


class BodyTooLarge(HTTPException):
    """An HTTPException, so the framework's body reader passes it through; the error
    handlers answer it with `too_large_body`, the same body as a refused Content-Length."""

    def __init__(self, limit: int):
        super().__init__(413, too_large_message(limit))
        self.limit = limit


def too_large_message(limit: int) -> str:
    return f"request body larger than {limit} bytes (api.max_request_bytes)"


def too_large_body(limit: int, request_id: str) -> dict[str, Any]:
    """The one 413 body, whether the size was declared or counted while streaming (the error
    shape of vmplacer.api.errors, built here without it: that module imports this one)."""
    message = too_large_message(limit)
    return {"error": {"code": "too-large", "message": message, "request_id": request_id,
                      "details": [{"field": "body", "rule": "too-large", "reason": message, "limit": limit}]}}


class BodySizeLimit:
    def __init__(self, app: Any, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._refuse(send, 400, "invalid Content-Length")
                    return
                if declared > self.max_bytes:
                    await self._refuse(send)
                    return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Any, status: int = 413, message: str | None = None) -> None:
        request_id = current_request_id()
        content = too_large_body(self.max_bytes, request_id) if message is None else {
            "error": {"code": "bad-request", "message": message, "request_id": request_id,
                      "details": [{"field": "Content-Length", "rule": "bad-request", "reason": message}]}}
        body = json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode()  # as JSONResponse
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
