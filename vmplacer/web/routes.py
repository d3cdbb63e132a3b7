"""The web view's routes: login and logout (the only POSTs), the fleet, host, guest, plan,
model and guest-search pages, and the JSON those pages poll. Mounted by `api.app.create_app`
through `mount`. Every page only reads: a sign-in has the read scope whichever token began it."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, TYPE_CHECKING
from urllib.parse import quote, urlencode

import jinja2
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles

from vmplacer import __version__
from vmplacer.api.auth import MAX_TOKEN_LENGTH, Principal
from vmplacer.api.schemas import HOST_NAME
from vmplacer.api.times import api_time
from vmplacer.ports import HypervisorError
from vmplacer.web import glossary, return_to, search, session
from vmplacer.web.guard import SignInLimiter, client_address, cross_site, limit_key, trusted_networks
from vmplacer.web.query import FIELDS, SORT_KEYS, STATES, FleetQuery, QueryError, select
from vmplacer.web.security import PREFIX
from vmplacer.web.views import WebViews

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices

HERE = Path(__file__).resolve().parent
REFRESH_S = 10
GUEST_NAME_LENGTH = 255  # the longest name a placement record holds (its column's length)
HOST_NAME_RE = re.compile(HOST_NAME)
COLUMNS = (("name", "Host"), ("state", "State"), ("guests", "Guests"), ("free_cores", "Free whole cores"),
           ("free_memory", "Free memory"), ("violations", "Isolation"))

templates = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "templates")), autoescape=True,
                               undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
router = APIRouter(prefix=PREFIX, include_in_schema=False)


def guest_url(host: str, guest: str) -> str:
    """A guest page's address; the guest's name is caller input, so every byte is escaped."""
    return f"{PREFIX}/hosts/{quote(host, safe='')}/guests/{quote(guest, safe='')}"


def host_url(host: str) -> str:
    """A host page's address (a plan may name a host no longer configured: its page says so)."""
    return f"{PREFIX}/hosts/{quote(host, safe='')}"


def guest_link(guest: str) -> str:
    """A guest's address wherever it runs now (a plan may have moved it since)."""
    return f"{PREFIX}/guests/{quote(guest, safe='')}"


def utc_time(moment: float) -> str:
    """A moment's time of day in UTC, as the page's live refresh spells it."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(moment))


templates.globals["guest_url"] = guest_url
templates.filters["utc_time"] = utc_time
templates.globals["guest_link"] = guest_link
templates.globals["host_url"] = host_url
templates.globals.update(glossary.GLOBALS)
Signed = Depends(session.principal)


def mount(app: FastAPI, services: ApiServices) -> None:
    """The web view under /ui/: its routes, its static files and its sign-in handling."""
    app.state.web = WebViews(services)
    app.state.web_sign_ins = SignInLimiter()
    app.state.web_trusted_proxies = trusted_networks(services.settings.api.trusted_proxies)
    app.state.web_sessions = _session_store(services)
    app.include_router(router)
    app.mount(PREFIX + "/static", StaticFiles(directory=str(HERE / "static")), name="ui-static")
    app.add_exception_handler(session.SignInRequired, _sign_in)  # type: ignore[arg-type]
    app.add_exception_handler(QueryError, _bad_query)  # type: ignore[arg-type]
    api_http = app.exception_handlers.get(StarletteHTTPException)

    async def not_found(request: Request, exc: StarletteHTTPException) -> Response:
        """An unknown page under /ui answers a page, not the API's JSON (its JSON under /ui/api stays JSON)."""
        path = request.url.path
        if exc.status_code == 404 and (path == PREFIX or path.startswith(PREFIX + "/")) \
                and not path.startswith(PREFIX + "/api/"):
            return _page("error.html", request, 404, title="Not found", message="no such page in the web view")
        if api_http is None:
            return JSONResponse({"error": {"code": "http", "message": str(exc.detail)}}, status_code=exc.status_code)
        return await api_http(request, exc)

    app.add_exception_handler(StarletteHTTPException, not_found)  # type: ignore[arg-type]


