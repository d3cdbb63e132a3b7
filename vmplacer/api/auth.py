"""Bearer tokens: every route but /healthz needs one; read tokens may only read.

The scope follows the HTTP method — GET and HEAD need `read` (an `admin`
token may read too), everything else needs `admin` — so a new route gets the
right check without anyone remembering to add it. The check is one dependency
on the whole application; only the paths in PUBLIC_PATHS skip it.

Verified tokens are cached for a few seconds (keyed by their hash), so a
revoked token stops working within CACHE_TTL_S on every instance.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from vmplacer.ports import TokenInfo, hash_token
from vmplacer.api.errors import ApiError

PUBLIC_PATHS = frozenset({"/healthz"})
# The web view's paths: its routes check the sign-in its cookie carries instead (vmplacer/web/session.py).
WEB_PREFIX = "/ui"
READ_METHODS = frozenset({"GET", "HEAD"})
CACHE_TTL_S = 5.0
MAX_TOKEN_LENGTH = 512

bearer = HTTPBearer(auto_error=False, description="a token from `vmplacer token create NAME --scope read|admin`")


@dataclass(frozen=True)
class Principal:
    name: str
    scope: str
    id: int | None = None  # the token's row id (audit entries name both)

    @property
    def admin(self) -> bool:
        return self.scope == "admin"


class TokenVerifier:
    """Looks tokens up in the database, with a short cache of positive answers."""

    def __init__(self, lookup: Callable[[str], TokenInfo | None], ttl_s: float = CACHE_TTL_S,
                 clock: Callable[[], float] = time.monotonic):
        self._lookup = lookup
        self._ttl = ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._lock = threading.Lock()

    def cached(self, token: str) -> Principal | None:
        """The principal of a token verified less than the TTL ago, else None (ask `verify`):
        no database, so the event loop may ask without handing the request to a thread."""
        if not token or len(token) > MAX_TOKEN_LENGTH:
            return None
        key = hash_token(token)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and self._clock() - hit[0] < self._ttl:
            return hit[1]
        return None

    def verify(self, token: str) -> Principal | None:
        if not token or len(token) > MAX_TOKEN_LENGTH:
            return None
        key = hash_token(token)
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        info = self._lookup(token)
        if info is None:
            with self._lock:
                self._cache.pop(key, None)
            return None
        principal = Principal(info.name, info.scope, info.id)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (now, principal)
        return principal

    def forget_all(self) -> None:
        with self._lock:
            self._cache.clear()


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, None, {"WWW-Authenticate": "Bearer"})


async def authorize(request: Request,
                    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None,
                    ) -> Principal | None:
    """The application-wide dependency: 401 without a valid token, 403 for a read
    token on a method that changes something. It runs on the event loop (a token verified
    lately is a cache hit); only a database look-up is handed to a worker thread."""
    path = request.url.path
    if path in PUBLIC_PATHS or path == WEB_PREFIX or path.startswith(WEB_PREFIX + "/"):
        return None
    verifier: TokenVerifier = request.app.state.services.tokens
    if credentials is None:
        raise _unauthorized("a bearer token is required (Authorization: Bearer <token>)")
    principal = verifier.cached(credentials.credentials)
    if principal is None:
        principal = await run_in_threadpool(verifier.verify, credentials.credentials)
    if principal is None:
        raise _unauthorized("unknown or revoked token")
    if request.method not in READ_METHODS and not principal.admin:
        raise ApiError(403, "forbidden", f"token {principal.name} has scope {principal.scope}; "
                       f"{request.method} needs an admin token")
    request.state.principal = principal
    return principal


def require_principal(request: Request) -> Principal:
    principal = getattr(request.state, "principal", None)
    if principal is None:  # only reachable if a public route asked for one
        raise _unauthorized("a bearer token is required")
    return principal
