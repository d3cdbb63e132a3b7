"""Signing in to the web view: the API token is checked once, as the API's bearer check does,
and a sign-in kept on the server stands for it. The cookie carries only that sign-in's random
id (HttpOnly, SameSite=Strict, scoped to /ui, Secure over TLS) — never the token, and never in a
URL, so never in an access log line or a referrer. The server keeps the id's hash with the
token's owner and scope; sign-out, the end of its lifetime, idleness or the token's revocation
end it there, so a copied cookie stops working with it.

Whichever token signs in, the view's principal has the read scope: the view only reads."""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import parse_qsl

from fastapi import Request
from starlette.responses import Response

from vmplacer.api.auth import MAX_TOKEN_LENGTH, Principal
from vmplacer.web.return_to import MAX_NEXT
from vmplacer.web.security import PREFIX

COOKIE = "vmplacer_ui"
LOGIN = PREFIX + "/login"


class SignedIn(Protocol):
    """A live sign-in: the token's owner and id, and what the view lets it do."""

    @property
    def actor(self) -> str: ...

    @property
    def token_id(self) -> int: ...

    @property
    def scope(self) -> str: ...


class SessionStore(Protocol):
    """What the view needs of the sign-ins' store (vmplacer/adapters/db/web_sessions.py)."""

    def start(self, actor: str, token_id: int, token_scope: str) -> str | None: ...

    def find(self, secret: str) -> SignedIn | None: ...

    def end(self, secret: str) -> bool: ...


class SignInRequired(Exception):
    """No cookie, or one whose sign-in is unknown, ended or its token revoked: pages send the
    browser to the login page, the JSON the pages poll answers 401."""

    def __init__(self, json: bool, had_cookie: bool):
        super().__init__("sign in with an API token")
        self.json = json
        self.had_cookie = had_cookie


def store(request: Request) -> SessionStore:
    return request.app.state.web_sessions  # type: ignore[no-any-return]


def principal(request: Request) -> Principal:
    """The signed-in principal, with the sign-in's scope (read), not the token's. A sync
    dependency: FastAPI runs it on a worker thread, as the look-up reads the database."""
    secret = request.cookies.get(COOKIE, "")
    found = store(request).find(secret) if secret else None
    if found is None:
        raise SignInRequired(json=request.url.path.startswith(PREFIX + "/api/"), had_cookie=bool(secret))
    signed = Principal(found.actor, found.scope, found.token_id)
    request.state.principal = signed
    return signed


MAX_NEXT_FIELD = MAX_NEXT * 3  # the `next` field, form-encoded (each % of the path spelt %25)


async def submitted_form(request: Request) -> tuple[str, str]:
    """The login form's `token` and `next` fields (application/x-www-form-urlencoded); "" for
    one absent. The body is read only as far as the two can reach."""
    body = (await request.body())[: MAX_TOKEN_LENGTH * 4 + MAX_NEXT_FIELD + 16]
    try:
        fields = parse_qsl(body.decode("ascii"), max_num_fields=4, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        return "", ""
    token = next((value.strip() for name, value in fields if name == "token"), "")
    return token, next((value for name, value in fields if name == "next"), "")


def keep(response: Response, request: Request, secret: str) -> None:
    """A cookie for the browser's session only (no Max-Age): the server ends the sign-in anyway."""
    response.set_cookie(COOKIE, secret, path=PREFIX, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")


def forget(response: Response, request: Request) -> None:
    response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")


def signed_in_as(request: Request) -> Any:
    return getattr(request.state, "principal", None)
