"""The web view at /ui/ in-process: signing in with a token kept in a cookie, the headers
every response carries, escaping of caller input, validated query strings, and the data the
pages and their JSON show for placements recorded on the built-in example host."""

from __future__ import annotations

import re
import time
import warnings
from html.parser import HTMLParser

import pytest

from tests.functional.test_api_helpers import make_container
from tests.functional.web_support import DEDICATED, HOSTILE, SHARED, record_guests, store_plan
from vmplacer.adapters.db.api import SqlTokenStore
from vmplacer.api.app import create_app
from vmplacer.api.services import ApiOptions
from vmplacer.config import EXAMPLE_HOST_NAME
from vmplacer.web.security import CSP

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


@pytest.fixture
def web(sqlite_url, tmp_path):
    container = make_container(sqlite_url, tmp_path, None)
    tokens = SqlTokenStore(container.sessions)
    admin, read = tokens.create("ops", "admin"), tokens.create("viewer", "read")
    known = record_guests(container, EXAMPLE_HOST_NAME)
    store_plan(container, EXAMPLE_HOST_NAME)
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False, isolation_check_s=0))
    with TestClient(app, raise_server_exceptions=False, follow_redirects=False) as client:
        yield client, admin, read, known
    container.close()


def sign_in(client, token: str) -> None:  # type: ignore[no-untyped-def]
    answer = client.post("/ui/login", data={"token": token})
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/", answer.text


