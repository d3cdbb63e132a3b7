"""Where a sign-in returns to: the page that asked for it, carried through the login page as
`next`. The value is caller input (anyone can craft a login link), so only a path of this
view's own pages is followed; anything else is ignored and the fleet is used — the sign-in
never becomes a redirect to another site."""

from __future__ import annotations

import re
from urllib.parse import urlencode, urlsplit

from vmplacer.web.security import PREFIX

FLEET = PREFIX + "/"
MAX_NEXT = 4096  # a guest page's address fits with the longest recorded name, every byte percent-encoded
ENCODED_SEPARATOR = re.compile(r"%(2f|5c|2e)", re.IGNORECASE)  # an encoded slash, backslash or dot
NOT_PAGES = (PREFIX + "/api/", PREFIX + "/static/", PREFIX + "/login", PREFIX + "/logout")


def next_problem(path: str) -> str:
    """Why `path` is not a page of this view to return to ("" when it is): printable ASCII (a
    browser sends a path percent-encoded), at most MAX_NEXT characters, starting with /ui/, no
    `//` (a scheme-relative address names another host), no backslash (browsers read it as
    `/`), no `.` or `..` segment and none of / \\ . percent-encoded in the path, no scheme or host, and
    not the JSON, static files or the sign-in itself."""
    if not 1 <= len(path) <= MAX_NEXT:
        return f"1 to {MAX_NEXT} characters"
    if not path.isascii() or not path.isprintable():
        return "printable ASCII only (percent-encode the rest)"
    if not path.startswith(FLEET):
        return f"a path starting with {FLEET}"
    if "//" in path or "\\" in path:
        return "no // and no backslash"
    parts = urlsplit(path)
    if ENCODED_SEPARATOR.search(parts.path):
        return "no percent-encoded /, \\ or . in the path"
    if parts.scheme or parts.netloc or parts.fragment:
        return "a path and query only (no scheme, host or fragment)"
    if any(segment in (".", "..") for segment in parts.path.split("/")):
        return "no . or .. segment"
    if parts.path.startswith(NOT_PAGES) or parts.path in (PREFIX + "/login", PREFIX + "/logout"):
        return "a page of the view (not its JSON, static files or sign-in)"
    return ""


def safe_next(path: str | None) -> str:
    """`path` when it is a page to return to, else "" (the fleet)."""
    return path if path and not next_problem(path) else ""


def login_address(requested: str) -> str:
    """The login page's address for a browser that asked for `requested` (path and query):
    with `next` when it is a page worth returning to other than the fleet itself."""
    target = safe_next(requested)
    if not target or target == FLEET:
        return PREFIX + "/login"
    return f"{PREFIX}/login?{urlencode({'next': target})}"


def after_sign_in(submitted: str) -> str:
    """Where a successful sign-in sends the browser: the submitted `next` when it is a page of
    this view, else the fleet."""
    return safe_next(submitted) or FLEET
