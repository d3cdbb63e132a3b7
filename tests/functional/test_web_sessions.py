"""Signing in to the web view is kept on the server: `vmplacer serve` over real HTTP and real
SQLite (the cookie carries a random id, never the token; sign-out, idleness, the end of the
lifetime and revocation end it there; every sign-in reads only), the store itself on SQLite and
PostgreSQL with a clock of the test's own, and the limit on failed sign-ins counted by the
connection's peer unless a trusted proxy names the client."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import select, update

from tests.functional.test_api_helpers import Server, make_container, vmplacer, write_config
from vmplacer.adapters.db.api import SqlTokenStore
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.models import WebSessionRow
from vmplacer.adapters.db.web_sessions import SqlWebSessionStore, id_hash
from vmplacer.web.guard import SIGN_IN_FAILURES

HOSTS = [{"name": "t", "uri": "test:///default", "domain_type": "qemu"}]
PROXY = "127.0.0.2"  # the trusted reverse proxy of the module's server
STRANGER = "127.0.0.3"  # a peer on loopback no setting trusts


def _server(directory: Path, instance: str, **sections: dict[str, Any]) -> Server:
    config = write_config(directory, f"sqlite:///{directory / 'vmplacer.db'}", HOSTS)
    document = yaml.safe_load(config.read_text())
    document.update(sections)
    config.write_text(yaml.safe_dump(document))
    return Server(config, directory, instance=instance).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    instance = _server(tmp_path_factory.mktemp("web-sign-in"), "web-sign-in",
                       api={"trusted_proxies": [f"{PROXY}/32"]})
    try:
        yield instance
    finally:
        instance.stop()


def _browser(server: Server, source: str = "127.0.0.5") -> httpx.Client:
    """A client that sends what a browser sends on the view's forms (its page's Origin), from
    the local address `source` (every 127.x address is this machine's loopback)."""
    return httpx.Client(base_url=server.url, follow_redirects=False, timeout=30.0, headers={"Origin": server.url},
                        transport=httpx.HTTPTransport(local_address=source))


def _sign_in(client: httpx.Client, token: str, **headers: str) -> httpx.Response:
    return client.post("/ui/login", data={"token": token}, headers=headers)


def _rows(server: Server) -> list[WebSessionRow]:
    engine = make_engine(yaml.safe_load(server.config.read_text())["database_url"])
    try:
        with make_session_factory(engine)() as db:
            return list(db.scalars(select(WebSessionRow)))
    finally:
        engine.dispose()


def _signed_out(answer: httpx.Response) -> bool:
    return answer.status_code == 303 and answer.headers["location"] == "/ui/login"


# ----- the cookie, sign-out, scope, revocation: the real server ------------------------------------
def test_the_cookie_carries_a_random_id_and_the_database_only_its_hash(server):
    with _browser(server) as browser:
        answer = _sign_in(browser, server.read)
        assert answer.status_code == 303, answer.text
        cookie = answer.headers["set-cookie"]
        secret = browser.cookies["vmplacer_ui"]
        assert server.read not in cookie and secret != server.read and len(secret) == 43
        for attribute in ("HttpOnly", "Path=/ui", "SameSite=strict"):
            assert attribute.lower() in cookie.lower(), cookie
        assert "max-age" not in cookie.lower() and "expires" not in cookie.lower()  # gone with the browser
        assert browser.get("/ui/").status_code == 200
    rows = {row.id_hash: row for row in _rows(server)}
    assert id_hash(secret) in rows and secret not in rows
    row = rows[id_hash(secret)]
    assert (row.actor, row.token_scope, row.scope) == (f"read-{server.instance}", "read", "read")
    stored = [str(value) for r in rows.values() for value in vars(r).values()]
    assert not any(server.read in value or secret in value for value in stored)


def test_signing_out_ends_the_sign_in_on_the_server(server):
    with _browser(server) as browser:
        assert _sign_in(browser, server.read).status_code == 303
        kept = browser.cookies["vmplacer_ui"]
        assert browser.get("/ui/api/fleet").status_code == 200
        out = browser.post("/ui/logout")
        assert _signed_out(out) and 'vmplacer_ui=""' in out.headers["set-cookie"]
    assert id_hash(kept) not in {row.id_hash for row in _rows(server)}
    with _browser(server) as thief:  # the cookie copied before sign-out is worth nothing now
        thief.cookies.set("vmplacer_ui", kept, path="/ui")
        assert _signed_out(thief.get("/ui/"))
        assert thief.get("/ui/api/fleet").status_code == 401


def test_an_admin_token_signs_in_for_reading_only(server):
    with _browser(server) as browser:
        assert _sign_in(browser, server.admin).status_code == 303
        page = browser.get("/ui/")
        assert page.status_code == 200 and f"admin-{server.instance} (read)" in page.text
        secret = browser.cookies["vmplacer_ui"]
        refused = browser.put("/v1/hosts/t/maintenance", json={"reason": "x"})
        assert refused.status_code == 401  # the cookie is no bearer token (and is never sent to /v1)
    row = next(r for r in _rows(server) if r.id_hash == id_hash(secret))
    assert (row.token_scope, row.scope) == ("admin", "read")


def test_a_revoked_token_ends_its_sign_ins_at_once(server):
    token = server.create_token("short-lived", "read")
    with _browser(server) as browser:
        assert _sign_in(browser, token).status_code == 303
        assert browser.get("/ui/").status_code == 200
        assert vmplacer(server.config, "token", "revoke", "short-lived", "--yes").returncode == 0
        assert _signed_out(browser.get("/ui/"))
        assert _sign_in(browser, token).status_code == 401


def test_a_new_sign_in_ends_the_one_the_browser_carried(server):
    with _browser(server) as browser:
        assert _sign_in(browser, server.read).status_code == 303
        first = browser.cookies["vmplacer_ui"]
        assert _sign_in(browser, server.read).status_code == 303
        assert browser.cookies["vmplacer_ui"] != first
        assert id_hash(first) not in {row.id_hash for row in _rows(server)}


def test_an_idle_sign_in_ends(tmp_path):
    """`web.session_idle_s: 1`: a request a second after the last one finds it ended."""
    idle = _server(tmp_path, "web-idle", web={"session_idle_s": 1})
    try:
        with _browser(idle) as browser:
            assert _sign_in(browser, idle.read).status_code == 303
            assert len(_rows(idle)) == 1  # begun
            time.sleep(1.05)
            assert _signed_out(browser.get("/ui/"))
            assert _rows(idle) == []  # and deleted when found ended
    finally:
        idle.stop()


# ----- failed sign-ins counted by the connection's peer ---------------------------------------------
def _use_up(client: httpx.Client, forwarded: list[str]) -> None:
    for address in forwarded:
        assert _sign_in(client, "vmp_guess", **{"X-Forwarded-For": address}).status_code == 401


def test_an_untrusted_peer_gets_no_fresh_quota_from_x_forwarded_for(server):
    with _browser(server, STRANGER) as client:
        _use_up(client, [f"198.51.100.{i}" for i in range(SIGN_IN_FAILURES)])
        refused = _sign_in(client, server.read, **{"X-Forwarded-For": "198.51.100.250"})
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0


def test_loopback_is_no_trusted_proxy_unless_configured(server):
    """127.0.0.1 is not in `api.trusted_proxies`: its X-Forwarded-For names nobody either."""
    with _browser(server, "127.0.0.1") as client:
        _use_up(client, [f"203.0.113.{i}" for i in range(SIGN_IN_FAILURES)])
        assert _sign_in(client, server.read, **{"X-Forwarded-For": "203.0.113.250"}).status_code == 429


def test_behind_a_trusted_proxy_the_forwarded_client_is_counted(server):
    with _browser(server, PROXY) as proxy:
        _use_up(proxy, ["192.0.2.7"] * SIGN_IN_FAILURES)
        assert _sign_in(proxy, server.read, **{"X-Forwarded-For": "192.0.2.7"}).status_code == 429
        # what the client wrote itself, left of what the proxy appended, changes nothing
        assert _sign_in(proxy, server.read, **{"X-Forwarded-For": "10.9.9.9, 192.0.2.7"}).status_code == 429
        # another client behind the same proxy still signs in, and so does the proxy's own address
        assert _sign_in(proxy, server.read, **{"X-Forwarded-For": "192.0.2.8"}).status_code == 303
        assert _sign_in(proxy, server.read).status_code == 303


# ----- the store, on SQLite and PostgreSQL, with the test's clock ----------------------------------
class Clock:
    def __init__(self) -> None:
        self.at = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


@pytest.fixture
def store(sessions):  # type: ignore[no-untyped-def]
    clock = Clock()
    tokens = SqlTokenStore(sessions)
    token = tokens.create("ops", "admin")
    info = tokens.verify(token)
    assert info is not None and info.id is not None
    yield SqlWebSessionStore(sessions, lifetime_s=3600, idle_s=600, now=clock, max_per_token=3), clock, info, tokens


def test_a_sign_in_lives_while_used_and_ends_when_idle(store):
    sign_ins, clock, token, _ = store
    secret = sign_ins.start(token.name, token.id, token.scope)
    assert secret is not None
    found = sign_ins.find(secret)
    assert found is not None and (found.actor, found.scope, found.token_scope) == ("ops", "read", "admin")
    for _ in range(5):  # used every 9 of its 10 idle minutes: it lives on
        clock.advance(540)
        assert sign_ins.find(secret) is not None
    clock.advance(600)
    assert sign_ins.find(secret) is None
    clock.advance(-600)  # and it is gone for good, not only late
    assert sign_ins.find(secret) is None


def test_a_sign_in_ends_at_its_lifetime_however_busy(store):
    sign_ins, clock, token, _ = store
    secret = sign_ins.start(token.name, token.id, token.scope)
    assert secret is not None
    for _ in range(11):  # 55 minutes of use
        clock.advance(300)
        assert sign_ins.find(secret) is not None
    clock.advance(300)  # the hour is up
    assert sign_ins.find(secret) is None


def test_sign_out_revocation_and_strangers(store):
    sign_ins, _, token, tokens = store
    first = sign_ins.start(token.name, token.id, token.scope)
    second = sign_ins.start(token.name, token.id, token.scope)
    assert first and second and first != second
    assert sign_ins.end(first) and sign_ins.find(first) is None and sign_ins.find(second) is not None
    assert not sign_ins.end(first)
    for forged in ("", "x" * 43, second[:-1], second + "A", token.name, "../" * 15):
        assert sign_ins.find(forged) is None
    assert tokens.revoke("ops")
    assert sign_ins.find(second) is None
    assert sign_ins.start(token.name, token.id, token.scope) is None  # a revoked token begins nothing
    with sign_ins.sessions() as db:
        assert db.scalars(select(WebSessionRow)).all() == []  # gone with the token's row


def test_ended_sign_ins_are_pruned_and_a_token_holds_a_bounded_number(store):
    sign_ins, clock, token, _ = store
    secrets_ = []
    for _ in range(5):
        clock.advance(1)
        secrets_.append(sign_ins.start(token.name, token.id, token.scope))
    assert all(secrets_)
    live = [s for s in secrets_ if sign_ins.find(s or "") is not None]
    assert live == secrets_[-3:]  # max_per_token=3: the newest three
    clock.advance(600)
    assert sign_ins.prune() == 3
    idle = sign_ins.start(token.name, token.id, token.scope)
    clock.advance(3000)  # idle for 50 minutes, never looked at
    newest = sign_ins.start(token.name, token.id, token.scope)  # prunes the ended one on the way
    with sign_ins.sessions() as db:
        assert [row.id_hash for row in db.scalars(select(WebSessionRow))] == [id_hash(newest or "")]
    assert idle and sign_ins.find(idle) is None


# ----- the whole application in-process, with the test's clock -------------------------------------
def test_the_view_sends_an_expired_sign_in_to_the_login_page(sqlite_url, tmp_path):
    from vmplacer.api.app import create_app
    from vmplacer.api.services import ApiOptions

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    container = make_container(sqlite_url, tmp_path, None)
    read = SqlTokenStore(container.sessions).create("viewer", "read")
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False, isolation_check_s=0))
    clock = Clock()
    app.state.web_sessions.now = clock
    try:
        with TestClient(app, follow_redirects=False, headers={"Origin": "http://testserver"}) as client:
            assert client.post("/ui/login", data={"token": read}).status_code == 303
            for _ in range(24):  # a poll every 29 minutes, each within the idle half hour: 11.6 h
                clock.advance(29 * 60)
                assert client.get("/ui/api/fleet").status_code == 200
            clock.advance(29 * 60)  # past the 12 h since it began
            assert _signed_out(client.get("/ui/"))  # type: ignore[arg-type]
            assert client.post("/ui/login", data={"token": read}).status_code == 303
            clock.advance(30 * 60)  # half an hour idle
            assert client.get("/ui/api/fleet").status_code == 401
    finally:
        container.close()


