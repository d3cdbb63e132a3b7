"""Every route but /healthz needs a token, and read tokens cannot change anything.

The routes are taken from the application's own route table, so a route added
later is checked without anyone listing it here.
"""

from __future__ import annotations

import re
import warnings

import pytest
from fastapi.routing import iter_route_contexts

from tests.functional.test_api_helpers import make_container

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from vmplacer.adapters.db.api import SqlTokenStore, hash_token
from vmplacer.api.app import create_app
from vmplacer.api.services import ApiOptions

PUBLIC = {"/healthz"}
WEB = "/ui"  # the web view signs in with a cookie (tests/functional/test_web_view.py)
SAMPLE_PARAMS = {"host": "t", "guest": "g1", "job_id": "00000000-0000-4000-8000-000000000000"}


def _routes(app) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    found = []
    for route in iter_route_contexts(app.routes):  # flattens included routers
        if not route.methods or not route.path:
            continue
        for method in sorted(route.methods or ()):
            if method in ("HEAD", "OPTIONS"):
                continue
            if route.path == WEB or route.path.startswith(WEB + "/"):
                continue
            path = re.sub(r"\{(\w+)(:[^}]*)?\}", lambda m: SAMPLE_PARAMS.get(m.group(1), "1"), route.path)
            found.append((method, path))
    return found


@pytest.fixture
def app_and_tokens(database_url, tmp_path):
    container = make_container(database_url, tmp_path, [{"name": "t", "uri": "test:///default"}])
    tokens = SqlTokenStore(container.sessions)
    admin, read = tokens.create("ops", "admin"), tokens.create("viewer", "read")
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield app, client, admin, read
    container.close()


def test_route_table_is_complete_enough_to_mean_something(app_and_tokens):
    app, *_ = app_and_tokens
    paths = {path for _, path in _routes(app)}
    for expected in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/v1/hosts", "/v1/placements",
                     "/v1/profiles", "/v1/jobs/" + SAMPLE_PARAMS["job_id"], "/v1/audit"):
        assert expected in paths


def test_every_non_public_route_refuses_missing_or_wrong_tokens(app_and_tokens):
    app, client, admin, read = app_and_tokens
    checked = 0
    for method, path in _routes(app):
        if path in PUBLIC:
            assert client.request(method, path).status_code == 200
            continue
        for headers in ({}, {"Authorization": "Bearer vmp_not-a-token"}, {"Authorization": f"Basic {admin}"},
                        {"Authorization": "Bearer "}, {"Authorization": f"Bearer {hash_token(admin)}"}):
            response = client.request(method, path, headers=headers, json={} if method != "GET" else None)
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.json()["error"]["code"] == "unauthorized"
            assert response.headers["www-authenticate"] == "Bearer"
        checked += 1
    assert checked >= 10


def test_read_tokens_read_and_admin_tokens_do_everything(app_and_tokens):
    app, client, admin, read = app_and_tokens
    for method, path in _routes(app):
        if path in PUBLIC:
            continue
        as_read = client.request(method, path, headers={"Authorization": f"Bearer {read}"},
                                 json={} if method != "GET" else None)
        as_admin = client.request(method, path, headers={"Authorization": f"Bearer {admin}"},
                                  json={} if method != "GET" else None)
        if method == "GET":
            assert as_read.status_code not in (401, 403), (method, path, as_read.text)
        else:
            assert as_read.status_code == 403, (method, path, as_read.text)
            assert "admin" in as_read.json()["error"]["message"]
        assert as_admin.status_code not in (401, 403), (method, path, as_admin.text)


def test_revoked_token_stops_working(database_url, tmp_path):
    container = make_container(database_url, tmp_path, [{"name": "t", "uri": "test:///default"}])
    tokens = SqlTokenStore(container.sessions)
    token = tokens.create("short-lived", "read")
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {token}"}
        assert client.get("/v1/audit", headers=headers).status_code == 200
        assert tokens.revoke("short-lived")
        app.state.services.tokens.forget_all()  # what the cache TTL does within seconds
        assert client.get("/v1/audit", headers=headers).status_code == 401
        actions = [e["action"] for e in tokens_audit(container)]
        assert "token-revoke" in actions and "token-create" in actions
    container.close()


def tokens_audit(container):  # type: ignore[no-untyped-def]
    entries, _ = container.pages.audit(limit=100)
    return entries


def test_tokens_are_stored_only_as_hashes(database_url, tmp_path):
    from sqlalchemy import text

    container = make_container(database_url, tmp_path, [{"name": "t", "uri": "test:///default"}])
    token = SqlTokenStore(container.sessions).create("ops", "admin")
    with container.engine.connect() as connection:
        dump = " ".join(str(v) for row in connection.execute(text("SELECT * FROM api_tokens")) for v in row)
    assert token not in dump
    assert hash_token(token) in dump
    assert len(token) > 40  # 256 bits, URL-safe base64
    container.close()