def _session_store(services: ApiServices) -> session.SessionStore:
    """The sign-ins' store on the server's database, for the configured lifetime and idle time."""
    return services.container.web_session_store


def _page(name: str, request: Request, status: int = 200, **values: Any) -> HTMLResponse:
    values.setdefault("search_q", "")
    html = templates.get_template(name).render(prefix=PREFIX, version=__version__, refresh_s=REFRESH_S,
                                               principal=session.signed_in_as(request),
                                               rendered_at=round(time.time(), 3), max_search=search.MAX_QUERY,
                                               **values)
    return HTMLResponse(html, status_code=status)


def _sign_in(request: Request, exc: session.SignInRequired) -> Response:
    response: Response
    if exc.json:
        response = JSONResponse({"error": {"code": "unauthorized", "message": "sign in again",
                                           "details": {"login": session.LOGIN}}}, status_code=401)
    else:  # back to the page asked for once signed in (only a page of this view: web/return_to.py)
        requested = _as_sent(request)
        response = RedirectResponse(return_to.login_address(requested), status_code=303)
    if exc.had_cookie:
        session.forget(response, request)
    return response


def _as_sent(request: Request) -> str:
    """The path and query the browser asked for, percent-encoded as it sent them (a guest's
    name in the path stays encoded, so the address works again as it is)."""
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if isinstance(raw, bytes) else quote(request.url.path)
    return path + (f"?{request.url.query}" if request.url.query else "")


def _bad_query(request: Request, exc: QueryError) -> Response:
    if request.url.path.startswith(PREFIX + "/api/"):
        return JSONResponse({"error": {"code": "validation", "message": str(exc),
                                       "details": [{"field": exc.field, "reason": exc.rule}]}}, status_code=422)
    return _page("error.html", request, 422, title="Bad request", message=str(exc))


# ----- signing in and out -------------------------------------------------------------------------
@router.get("", include_in_schema=False)
def root() -> RedirectResponse:
    return RedirectResponse(PREFIX + "/", status_code=308)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> HTMLResponse:
    """The sign-in form; a `next` that is a page of this view rides along in it (any other is
    dropped here, and checked again when the form comes back)."""
    return _page("login.html", request, message="", next=return_to.safe_next(request.query_params.get("next")))


def _client(request: Request) -> str:
    """Whom failed sign-ins count against: the connection's peer, or the client a trusted
    proxy names (vmplacer/web/guard.py)."""
    peer = request.client.host if request.client else "unknown"
    return limit_key(client_address(peer, request.headers.getlist("x-forwarded-for"),
                                    request.app.state.web_trusted_proxies))


def _begin(request: Request, token: str, previous: str) -> str | None:
    """A new sign-in for a valid token (its id for the cookie), else None. The token is looked
    up in the database, not the API's short cache: one revoked a moment ago signs nobody in.
    A sign-in the browser still carried ends: each sign-in gets an id of its own."""
    if len(token) > MAX_TOKEN_LENGTH:
        return None
    info = request.app.state.services.token_store.verify(token)
    if info is None or info.id is None:
        return None
    sign_ins = session.store(request)
    if previous:
        sign_ins.end(previous)
    return sign_ins.start(info.name, info.id, info.scope)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    why = cross_site(request)
    if why:
        return _page("error.html", request, 403, title="Refused", message=f"sign-in refused: {why}")
    limiter: SignInLimiter = request.app.state.web_sign_ins
    client = _client(request)
    wait = limiter.retry_after(client)
    response: Response
    if wait:
        _, wanted = await session.submitted_form(request)
        response = _page("login.html", request, 429, next=return_to.safe_next(wanted),
                         message=f"too many failed sign-ins from this address: try again in {wait} s")
        response.headers["Retry-After"] = str(wait)
        return response
    token, wanted = await session.submitted_form(request)
    wanted = return_to.safe_next(wanted)
    secret = await run_in_threadpool(_begin, request, token, request.cookies.get(session.COOKIE, "")) \
        if token else None
    if secret is None:
        limiter.failed(client)
        message = "unknown or revoked token" if token else "a token is required"
        return _page("login.html", request, 401, message=message, next=wanted)
    response = RedirectResponse(return_to.after_sign_in(wanted), status_code=303)
    session.keep(response, request, secret)
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    """Ends the sign-in on the server (its row is deleted), then clears the cookie."""
    why = cross_site(request)
    if why:
        return _page("error.html", request, 403, title="Refused", message=f"sign-out refused: {why}")
    secret = request.cookies.get(session.COOKIE, "")
    if secret:
        session.store(request).end(secret)
    response = RedirectResponse(session.LOGIN, status_code=303)
    session.forget(response, request)
    return response