# ----- `vmplacer db prune`: ended sign-ins nobody comes back with ------------------------------------
def _scene(sign_ins: SqlWebSessionStore, clock: Clock, token: Any) -> dict[str, str]:
    """Three sign-ins, begun by a store that never idles them out (its own prune on the way
    would take them first); at the end, by `sign_ins`' lifetime of 1 h and idle time of
    10 min: one past its end though used a moment ago, one idle, one live."""
    never_idle = SqlWebSessionStore(sign_ins.sessions, lifetime_s=3600, idle_s=86_400, now=clock)
    start = clock.at
    began = {}
    for name, at in (("past-its-end", 0), ("idle", 100), ("live", 3500)):
        clock.at = start + timedelta(seconds=at)
        began[name] = never_idle.start(token.name, token.id, token.scope) or ""
    assert never_idle.find(began["past-its-end"]) is not None  # used at 3500 s: not idle
    clock.at = start + timedelta(seconds=3650)
    assert sign_ins.find(began["live"]) is not None  # 150 s after it began
    return began


def test_prune_deletes_ended_sign_ins_by_lifetime_and_idle_time_and_keeps_live_ones(store):
    """Through the retention pruner, as `vmplacer db prune` calls it, on SQLite and PostgreSQL."""
    from vmplacer.adapters.db.models import AuditRow
    from vmplacer.adapters.db.retention import Pruner, RetentionAges

    sign_ins, clock, token, _ = store
    began = _scene(sign_ins, clock, token)
    # the configured lifetime was shortened since one began: it ends by the shorter one
    shorter = SqlWebSessionStore(sign_ins.sessions, lifetime_s=60, idle_s=600, now=clock)
    ages = RetentionAges(plans_s=86_400, profiles_s=86_400, audit_s=86_400, jobs_s=86_400)

    dry = Pruner(sign_ins.sessions, web_sessions=sign_ins).prune(ages, now=clock(), dry_run=True)
    assert dry.counts["web_sessions"] == 2  # past its end (1 h), idle (15 min since its last request)
    assert dry.to_dict()["web_sessions_end_s"] == {"lifetime": 3600.0, "idle": 600.0}
    assert len(_store_rows(sign_ins)) == 3  # a dry run deletes nothing
    report = Pruner(sign_ins.sessions, web_sessions=sign_ins, actor="prune-test").prune(ages, now=clock())
    assert report.counts["web_sessions"] == 2
    assert [row.id_hash for row in _store_rows(sign_ins)] == [id_hash(began["live"])]
    assert sign_ins.find(began["live"]) is not None
    with sign_ins.sessions() as db:
        entry = db.scalars(select(AuditRow).where(AuditRow.action == "db-prune")).one()
    assert entry.detail["counts"]["web_sessions"] == 2 and "2 web_sessions" in entry.message

    assert Pruner(sign_ins.sessions, web_sessions=shorter).prune(ages, now=clock()).counts["web_sessions"] == 1
    assert _store_rows(sign_ins) == [] and sign_ins.find(began["live"]) is None