class Elements(HTMLParser):
    """Every start tag of a document, with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = Elements()
    parser.feed(html)
    return parser.tags


def test_without_a_cookie_pages_send_to_the_login_page_and_json_answers_401(web):
    client, *_ = web
    for path in ("/ui/", f"/ui/hosts/{EXAMPLE_HOST_NAME}"):
        answer = client.get(path)
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/login"
    assert client.get("/ui/api/fleet").status_code == 401
    client.cookies.set("vmplacer_ui", "vmp_not-a-token", path="/ui")
    answer = client.get("/ui/")
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/login"
    assert 'vmplacer_ui=""' in answer.headers["set-cookie"]  # the bad cookie is cleared
    assert client.get("/ui/login").status_code == 200


def test_a_bad_token_is_refused_with_a_message_and_sets_no_cookie(web):
    client, *_ = web
    for form, message in (({"token": "vmp_guessed"}, "unknown or revoked token"), ({}, "a token is required")):
        answer = client.post("/ui/login", data=form)
        assert answer.status_code == 401
        assert message in answer.text and "set-cookie" not in answer.headers
        assert "vmp_guessed" not in answer.text  # the submitted value is not echoed


def test_a_read_token_signs_in_with_a_strict_http_only_cookie_and_logout_clears_it(web):
    client, admin, read, _ = web
    answer = client.post("/ui/login", data={"token": read})
    cookie = answer.headers["set-cookie"]
    assert answer.status_code == 303 and read in cookie
    for attribute in ("HttpOnly", "Path=/ui", "SameSite=strict"):
        assert attribute.lower() in cookie.lower(), cookie
    assert "secure" not in cookie.lower()  # plain HTTP here; over TLS the cookie is Secure
    assert read not in answer.headers["location"]
    page = client.get("/ui/")
    assert page.status_code == 200 and "viewer (read)" in page.text
    out = client.post("/ui/logout")
    assert out.status_code == 303 and 'vmplacer_ui=""' in out.headers["set-cookie"]
    client.cookies.clear()
    assert client.get("/ui/").status_code == 303


def test_the_cookie_is_secure_over_tls(web):
    client, _, read, _ = web
    tls = TestClient(client.app, base_url="https://testserver", follow_redirects=False)
    answer = tls.post("/ui/login", data={"token": read})
    assert answer.status_code == 303 and "secure" in answer.headers["set-cookie"].lower()


def test_every_ui_response_carries_the_security_headers(web):
    client, _, read, _ = web
    responses = [client.get("/ui/"), client.get("/ui/login"), client.post("/ui/login", data={"token": "x"}),
                 client.get("/ui/static/ui.js"), client.get("/ui/static/ui.css"), client.get("/ui/nowhere")]
    sign_in(client, read)
    responses += [client.get("/ui/"), client.get(f"/ui/hosts/{EXAMPLE_HOST_NAME}"), client.get("/ui/api/fleet"),
                  client.get("/ui/?page=0"), client.get("/ui/hosts/unknown")]
    for answer in responses:
        assert answer.headers["content-security-policy"] == CSP, answer.url
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"
    assert "content-security-policy" not in client.get("/healthz").headers  # the API's own are untouched


def test_pages_hold_no_inline_script_or_style_and_load_only_their_own_files(web):
    client, _, read, _ = web
    sign_in(client, read)
    for path in ("/ui/login", "/ui/", f"/ui/hosts/{EXAMPLE_HOST_NAME}", "/ui/plans", "/ui/plans/1"):
        html = client.get(path).text
        for tag, attrs in elements(html):
            assert "style" not in attrs and tag != "style", (path, tag)
            assert not any(name.startswith("on") for name in attrs), (path, tag, attrs)
            if tag == "script":
                assert attrs.get("src", "").startswith("/ui/static/"), (path, attrs)
            if tag == "link":
                assert attrs["href"].startswith(("/ui/static/", "data:")), (path, attrs)
        assert re.search(r"<script[^>]*>\s*[^<\s]", html) is None  # no inline script body
        assert "http://" not in html and "https://" not in html  # no CDN, no external font


def test_hostile_names_and_labels_render_as_text(web):
    client, _, read, _ = web
    sign_in(client, read)
    for path in ("/ui/", f"/ui/hosts/{EXAMPLE_HOST_NAME}", "/ui/plans/1"):
        html = client.get(path).text
        assert HOSTILE not in html
        assert not [tag for tag, _ in elements(html) if tag == "img"]
    host = client.get(f"/ui/hosts/{EXAMPLE_HOST_NAME}").text
    assert "&lt;img src=x onerror=alert(1)&gt;" in host
    guests = client.get(f"/ui/api/hosts/{EXAMPLE_HOST_NAME}").json()["guests"]
    assert HOSTILE in [g["name"] for g in guests]  # the JSON carries the value; the page's script sets it as text


def test_the_host_page_maps_each_guest_to_its_pcpus(web):
    client, _, read, known = web
    sign_in(client, read)
    html = client.get(f"/ui/hosts/{EXAMPLE_HOST_NAME}").text
    boxes = {int(a["data-cpu"]): a for t, a in elements(html) if t == "div" and "data-cpu" in a}
    data = client.get(f"/ui/api/hosts/{EXAMPLE_HOST_NAME}").json()
    assert len(boxes) == len(data["cpus"]) > 0
    for cpu, guest in known.exclusive.items():
        assert boxes[cpu]["data-kind"] == "exclusive" and boxes[cpu]["data-guests"].split(",")[0] == guest
    for cpu, guest in known.floating.items():
        assert boxes[cpu]["data-kind"] == "floating" and guest in boxes[cpu]["data-guests"].split(",")
    for cpu, guest in known.emulator.items():
        assert guest in boxes[cpu]["data-guests"] and "emu" in data["cpus"][str(cpu)]["marks"]
    named = set(known.exclusive) | set(known.floating) | set(known.emulator)
    busy = {cpu for cpu, box in boxes.items() if box["data-guests"] and cpu not in named}
    assert all(HOSTILE in boxes[cpu]["data-guests"] for cpu in busy)  # only the third guest's core is left
    rows = {g["name"]: g for g in data["guests"]}
    assert rows[DEDICATED]["kind"] == "dedicated" and rows[DEDICATED]["class"] == "latency-critical"
    assert rows[SHARED]["kind"] == "shared" and rows[SHARED]["labels"] == [f"team={HOSTILE}"]


def test_the_fleet_page_shows_the_room_the_placements_leave(web):
    client, _, read, known = web
    sign_in(client, read)
    row = client.get("/ui/api/fleet").json()["rows"][0]
    assert row["name"] == EXAMPLE_HOST_NAME and row["state"] == "ok" and row["guests"] == 3
    topology = client.app.state.services.container.hypervisor(EXAMPLE_HOST_NAME).topology()
    taken = {topology.core_of(cpu).id for cpu in known.exclusive}
    assert row["free_cores"] == len(topology.cores) - len(taken)  # floating guests break no whole core
    assert sum(n["whole_cores"] for n in row["nodes"]) == row["free_cores"]
    assert row["last_plan"]["id"] == 1 and row["last_plan"]["state"] == "proposed"


@pytest.mark.parametrize("query, field", [
    ("page=0", "page"), ("page=abc", "page"), ("page=99999999", "page"), ("sort=password", "sort"),
    ("order=up", "order"), ("state=broken", "state"), ("q=%3Cscript%3E", "q"), ("q=" + "a" * 64, "q"),
    ("colour=red", "colour"), ("page=1&page=2", "page"),
])
def test_bad_query_strings_are_refused_naming_the_field(web, query, field):
    client, _, read, _ = web
    sign_in(client, read)
    page = client.get(f"/ui/?{query}")
    assert page.status_code == 422 and f"field {field}:" in page.text
    data = client.get(f"/ui/api/fleet?{query}")
    assert data.status_code == 422 and data.json()["error"]["details"][0]["field"] == field
    assert "<script>" not in page.text


def test_unknown_hosts_are_404_and_methods_other_than_get_are_refused(web):
    client, _, read, _ = web
    sign_in(client, read)
    assert client.get("/ui/hosts/nowhere").status_code == 404
    assert client.get("/ui/api/hosts/%3Cb%3E").status_code == 404
    for path in ("/ui/", f"/ui/hosts/{EXAMPLE_HOST_NAME}", "/ui/api/fleet"):
        assert client.post(path).status_code == 405
        assert client.delete(path).status_code == 405


def test_a_read_token_changes_nothing_through_the_view(web):
    """The cookie is scoped to /ui (never sent to the API), the API still wants an admin
    bearer token for a change, and the only forms the pages hold sign in, sign out or filter."""
    client, _, read, _ = web
    sign_in(client, read)
    refused = client.put(f"/v1/hosts/{EXAMPLE_HOST_NAME}/maintenance", json={"reason": "x"})
    assert refused.status_code == 401
    refused = client.put(f"/v1/hosts/{EXAMPLE_HOST_NAME}/maintenance", json={"reason": "x"},
                         headers={"Authorization": f"Bearer {read}"})
    assert refused.status_code == 403
    for path in ("/ui/", f"/ui/hosts/{EXAMPLE_HOST_NAME}"):
        forms = [a for t, a in elements(client.get(path).text) if t == "form"]
        assert forms and all(a.get("action") in ("/ui/logout", "/ui/") for a in forms)
        assert all(a.get("method") == "get" for a in forms if a.get("action") == "/ui/")


def test_a_refresh_costs_the_server_little(web, record_property):
    """Server time per refresh of the host page's JSON and of the fleet's (reported, not bounded)."""
    client, _, read, _ = web
    sign_in(client, read)
    for path in (f"/ui/api/hosts/{EXAMPLE_HOST_NAME}", "/ui/api/fleet"):
        assert client.get(path).status_code == 200
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(200):
            assert client.get(path).status_code == 200
        wall_ms = (time.perf_counter() - started) * 1000 / 200
        cpu_ms = (time.process_time() - cpu) * 1000 / 200
        name = path.rsplit("/", 1)[-1]
        record_property(f"refresh_{name}_ms", round(wall_ms, 2))
        record_property(f"refresh_{name}_cpu_ms", round(cpu_ms, 2))
        print(f"{path}: {wall_ms:.2f} ms per request, {cpu_ms:.2f} ms CPU (client and server in one process)")


def test_the_plans_pages_list_plans_and_show_actions_gain_and_trials(web):
    client, _, read, _ = web
    assert client.get("/ui/plans").status_code == 303  # signed in only
    sign_in(client, read)
    listing = client.get("/ui/plans").text
    links = [a["href"] for t, a in elements(listing) if t == "a" and a.get("href", "").startswith("/ui/plans/")]
    assert links == ["/ui/plans/1"]
    page = client.get("/ui/plans/1")
    assert page.status_code == 200
    rows = [a for t, a in elements(page.text) if t == "tr" and "data-action" in a]
    assert [r["data-action"] for r in rows] == ["0", "1"]
    assert "+0.250" in page.text and "1.500 → 1.750" in page.text and ">kept<" in page.text
    assert "&lt;img src=x onerror=alert(1)&gt;" in page.text  # the hostile reason, as text


@pytest.mark.parametrize("path, status, field", [
    ("/ui/plans/0", 422, "plan_id"), ("/ui/plans/abc", 422, "plan_id"), ("/ui/plans/99999999999", 422, "plan_id"),
    ("/ui/plans?limit=5", 422, "limit"), ("/ui/plans/1?x=1", 422, "x"), ("/ui/plans/7", 404, None),
])
def test_bad_plan_addresses_are_refused(web, path, status, field):
    client, _, read, _ = web
    sign_in(client, read)
    answer = client.get(path)
    assert answer.status_code == status
    assert (f"field {field}:" in answer.text) if field else ("plan 7 does not exist" in answer.text)


def test_an_unreadable_host_is_shown_as_such_and_not_read_on_every_refresh(sqlite_url, tmp_path):
    from tests.functional.test_api_helpers import free_port

    container = make_container(sqlite_url, tmp_path, [
        {"name": "t", "uri": "test:///default", "domain_type": "qemu"},
        {"name": "down", "uri": f"qemu+tcp://127.0.0.1:{free_port()}/system"}])
    read = SqlTokenStore(container.sessions).create("viewer", "read")
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False, isolation_check_s=0))
    try:
        with TestClient(app, follow_redirects=False) as client:
            sign_in(client, read)
            snapshots = app.state.services.snapshots
            reads: list[str] = []
            topology = snapshots.topology
            snapshots.topology = lambda name: (reads.append(name), topology(name))[1]
            first = {r["name"]: r for r in client.get("/ui/api/fleet").json()["rows"]}
            assert first["down"]["state"] == "unreadable" and "down" in first["down"]["error"]
            assert first["t"]["state"] == "ok"
            again = {r["name"]: r for r in client.get("/ui/api/fleet?state=unreadable").json()["rows"]}
            assert list(again) == ["down"] and again["down"]["error"] == first["down"]["error"]
            assert reads.count("down") == 1 and reads.count("t") == 2
            page = client.get("/ui/hosts/down")
            assert page.status_code == 503 and "down" in page.text
    finally:
        container.close()
