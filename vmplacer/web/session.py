"""Signing in to the web view: the API token, checked as the API's bearer check does, kept in
an HttpOnly, SameSite=Strict cookie scoped to /ui (Secure over TLS) — never in a URL, so
never in an access log line or a referrer."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request
from starlette.responses import Response

from vmplacer.api.auth import MAX_TOKEN_LENGTH, Principal
from vmplacer.web.security import PREFIX

COOKIE = "vmplacer_ui"
LOGIN = PREFIX + "/login"


class SignInRequired(Exception):
    """No cookie, or one whose token is unknown or revoked: pages send the browser to the
    login page, the JSON the pages poll answers 401."""

    def __init__(self, json: bool, had_cookie: bool):
        super().__init__("sign in with an API token")
        self.json = json
        self.had_cookie = had_cookie


def principal(request: Request) -> Principal:
    """The signed-in token's principal (a read scope is enough: the view only reads)."""
    token = request.cookies.get(COOKIE, "")
    found = request.app.state.services.tokens.verify(token) if token else None
    if found is None:
        raise SignInRequired(json=request.url.path.startswith(PREFIX + "/api/"), had_cookie=bool(token))
    request.state.principal = found
    return found


async def submitted_token(request: Request) -> str:
    """The `token` field of the login form (application/x-www-form-urlencoded); "" when absent."""
    body = (await request.body())[: MAX_TOKEN_LENGTH * 4]
    try:
        fields = parse_qsl(body.decode("ascii"), max_num_fields=4, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        return ""
    return next((value.strip() for name, value in fields if name == "token"), "")


def keep(response: Response, request: Request, token: str) -> None:
    response.set_cookie(COOKIE, token, path=PREFIX, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")


def forget(response: Response, request: Request) -> None:
    response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")


def signed_in_as(request: Request) -> Any:
    return getattr(request.state, "principal", None)