def test_a_shortened_lifetime_ends_a_sign_in_at_once(store):
    sign_ins, clock, token, _ = store
    secret = sign_ins.start(token.name, token.id, token.scope) or ""
    clock.advance(120)
    assert sign_ins.find(secret) is not None
    assert SqlWebSessionStore(sign_ins.sessions, lifetime_s=60, idle_s=600, now=clock).find(secret) is None


def _store_rows(sign_ins: SqlWebSessionStore) -> list[WebSessionRow]:
    with sign_ins.sessions() as db:
        return list(db.scalars(select(WebSessionRow)))


def _as_the_prune_unit_runs_it(config: Path) -> Any:
    """The shipped unit's ExecStart (its words after the program), with its config from
    VMPLACER_CONFIG as the unit's Environment= sets it."""
    from tests.support import clean_env, run_vmplacer

    unit = Path(__file__).resolve().parents[2] / "systemd" / "vmplacer-prune.service"
    [command] = [line.split("=", 1)[1].split() for line in unit.read_text().splitlines()
                 if line.startswith("ExecStart=")]
    assert Path(command[0]).name == "vmplacer", command
    return run_vmplacer(*command[1:], env=clean_env({"VMPLACER_CONFIG": str(config)}))


def test_db_prune_deletes_ended_sign_ins_and_reports_them(migrated_url, tmp_path):
    """The console script, as the shipped prune unit runs it, with the config's `web:` times,
    on SQLite and PostgreSQL."""
    import json

    from vmplacer.adapters.db.engine import make_engine, make_session_factory

    config = write_config(tmp_path, migrated_url, HOSTS)
    document = yaml.safe_load(config.read_text())
    document["web"] = {"session_lifetime_s": 3600, "session_idle_s": "10m"}
    config.write_text(yaml.safe_dump(document))
    engine = make_engine(migrated_url)
    try:
        sessions = make_session_factory(engine)
        tokens = SqlTokenStore(sessions)
        info = tokens.verify(tokens.create("ops", "read"))
        assert info is not None and info.id is not None
        now = datetime.now(timezone.utc)
        at = {"moment": now}
        # begun under longer times (the config's were shortened since): ended by the config's
        sign_ins = SqlWebSessionStore(sessions, lifetime_s=86_400, idle_s=86_400, now=lambda: at["moment"])
        for ago in (7200, 1200):  # begun 2 h ago, used 5 min ago; idle for 20 minutes
            at["moment"] = now - timedelta(seconds=ago)
            assert sign_ins.start(info.name, info.id, info.scope)
        at["moment"] = now - timedelta(seconds=300)
        with sessions.begin() as db:  # the first one's last request
            db.execute(update(WebSessionRow).where(WebSessionRow.created_at < now - timedelta(seconds=3600))
                       .values(last_seen_at=at["moment"]))
        at["moment"] = now
        live = sign_ins.start(info.name, info.id, info.scope) or ""

        done = vmplacer(config, "db", "prune", "--dry-run", "-o", "json")
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        assert data["counts"]["web_sessions"] == 2, data
        assert data["web_sessions_end_s"] == {"lifetime": 3600, "idle": 600}
        assert len(_store_rows(sign_ins)) == 3

        done = _as_the_prune_unit_runs_it(config)
        assert done.returncode == 0, done.stderr
        [line] = [line for line in done.stdout.splitlines() if line.startswith("web_sessions ")]
        assert line.split()[-1] == "2" and "ended (1h old or 10m idle)" in line, done.stdout
        assert [row.id_hash for row in _store_rows(sign_ins)] == [id_hash(live)]
    finally:
        engine.dispose()