# ----- the fleet -----------------------------------------------------------------------------------
def _fleet(request: Request, *, page: bool = False) -> tuple[FleetQuery, Any]:
    """The fleet's rows for the query string. A page ignores parameters it does not know
    (a link that picked up a tracking tag still opens); the JSON refuses them."""
    items = request.query_params.multi_items()
    query = FleetQuery.parse([(k, v) for k, v in items if k in FIELDS] if page else items)
    return query, select(request.app.state.web.fleet_rows(), query)


@router.get("/", response_class=HTMLResponse)
def fleet_page(request: Request, principal: Principal = Signed) -> HTMLResponse:
    query, page = _fleet(request, page=True)
    return _page("fleet.html", request, query=query, page=page, columns=COLUMNS, states=STATES,
                 sort_keys=SORT_KEYS, link=lambda **changes: _link(query, **changes),
                 refresh_url=f"{PREFIX}/api/fleet?{urlencode(query.params())}")


@router.get("/api/fleet")
def fleet_json(request: Request, principal: Principal = Signed) -> dict[str, Any]:
    _, page = _fleet(request)
    return {"rows": page.rows, "total": page.total, "fleet": page.fleet, "page": page.page, "pages": page.pages,
            "at": time.time()}


def _link(query: FleetQuery, **changes: Any) -> str:
    params = query.params(**changes)
    return f"{PREFIX}/" + (f"?{urlencode(params)}" if params else "")


# ----- finding a guest -----------------------------------------------------------------------------
@router.get("/search", response_class=HTMLResponse)
def search_page(request: Request, principal: Principal = Signed) -> HTMLResponse:
    """Guests whose name holds `q` (any case), on every configured host. A GET form, so it
    works without script; a missing, empty or over-long `q` answers this page saying why."""
    values = request.query_params.getlist("q")
    problem = search.query_problem(values)
    shown_q = "".join(ch for ch in values[0][:search.MAX_QUERY] if ch.isprintable()) if len(values) == 1 else ""
    if problem:
        return _page("search.html", request, problem=problem, found=None, query="", search_q=shown_q)
    query = values[0].strip()
    found = search.find(request.app.state.web.placed_guests(), query, search.SHOWN)
    return _page("search.html", request, problem="", found=found, query=query, search_q=query)


# ----- plans -----------------------------------------------------------------------------------------
@router.get("/plans", response_class=HTMLResponse)
def plans_page(request: Request, principal: Principal = Signed) -> HTMLResponse:
    return _page("plans.html", request, plans=request.app.state.web.plans(), when=_when)


@router.get("/plans/{plan_id}", response_class=HTMLResponse)
def plan_page(request: Request, plan_id: str, principal: Principal = Signed) -> HTMLResponse:
    if not plan_id.isascii() or not plan_id.isdigit() or len(plan_id) > 10 or not 1 <= int(plan_id) < 2**31:
        return _page("error.html", request, 422, title="Bad request",
                     message="field plan_id: a whole number from 1 to 2147483647")
    plan = request.app.state.web.plan(int(plan_id))
    if plan is None:
        return _page("error.html", request, 404, title="Unknown plan", message=f"plan {int(plan_id)} does not exist")
    return _page("plan.html", request, plan=plan, when=_when)


