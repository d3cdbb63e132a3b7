"""Headers every /ui response carries: a strict Content-Security-Policy (no inline script or
style, nothing from another origin), no MIME sniffing, no referrer to other sites, no framing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.datastructures import MutableHeaders

from vmplacer.api.auth import WEB_PREFIX as PREFIX
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # a referrer for this site's own forms (their CSRF check), none to others
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}
STATIC = PREFIX + "/static/"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


def under_web(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class SecurityHeaders:
    """Pure ASGI: adds HEADERS to every response under /ui (errors and static files too); pages
    and their JSON are never cached (they show the fleet as one token may see it)."""

    def __init__(self, app: Callable[..., Awaitable[None]]):
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http" or not under_web(scope["path"]):
            await self.app(scope, receive, send)
            return
        static = scope["path"].startswith(STATIC)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
                if not static:
                    headers["Cache-Control"] = "no-store"
            await send(message)

        await self.app(scope, receive, sending)
