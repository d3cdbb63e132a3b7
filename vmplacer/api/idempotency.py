"""Idempotency-Key on POST: a retried request gets the first answer, not a second action.

The key is scoped to the token that sent it. The first request with a key
inserts a row (a unique constraint decides races between instances), runs,
and stores its answer *before* sending it, so a retry after a lost response
always finds it. Then:

- same key, same method/path/body → the stored answer, with `Idempotent-Replayed: true`;
- same key, different request → 422 naming the Idempotency-Key header;
- same key while the first is still running → 409, retry later;
- an answer of 5xx is not stored: the next retry runs again.

Requests without a valid admin token pass straight through (they get their
401/403 from the route), so nothing is stored on their behalf.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from vmplacer.api.auth import TokenVerifier, bearer_token

HEADER = b"idempotency-key"
KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}$")  # printable ASCII, no spaces

Message = dict[str, Any]


def _json(status: int, code: str, message: str, field: str | None = None,
          extra_headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    details = [{"field": field, "reason": message}] if field else None
    body = json.dumps({"error": {"code": code, "message": message, "details": details}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return status, headers + (extra_headers or []), body


class IdempotencyMiddleware:
    def __init__(self, app: Any, services: Callable[[], Any]):
        self.app = app
        self._services = services

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        raw_key = headers.get(HEADER)
        if raw_key is None:
            await self.app(scope, receive, send)
            return
        key = raw_key.decode("latin-1")
        if not KEY_RE.match(key):
            await self._send(send, *_json(422, "validation", "Idempotency-Key must be 1-255 printable ASCII "
                                          "characters without spaces", "Idempotency-Key"))
            return

        body = await _read_body(receive)
        replay_receive = _replaying(body)
        services = self._services()
        verifier: TokenVerifier = services.tokens
        token = bearer_token(headers.get(b"authorization", b"").decode("latin-1"))
        principal = await run_in_threadpool(verifier.verify, token) if token else None
        if principal is None or not principal.admin:
            await self.app(scope, replay_receive, send)
            return

        digest = hashlib.sha256()
        for part in (scope["method"], scope["path"], scope.get("query_string", b"").decode("latin-1")):
            digest.update(part.encode("utf-8") + b"\0")
        digest.update(body)
        store = services.idempotency
        begin = await run_in_threadpool(store.begin, principal.name, key, digest.hexdigest(),
                                        scope["method"], scope["path"])
        if begin.outcome == "mismatch":
            await self._send(send, *_json(
                422, "idempotency-key-reused",
                "this Idempotency-Key was already used for a different request (method, path or body differ)",
                "Idempotency-Key"))
            return
        if begin.outcome == "pending":
            await self._send(send, *_json(409, "idempotency-key-in-use",
                                          "a request with this Idempotency-Key is still being served; retry later",
                                          None, [(b"retry-after", b"1")]))
            return
        if begin.outcome == "replay":
            payload = (begin.body or "").encode("utf-8")
            await self._send(send, int(begin.status or 200), [
                (b"content-type", (begin.content_type or "application/json").encode("latin-1")),
                (b"content-length", str(len(payload)).encode()),
                (b"idempotent-replayed", b"true"),
            ], payload)
            return

        # First time: run it, keep the answer, store it, then send it.
        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            await self.app(scope, replay_receive, capture)
        except BaseException:
            await run_in_threadpool(store.abandon, begin.row_id)
            raise
        if start is None:
            await run_in_threadpool(store.abandon, begin.row_id)
            return
        status = int(start["status"])
        payload = b"".join(chunks)
        response_headers = list(start.get("headers", []))
        content_type = next((v.decode("latin-1") for k, v in response_headers if k.lower() == b"content-type"),
                            "application/json")
        if status >= 500:
            await run_in_threadpool(store.abandon, begin.row_id)
        else:
            await run_in_threadpool(store.finish, begin.row_id, status, content_type,
                                    payload.decode("utf-8", errors="replace"))
        await send(start)
        await send({"type": "http.response.body", "body": payload})

    @staticmethod
    async def _send(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Any) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


def _replaying(body: bytes) -> Callable[[], Any]:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return receive