def _when(moment: float | str | None) -> str:
    """A moment as ISO 8601 UTC, as the CLI and the API print them (the API's views already
    spell it so)."""
    if moment is None:
        return "—"
    return api_time(moment) or "—"


# ----- one host ------------------------------------------------------------------------------------
def _known(request: Request, name: str) -> None:
    services = request.app.state.services
    if not HOST_NAME_RE.match(name) or name not in services.host_names:
        raise _NotConfigured(name)


class _NotConfigured(Exception):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


@router.get("/hosts/{name}", response_class=HTMLResponse)
def host_page(request: Request, name: str, principal: Principal = Signed) -> HTMLResponse:
    try:
        _known(request, name)
    except _NotConfigured:
        return _page("error.html", request, 404, title="Unknown host",
                     message=f"host {name[:63]!r} is not configured")
    try:
        host = request.app.state.web.host(name)
    except HypervisorError as exc:
        return _page("error.html", request, 503, title=f"Host {name} unreadable", message=str(exc))
    return _page("host.html", request, host=host, refresh_url=f"{PREFIX}/api/hosts/{name}")


@router.get("/api/hosts/{name}")
def host_json(request: Request, name: str, principal: Principal = Signed) -> Response:
    try:
        _known(request, name)
        host = request.app.state.web.host(name)
    except _NotConfigured:
        return JSONResponse({"error": {"code": "not-found", "message": f"host {name[:63]!r} is not configured",
                                       "details": {"host": name[:63]}}}, status_code=404)
    except HypervisorError as exc:
        return JSONResponse({"error": {"code": "host-unreadable", "message": str(exc), "details": {"host": name}}},
                            status_code=503)
    return JSONResponse({"cpus": host["cpus"], "guests": host["guests"], "state": host["state"],
                         "violations": host["violations"], "violation_list": host["violation_list"],
                         "checked": host["checked"], "memory": host["memory"], "at": time.time()})


# ----- one guest -----------------------------------------------------------------------------------
def _guest_name_problem(name: str) -> str:
    """The guest segment of a guest page's address: any recorded name (an adopted domain keeps
    its libvirt name), but no longer than a record's and no control characters."""
    if not 1 <= len(name) <= GUEST_NAME_LENGTH:
        return f"field guest: 1 to {GUEST_NAME_LENGTH} characters"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "field guest: no control characters"
    return ""


@router.get("/hosts/{name}/guests/{guest}", response_class=HTMLResponse)
def guest_page(request: Request, name: str, guest: str, principal: Principal = Signed) -> HTMLResponse:
    try:
        _known(request, name)
    except _NotConfigured:
        return _page("error.html", request, 404, title="Unknown host",
                     message=f"host {name[:63]!r} is not configured")
    problem = _guest_name_problem(guest)
    if problem:
        return _page("error.html", request, 422, title="Bad request", message=problem)
    try:
        data = request.app.state.web.guest(name, guest)
    except HypervisorError as exc:
        return _page("error.html", request, 503, title=f"Host {name} unreadable", message=str(exc))
    if data is None:
        return _page("error.html", request, 404, title="Unknown guest",
                     message=f"host {name} records no guest {guest!r}")
    return _page("guest.html", request, guest=data, when=_when)


@router.get("/guests/{guest}")
def guest_where_it_runs(request: Request, guest: str, principal: Principal = Signed) -> Response:
    """The guest's page on the host its record names now."""
    problem = _guest_name_problem(guest)
    if problem:
        return _page("error.html", request, 422, title="Bad request", message=problem)
    record = request.app.state.services.container.placement_store.get(guest)
    if record is None or record["host"] not in request.app.state.services.host_names:
        return _page("error.html", request, 404, title="Unknown guest", message=f"no guest {guest!r} is recorded")
    return RedirectResponse(guest_url(record["host"], guest), status_code=303)


# ----- the model -----------------------------------------------------------------------------------
@router.get("/model", response_class=HTMLResponse)
def model_page(request: Request, principal: Principal = Signed) -> HTMLResponse:
    return _page("model.html", request, model=request.app.state.web.model_tables(), when=_when)
