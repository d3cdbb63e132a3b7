"""Idempotency-Key on POST: a retried request gets the first answer, not a second action.

The key is scoped to the token that sent it (the token, not its name). The first request with a key
inserts a row (a unique constraint decides races between instances), runs,
and stores its answer *before* sending it, so a retry after a lost response
always finds it. Then:

- same key, same request → the stored answer: status, body and the headers a
  client acts on (Location, Retry-After), with `Idempotent-Replayed: true`;
  "same" is method, path, query and the body as canonical JSON (key order and
  whitespace do not matter);
- same key while the first is still running → waits for its answer (up to
  PENDING_WAIT_S, then 409 with Retry-After), so concurrent duplicates all get
  the one answer;
- same key, different request → 422 naming the Idempotency-Key header;
- an answer of 5xx is not stored: the next retry runs again.

Requests without a valid admin token pass straight through (they get their
401/403 from the route), so nothing is stored on their behalf.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool

from vmplacer.ports import hash_token
from vmplacer.api.auth import TokenVerifier, bearer_token
from vmplacer.api.request_id import current_request_id

HEADER = b"idempotency-key"
KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}$")  # printable ASCII, no spaces
KEY_PATTERN = "^[!-~]{1,255}$"  # KEY_RE for the OpenAPI document (the same characters, spelled printably)
KEY_RULE = "1-255 printable ASCII characters without spaces"
REPLAYED_HEADERS = (b"location", b"retry-after")  # with the body, what a client acts on
PENDING_WAIT_S = 10.0
POLL_S = (0.02, 0.5)  # first and longest pause between looks at a key another instance serves

Message = dict[str, Any]


def _json(status: int, code: str, message: str, field: str | None = None,
          extra_headers: list[tuple[bytes, bytes]] | None = None,
          rule: str | None = None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    details = [{"field": field, "rule": rule or code, "reason": message}] if field else []
    body = json.dumps({"error": {"code": code, "message": message, "details": details,
                                 "request_id": current_request_id()}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return status, headers + (extra_headers or []), body


def token_scope(token: str) -> str:
    """Whose keys these are: the token itself (its stored SHA-256), never its name or row id,
    so a token revoked and created again under the same name never replays the old one's
    answers (SQLite hands a deleted newest row's id to the next row)."""
    return hash_token(token)


def fingerprint(method: str, path: str, query: str, body: bytes) -> str:
    """SHA-256 of the request as the API understands it: query parameters in order of name,
    a JSON body re-serialized with sorted keys and no whitespace (anything else: its bytes)."""
    digest = hashlib.sha256()
    canonical_query = "&".join(f"{k}={v}" for k, v in sorted(parse_qsl(query, keep_blank_values=True)))
    for part in (method, path, canonical_query):
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
    digest.update(canonical_body(body))
    return digest.hexdigest()


def canonical_body(body: bytes) -> bytes:
    try:
        document = json.loads(body)
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    except (ValueError, RecursionError):  # not JSON (the route refuses it), or nested past reason
        return b"bytes\0" + body
    return b"json\0" + text.encode("ascii")


class IdempotencyMiddleware:
    def __init__(self, app: Any, services: Callable[[], Any], pending_wait_s: float = PENDING_WAIT_S):
        self.app = app
        self._services = services
        self._pending_wait_s = pending_wait_s
        # Keys this process is serving now: a duplicate waits on the event instead of polling.
        self._serving: dict[tuple[str, str], asyncio.Event] = {}

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
        services = self._services()
        verifier: TokenVerifier = services.tokens
        token = bearer_token(headers.get(b"authorization", b"").decode("latin-1"))
        principal = await run_in_threadpool(verifier.verify, token) if token else None
        if token is None or principal is None or not principal.admin:
            # the token check answers first (401, 403), as for every other part of the request
            await self.app(scope, receive, send)
            return
        if not KEY_RE.match(key):
            await self._send(send, *_json(422, "validation", f"Idempotency-Key must be {KEY_RULE}",
                                          "Idempotency-Key", rule="string_pattern_mismatch"))
            return

        body = await _read_body(receive)
        replay_receive = _replaying(body)

        store = services.idempotency
        digest = fingerprint(scope["method"], scope["path"], scope.get("query_string", b"").decode("latin-1"), body)
        owner = token_scope(token)
        slot = (owner, key)
        begin = await run_in_threadpool(store.begin, owner, key, digest, scope["method"], scope["path"])
        if begin.outcome == "pending":
            begin = await self._await_first(slot, lambda: store.begin(owner, key, digest, scope["method"],
                                                                      scope["path"]))
        if begin.outcome == "mismatch":
            await self._send(send, *_json(
                422, "idempotency-key-reused",
                "this Idempotency-Key was already used for a different request (method, path, query or body "
                "differ)", "Idempotency-Key"))
            return
        if begin.outcome == "pending":
            await self._send(send, *_json(409, "idempotency-key-in-use",
                                          f"a request with this Idempotency-Key is still being served after "
                                          f"{self._pending_wait_s:g} s; retry later", None,
                                          [(b"retry-after", b"1")]))
            return
        if begin.outcome == "replay":
            payload = (begin.body or "").encode("utf-8")
            await self._send(send, int(begin.status or 200), [
                (b"content-type", (begin.content_type or "application/json").encode("latin-1")),
                (b"content-length", str(len(payload)).encode()),
                *((name.encode("latin-1"), value.encode("latin-1")) for name, value in begin.headers),
                (b"idempotent-replayed", b"true"),
            ], payload)
            return

        done = self._serving.setdefault(slot, asyncio.Event())
        try:
            await self._serve_first(scope, replay_receive, send, store, begin.row_id)
        finally:
            if self._serving.get(slot) is done:
                del self._serving[slot]
            done.set()

    async def _await_first(self, slot: tuple[str, str], look: Callable[[], Any]) -> Any:
        """Wait until the first request with this key has an answer (or was abandoned), then
        look again; still pending after the wait: the last look, "pending"."""
        deadline = time.monotonic() + self._pending_wait_s
        pause = POLL_S[0]
        while True:
            remaining = deadline - time.monotonic()
            serving = self._serving.get(slot)
            if serving is not None:
                try:
                    await asyncio.wait_for(serving.wait(), max(0.0, min(remaining, 1.0)))
                except TimeoutError:
                    pass
            else:  # another instance serves it: look now and then
                await asyncio.sleep(max(0.0, min(pause, remaining)))
                pause = min(pause * 2, POLL_S[1])
            begin = await run_in_threadpool(look)
            if begin.outcome != "pending" or time.monotonic() >= deadline:
                return begin

    async def _serve_first(self, scope: dict[str, Any], receive: Any, send: Any, store: Any, row_id: int) -> None:
        """First time: run it, keep the answer, store it (with the headers a retry needs), then send it."""
        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            await self.app(scope, receive, capture)
        except BaseException:
            await run_in_threadpool(store.abandon, row_id)
            raise
        if start is None:
            await run_in_threadpool(store.abandon, row_id)
            return
        status = int(start["status"])
        payload = b"".join(chunks)
        response_headers = list(start.get("headers", []))
        content_type = next((v.decode("latin-1") for k, v in response_headers if k.lower() == b"content-type"),
                            "application/json")
        kept = [(k.lower().decode("latin-1"), v.decode("latin-1")) for k, v in response_headers
                if k.lower() in REPLAYED_HEADERS]
        if status >= 500:
            await run_in_threadpool(store.abandon, row_id)
        else:
            await run_in_threadpool(store.finish, row_id, status, content_type,
                                    payload.decode("utf-8", errors="replace"), kept)
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
