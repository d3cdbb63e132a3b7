"""The web view at /ui/ in-process: signing in with a token (kept on the server, its id in a
cookie), the headers every response carries, escaping of caller input, validated query
strings, and the data the pages and their JSON show for placements recorded on the built-in
example host."""

from __future__ import annotations

import re
import time
import warnings
from html.parser import HTMLParser

import pytest

from tests.functional.test_api_helpers import make_container
from tests.functional.web_support import DEDICATED, HOSTILE, SHARED, record_guests, store_plan, store_profiles
from vmplacer.adapters.db.api import SqlTokenStore
from vmplacer.api.app import create_app
from vmplacer.api.services import ApiOptions
from vmplacer.config import EXAMPLE_HOST_NAME
from vmplacer.core.topology.host import DistanceClass
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
    store_profiles(container, EXAMPLE_HOST_NAME)
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False, isolation_check_s=0))
    # a browser sends its page's Origin with every POST; the view refuses a POST without one
    with TestClient(app, raise_server_exceptions=False, follow_redirects=False, headers={"Origin": SITE}) as client:
        yield client, admin, read, known
    container.close()


SITE = "http://testserver"


def sign_in(client, token: str) -> None:  # type: ignore[no-untyped-def]
    answer = client.post("/ui/login", data={"token": token}, headers={"Origin": str(client.base_url).rstrip("/")})
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
    answer = client.get("/ui/")
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/login"  # the fleet is where it lands anyway
    answer = client.get(f"/ui/hosts/{EXAMPLE_HOST_NAME}")
    assert answer.status_code == 303 and answer.headers["location"] == f"/ui/login?next=%2Fui%2Fhosts%2F{EXAMPLE_HOST_NAME}"
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


def test_a_read_token_signs_in_with_a_strict_http_only_cookie_and_logout_ends_it(web):
    client, admin, read, _ = web
    answer = client.post("/ui/login", data={"token": read})
    cookie = answer.headers["set-cookie"]
    assert answer.status_code == 303 and read not in cookie  # the cookie holds a sign-in's id, not the token
    for attribute in ("HttpOnly", "Path=/ui", "SameSite=strict"):
        assert attribute.lower() in cookie.lower(), cookie
    assert "secure" not in cookie.lower()  # plain HTTP here; over TLS the cookie is Secure
    assert read not in answer.headers["location"]
    kept = client.cookies["vmplacer_ui"]
    page = client.get("/ui/")
    assert page.status_code == 200 and "viewer (read)" in page.text
    out = client.post("/ui/logout")
    assert out.status_code == 303 and 'vmplacer_ui=""' in out.headers["set-cookie"]
    client.cookies.clear()
    assert client.get("/ui/").status_code == 303
    client.cookies.set("vmplacer_ui", kept, path="/ui")  # the old cookie, kept: ended on the server too
    assert client.get("/ui/").headers["location"] == "/ui/login"


def test_the_cookie_is_secure_over_tls(web):
    client, _, read, _ = web
    tls = TestClient(client.app, base_url="https://testserver", follow_redirects=False,
                     headers={"Origin": "https://testserver"})
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
        assert answer.headers["referrer-policy"] == "same-origin"
    assert "content-security-policy" not in client.get("/healthz").headers  # the API's own are untouched


def test_pages_hold_no_inline_script_or_style_and_load_only_their_own_files(web):
    client, _, read, _ = web
    sign_in(client, read)
    for path in ("/ui/login", "/ui/", f"/ui/hosts/{EXAMPLE_HOST_NAME}", "/ui/plans", "/ui/plans/1",
                 f"/ui/hosts/{EXAMPLE_HOST_NAME}/guests/{DEDICATED}", "/ui/model", "/ui/nowhere"):
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


def _last_plan_cell(html: str, host: str) -> str:
    row = re.search(rf'<tr data-host="{re.escape(host)}">(.*?)</tr>', html, re.S)
    assert row, html
    cell = re.search(r'<td class="last-plan">(.*?)</td>', row.group(1), re.S)
    assert cell, row.group(1)
    return cell.group(1)


def test_the_fleet_shows_each_hosts_last_plan_gain_in_guest_equivalents_linked_to_the_plan(web):
    from vmplacer.core.rebalance.plan import Plan
    from vmplacer.web.glossary import GAIN_UNIT

    client, _, read, _ = web
    sign_in(client, read)
    container = client.app.state.services.container
    row = client.get("/ui/api/fleet").json()["rows"][0]
    assert row["last_plan"]["gain"] == pytest.approx(0.25)  # store_plan: objective 1.5 -> 1.75
    cell = _last_plan_cell(client.get("/ui/").text, EXAMPLE_HOST_NAME)
    assert '<a class="gain" href="/ui/plans/1"' in cell and f">+0.250 {GAIN_UNIT}</a>" in cell
    assert GAIN_UNIT == "guest-equivalents" and client.get("/ui/plans/1").status_code == 200

    # a newer plan that loses speed is the one shown, signed; an empty plan (nothing to do) is not
    worse = container.plan_store.save(Plan(actions=(), hosts=(EXAMPLE_HOST_NAME,), state="proposed",
                                           objective_before=2.0, objective_after=1.875, summary="worse"))
    container.plan_store.save(Plan(actions=(), hosts=(EXAMPLE_HOST_NAME,), state="empty",
                                    objective_before=2.0, objective_after=9.0, summary="nothing"))
    client.app.state.web.newest_plans.invalidate()
    row = client.get("/ui/api/fleet").json()["rows"][0]
    assert (row["last_plan"]["id"], row["last_plan"]["gain"]) == (worse.id, pytest.approx(-0.125))
    cell = _last_plan_cell(client.get("/ui/").text, EXAMPLE_HOST_NAME)
    assert f'href="/ui/plans/{worse.id}"' in cell and f">-0.125 {GAIN_UNIT}</a>" in cell
    assert "predicted gain" in client.get("/ui/").text


@pytest.mark.parametrize("query, field", [
    ("page=0", "page"), ("page=abc", "page"), ("page=99999999", "page"), ("sort=password", "sort"),
    ("order=up", "order"), ("state=broken", "state"), ("q=%3Cscript%3E", "q"), ("q=" + "a" * 64, "q"),
    ("page=1&page=2", "page"),
])
def test_bad_query_strings_are_refused_naming_the_field(web, query, field):
    client, _, read, _ = web
    sign_in(client, read)
    page = client.get(f"/ui/?{query}")
    assert page.status_code == 422 and f"field {field}:" in page.text
    data = client.get(f"/ui/api/fleet?{query}")
    assert data.status_code == 422 and data.json()["error"]["details"][0]["field"] == field
    assert "<script>" not in page.text


def test_pages_ignore_parameters_they_do_not_know_and_the_json_refuses_them(web):
    """A link that picked up a tracking tag still opens its page; the JSON the pages poll stays strict."""
    client, _, read, _ = web
    sign_in(client, read)
    for path in ("/ui/", "/ui/?utm_source=x&sort=guests", f"/ui/hosts/{EXAMPLE_HOST_NAME}", "/ui/plans",
                 "/ui/plans/1", f"/ui/hosts/{EXAMPLE_HOST_NAME}/guests/{DEDICATED}", "/ui/model"):
        sep = "&" if "?" in path else "?"
        answer = client.get(f"{path}{sep}utm_source=x&colour=%3Cb%3E")
        assert answer.status_code == 200, (path, answer.text[:200])
        assert "utm_source" not in answer.text and "&lt;b&gt;" not in answer.text  # ignored, not echoed
    sorted_page = client.get("/ui/?utm_source=x&sort=guests").text
    assert 'class="sorted asc"' in sorted_page  # the known parameter still counts
    refused = client.get("/ui/api/fleet?utm_source=x")
    assert refused.status_code == 422 and refused.json()["error"]["details"][0]["field"] == "utm_source"


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
    for path in ("/ui/", f"/ui/hosts/{EXAMPLE_HOST_NAME}", "/ui/search?q=db"):
        forms = [a for t, a in elements(client.get(path).text) if t == "form"]
        assert forms and all(a.get("action") in ("/ui/logout", "/ui/", "/ui/search") for a in forms)
        assert all(a.get("method") == "get" for a in forms if a.get("action") != "/ui/logout")


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
    ("/ui/plans/7", 404, None),
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


# ----- the guest page ----------------------------------------------------------------------------
def guest_path(name: str) -> str:
    from urllib.parse import quote

    return f"/ui/hosts/{EXAMPLE_HOST_NAME}/guests/{quote(name, safe='')}"


def test_the_guest_page_shows_its_placement_history_neighbours_and_plans(web):
    client, _, read, known = web
    sign_in(client, read)  # a read token is enough
    page = client.get(guest_path(SHARED))
    assert page.status_code == 200, page.text
    record = client.app.state.services.container.placement_store.get(SHARED)
    tags = elements(page.text)
    vcpus = [a["data-vcpu"] for t, a in tags if t == "tr" and "data-vcpu" in a]
    assert vcpus == sorted(record["placement"]["vcpupin"], key=int)
    from vmplacer.core.topology.cpuset import format_cpuset

    assert page.text.count(f'<td class="mono">{format_cpuset(frozenset(known.floating))}</td>') == len(vcpus)
    runs = [a["data-run"] for t, a in tags if t == "tr" and "data-run" in a]
    assert runs == ["2", "1"]  # newest first
    stored = client.app.state.services.container.profile_store.guest_history(SHARED)
    for entry in stored:  # each run's stored degradation estimate of the shared guest
        assert f"{entry['summary']['degradation']['estimate'] * 100:.1f} %" in page.text
    neighbours = [a["data-neighbour"] for t, a in tags if t == "tr" and "data-neighbour" in a]
    assert sorted(neighbours) == sorted([DEDICATED, HOSTILE])
    assert [a["data-plan"] for t, a in tags if t == "tr" and "data-plan" in a] == ["1"]
    assert "0 repin: pending" in page.text
    dedicated = client.get(guest_path(DEDICATED)).text
    assert f'<td class="mono" id="emulatorpin">{format_cpuset(frozenset(known.emulator))}</td>' in dedicated
    assert 'id="memory-nodes">0 (strict)' in dedicated
    assert [a["data-plan"] for t, a in elements(dedicated) if t == "tr" and "data-plan" in a] == []


def test_the_model_predicts_a_loss_for_each_measured_neighbour(web):
    client, _, read, _ = web
    sign_in(client, read)
    data = client.app.state.web.guest(EXAMPLE_HOST_NAME, DEDICATED)
    rows = {r["neighbour"]: r for r in data["predicted"]["neighbours"]}
    assert set(rows) == {SHARED, HOSTILE}
    for row in rows.values():  # measured ~20-25 % loss beside them at this distance: the model learned it
        assert row["beta"] is not None and row["beta"] > 0 and row["loss"] > 0
    assert data["predicted"]["together"] < data["predicted"]["alone"]
    assert data["model_observations"] == client.app.state.services.container.load_model().observations > 0


def test_a_hostile_guest_page_renders_its_name_as_text(web):
    client, _, read, _ = web
    sign_in(client, read)
    moved = client.get("/ui/guests/" + guest_path(HOSTILE).rsplit("/", 1)[1])
    assert moved.status_code == 303 and moved.headers["location"] == guest_path(HOSTILE)
    page = client.get(guest_path(HOSTILE))
    assert page.status_code == 200
    assert HOSTILE not in page.text and "&lt;img src=x onerror=alert(1)&gt;" in page.text
    assert not [t for t, _ in elements(page.text) if t == "img"]
    host = client.get(f"/ui/hosts/{EXAMPLE_HOST_NAME}").text
    links = [a["href"] for t, a in elements(host) if t == "a" and "/guests/" in a.get("href", "")]
    assert guest_path(HOSTILE) in links and guest_path(DEDICATED) in links
    plan = client.get("/ui/plans/1").text
    assert "/ui/guests/web-1" in [a.get("href") for t, a in elements(plan) if t == "a"]


@pytest.mark.parametrize("path, status", [
    (f"/ui/hosts/{EXAMPLE_HOST_NAME}/guests/nobody", 404), ("/ui/hosts/nowhere/guests/db-1", 404),
    ("/ui/guests/nobody", 404), (f"/ui/hosts/{EXAMPLE_HOST_NAME}/guests/" + "a" * 256, 422),
    (f"/ui/hosts/{EXAMPLE_HOST_NAME}/guests/a%01b", 422),
    ("/ui/nowhere", 404), ("/ui/hosts/a/b/c/d", 404), ("/ui/static/missing.js", 404),
])
def test_unknown_pages_answer_an_html_page(web, path, status):
    client, _, read, _ = web
    sign_in(client, read)
    answer = client.get(path)
    assert answer.status_code == status
    assert answer.headers["content-type"].startswith("text/html") and "<h1>" in answer.text


def test_unknown_json_under_the_view_stays_json(web):
    client, _, read, _ = web
    sign_in(client, read)
    answer = client.get("/ui/api/nowhere")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "not-found"


def test_guest_and_model_pages_need_a_sign_in(web):
    client, *_ = web
    from urllib.parse import parse_qs, urlsplit

    for path in (guest_path(DEDICATED), "/ui/model", "/ui/guests/db-1", "/ui/search?q=db"):
        answer = client.get(path)
        location = urlsplit(answer.headers["location"])
        assert answer.status_code == 303 and location.path == "/ui/login"
        assert parse_qs(location.query) == {"next": [path]}  # back there once signed in


# ----- the model page ----------------------------------------------------------------------------
def test_the_model_page_draws_one_heat_map_per_distance_class_with_counts(web):
    from vmplacer.core.topology.host import NEIGHBOUR_CLASSES

    client, _, read, _ = web
    sign_in(client, read)
    page = client.get("/ui/model")
    assert page.status_code == 200
    tags = elements(page.text)
    maps = [a["data-distance"] for t, a in tags if t == "section" and "data-distance" in a]
    assert maps == [c.value for c in NEIGHBOUR_CLASSES]
    model = client.app.state.services.container.load_model()
    keys = model.known_keys()
    cells = [a for t, a in tags if t == "td" and "data-beta" in a]
    assert len(cells) == len(maps) * len(keys) * (len(keys) - 1)  # the diagonal is no pair
    evidence = model.pair_evidence()
    observed = {(c.value, u, v): n for (c, u, v), n in evidence.items()}
    assert observed  # the stored runs were learned
    for cell in cells:
        # HTMLParser unescapes attributes: these are the names as they are
        key = (next(m for m in maps if cell["title"].endswith(f"at {m}: β {float(cell['data-beta']):.4f}, "
                                                              f"{cell['data-observations']} observations")),
               cell["data-background"], cell["data-foreground"])
        assert float(cell["data-observations"]) == pytest.approx(observed.get(key, 0.0), rel=1e-2)
        assert ("prior" in cell["class"]) == (observed.get(key, 0.0) == 0)
        assert float(cell["data-beta"]) == pytest.approx(model.beta(key[1], key[2], DistanceClass(key[0])), abs=1e-5)
    assert HOSTILE not in page.text and "&lt;img src=x onerror=alert(1)&gt;" in page.text
    assert not [t for t, _ in tags if t == "img"]


def test_the_model_page_without_a_model_says_so(sqlite_url, tmp_path):
    container = make_container(sqlite_url, tmp_path, None)
    read = SqlTokenStore(container.sessions).create("viewer", "read")
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False, isolation_check_s=0))
    try:
        with TestClient(app, follow_redirects=False) as client:
            sign_in(client, read)
            page = client.get("/ui/model")
            assert page.status_code == 200 and 'id="no-model"' in page.text and "data-beta" not in page.text
    finally:
        container.close()


# ----- the only POSTs: same site, and a limit on guessing ----------------------------------------
@pytest.mark.parametrize("headers", [
    {"Origin": "https://evil.example"}, {"Origin": "null"}, {"Origin": "http://testserver:8080"},
    {"Origin": "", "Referer": "https://evil.example/form"}, {"Origin": ""},
])
def test_a_sign_in_from_another_site_is_refused(web, headers):
    client, _, read, _ = web
    del client.headers["Origin"]
    sent = {k: v for k, v in headers.items() if v}
    answer = client.post("/ui/login", data={"token": read}, headers=sent)
    assert answer.status_code == 403 and "set-cookie" not in answer.headers
    assert "sign-in refused" in answer.text


def test_a_same_site_referer_is_enough_without_origin(web):
    client, _, read, _ = web
    del client.headers["Origin"]
    answer = client.post("/ui/login", data={"token": read}, headers={"Referer": f"{SITE}/ui/login"})
    assert answer.status_code == 303 and "set-cookie" in answer.headers


def test_a_sign_out_from_another_site_is_refused(web):
    client, _, read, _ = web
    sign_in(client, read)
    answer = client.post("/ui/logout", headers={"Origin": "https://evil.example"})
    assert answer.status_code == 403 and "set-cookie" not in answer.headers
    assert client.get("/ui/").status_code == 200  # still signed in


def test_failed_sign_ins_are_limited_per_client(web):
    from vmplacer.web.guard import SIGN_IN_FAILURES, SIGN_IN_WINDOW_S, SignInLimiter

    client, _, read, _ = web
    now = [1000.0]
    client.app.state.web_sign_ins = SignInLimiter(clock=lambda: now[0])
    for _ in range(SIGN_IN_FAILURES):
        assert client.post("/ui/login", data={"token": "vmp_guess"}).status_code == 401
    refused = client.post("/ui/login", data={"token": read})  # even the right token waits
    assert refused.status_code == 429 and "set-cookie" not in refused.headers
    assert int(refused.headers["retry-after"]) == SIGN_IN_WINDOW_S
    assert "too many failed sign-ins" in refused.text
    now[0] += 10
    assert int(client.post("/ui/login", data={"token": read}).headers["retry-after"]) == SIGN_IN_WINDOW_S - 10
    now[0] += SIGN_IN_WINDOW_S
    sign_in(client, read)  # the window passed
    assert client.app.state.web_sign_ins.retry_after("another-client") == 0


def test_a_fleet_of_1000_hosts_answers_one_page_of_50_rows(sqlite_url, tmp_path):
    """The page holds 50 rows whatever the fleet's size: the 1,000-host fleet's first page is
    no larger than the first page of a filter that keeps 100 of them."""
    from vmplacer.config import EXAMPLE_CAPABILITIES
    from vmplacer.web.query import PAGE_SIZE

    hosts = [{"name": f"h{i:04d}", "uri": "test:///default", "capabilities": str(EXAMPLE_CAPABILITIES)}
             for i in range(1000)]
    container = make_container(sqlite_url, tmp_path, hosts)
    read = SqlTokenStore(container.sessions).create("viewer", "read")
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False, isolation_check_s=0))
    try:
        with TestClient(app, follow_redirects=False) as client:
            sign_in(client, read)
            whole = client.get("/ui/")
            rows = [a["data-host"] for t, a in elements(whole.text) if t == "tr" and "data-host" in a]
            assert rows == [f"h{i:04d}" for i in range(PAGE_SIZE)]
            assert "1000 of 1000 hosts · page 1 of 20" in whole.text
            some = client.get("/ui/?q=h00")
            assert "100 of 1000 hosts · page 1 of 2" in some.text
            # no larger than the page of 100 (whose links also carry its filter): rows, not the fleet, count
            assert len(whole.content) <= len(some.content)
            data = client.get("/ui/api/fleet?page=20").json()
            assert len(data["rows"]) == PAGE_SIZE and data["rows"][-1]["name"] == "h0999"
            assert all(r["state"] == "ok" for r in data["rows"])
    finally:
        container.close()


def test_a_guest_address_admits_every_name_a_record_can_hold():
    from vmplacer.adapters.db.models import GUEST_NAME_LENGTH
    from vmplacer.web import routes

    assert routes.GUEST_NAME_LENGTH == GUEST_NAME_LENGTH


def test_the_host_page_shows_every_domain_and_the_violations_the_periodic_check_counts(web):
    """A domain vmplacer did not place is on the page (else "free" misleads), and the host's
    violations, listed with the guests involved, are those `serve`'s isolation check counts."""
    client, _, read, known = web
    sign_in(client, read)
    data = client.get(f"/ui/api/hosts/{EXAMPLE_HOST_NAME}").json()
    domains = client.app.state.services.snapshots.domains(EXAMPLE_HOST_NAME)
    rows = {g["name"]: g for g in data["guests"]}
    outsiders = [d.name for d in domains if d.name not in (DEDICATED, SHARED, HOSTILE)]
    assert outsiders and all(rows[name]["kind"] == "unmanaged" and not rows[name]["placed"] for name in outsiders)
    counted = client.app.state.services.check_isolation()[EXAMPLE_HOST_NAME]
    assert data["violations"] == len(data["violation_list"]) == counted > 0
    assert {v["owner"] for v in data["violation_list"]} == {DEDICATED}  # what the fixture's guests may run on
    violated = {int(cpu) for cpu, cell in data["cpus"].items() if cell["violated"]}
    assert violated == set(known.exclusive)
    assert all(set(cell["violated"]) <= set(rows) for cell in data["cpus"].values())
    # colours: one per guest, in map order, each box in its owner's colour and with its short name
    order = sorted(data["guests"], key=lambda g: g["ix"])
    assert [g["colour"] for g in order] == [f"g{i}" for i in range(len(order))]
    for cpu, guest in known.exclusive.items():
        cell = data["cpus"][str(cpu)]
        assert cell["colour"] == rows[guest]["colour"] and cell["label"] == rows[guest]["short"] == guest
    assert rows[HOSTILE]["short"] == "<im…)>" and len(rows[HOSTILE]["short"]) <= 6
    page = client.get(f"/ui/hosts/{EXAMPLE_HOST_NAME}").text
    assert 'class="state s-warning"' in page and 'id="violation-list"' in page


def test_the_fleet_page_gives_units_and_links(web):
    client, _, read, _ = web
    sign_in(client, read)
    client.app.state.services.check_isolation()
    page = client.get("/ui/").text
    assert re.search(r"n0: \d+\.\d GiB", page) and re.search(r"n0: \d+/\d+ cores", page)
    links = [a.get("href") for t, a in elements(page) if t == "a"]
    assert "/ui/plans/1" in links and f"/ui/hosts/{EXAMPLE_HOST_NAME}#violation-list" in links
    assert re.search(r'id="refreshed" data-at="[\d.]+">as of \d\d:\d\d:\d\d UTC<', page)


# ----- memory, units and the model's symbols -----------------------------------------------------------
def _pools(html: str) -> dict[int, dict[int, tuple[int, int, int]]]:
    """node -> page size KiB -> (pages in all, free, free for placing), as the host page lists them."""
    found: dict[int, dict[int, tuple[int, int, int]]] = {}
    node = -1
    for tag, attrs in elements(html):
        if tag == "tr" and "data-node" in attrs:
            node = int(attrs["data-node"])
            found.setdefault(node, {})
        if tag == "span" and attrs.get("class") == "pool":
            found[node][int(attrs["data-size-kib"])] = (int(attrs["data-total"]), int(attrs["data-free"]),
                                                        int(attrs["data-placeable"]))
    return found


def test_the_host_page_lists_each_nodes_hugepage_pools_beside_free_memory(web):
    from vmplacer.core.placement.guest_placement import Placement

    client, _, read, _ = web
    sign_in(client, read)
    container = client.app.state.services.container
    topology = container.hypervisor(EXAMPLE_HOST_NAME).topology()
    path = f"/ui/hosts/{EXAMPLE_HOST_NAME}"
    html = client.get(path).text
    memory = html[html.index('id="memory"'):html.index('id="memory-note"')]
    pools = _pools(memory)
    expected = {n.id: {p.size_kib: (p.total, p.free) for p in n.hugepages if p.size_kib > 4 and p.total}
                for n in topology.nodes.values() if n.memory_kib}
    assert any(expected.values())  # the example host has pools: the table must show them
    assert {n: {size: pool[:2] for size, pool in sizes.items()} for n, sizes in pools.items()} == expected
    assert "2 MiB: " in memory and "1 GiB: " in memory
    note = html[html.index('id="memory-note"'):]
    assert "excludes the hugepage pools" in note.split("</p>")[0]
    fleet = {n["node"]: n["free_mib"] for n in client.get("/ui/api/fleet").json()["rows"][0]["nodes"]}
    shown = {int(a["data-node"]) for t, a in elements(memory) if t == "tr" and "data-node" in a}
    assert shown == set(fleet)  # the same nodes, the same free figure as the fleet's
    for node, free_mib in fleet.items():
        row = memory[memory.index(f'<tr data-node="{node}">'):].split("</tr>")[0]
        assert f'<td class="num free">{free_mib / 1024:.1f} GiB</td>' in row
    assert "excludes hugepage pools" in client.get("/ui/").text  # and the fleet says so too
    # a guest backed by 2 MiB pages on node 0: that pool has 512 fewer pages for placing, small pages are untouched
    node0 = min(expected)
    size, (total, free) = 2048, expected[node0][2048]
    cpu = max(topology.cpus_in_node(node0))
    huge = Placement(guest="huge-1", host=EXAMPLE_HOST_NAME, vcpupin={0: frozenset({cpu})}, memory_kib=1 << 20,
                     memory_nodes=frozenset({node0}), hugepage_kib=size)
    container.placement_store.record(EXAMPLE_HOST_NAME, "test:///default", huge, {"name": "huge-1"})
    client.app.state.services.snapshots.invalidate(EXAMPLE_HOST_NAME)
    after = client.get(path).text
    pools_after = _pools(after[after.index('id="memory"'):after.index('id="memory-note"')])
    assert pools[node0][size][2] == min(total, free)
    assert pools_after[node0][size] == (total, free, min(total - (1 << 20) // size, free))
    fleet_after = {n["node"]: n["free_mib"] for n in client.get("/ui/api/fleet").json()["rows"][0]["nodes"]}
    assert fleet_after == fleet


def test_plan_objective_and_gains_carry_their_unit(web):
    from vmplacer.web.glossary import GAIN_UNIT

    client, _, read, _ = web
    sign_in(client, read)
    page = client.get("/ui/plans/1").text
    assert f"1.500 → 1.750 {GAIN_UNIT}" in page and f"<b>+0.250</b> {GAIN_UNIT}" in page
    unit = page[page.index('id="objective-unit"'):].split("</p>")[0]
    assert "guest-equivalents at full speed" in unit and "fraction of its speed" in unit
    titles = [a["title"] for t, a in elements(page) if t == "abbr"]
    assert any(title.startswith("J = Σ over guests of weight") for title in titles)
    assert any("change of the plan's objective" in title for title in titles)
    assert f"Predicted gain</abbr> ({GAIN_UNIT})" in page


def test_beta_is_explained_where_it_is_shown(web):
    from vmplacer.web.glossary import BETA_TITLE

    client, _, read, _ = web
    sign_in(client, read)
    for path in (f"/ui/hosts/{EXAMPLE_HOST_NAME}/guests/{DEDICATED}", "/ui/model"):
        page = client.get(path).text
        assert "data-beta" in page or 'id="neighbours"' in page  # β is on the page
        assert [a for t, a in elements(page) if t == "abbr" and a.get("title") == BETA_TITLE], path
        legend = page[page.index('id="beta-legend"'):]
        assert "fraction of" in legend.split("</p>")[0].split("</ul>")[0], path
    guest = client.get(f"/ui/hosts/{EXAMPLE_HOST_NAME}/guests/{DEDICATED}").text
    legend = guest[guest.index('id="beta-legend"'):].split("</p>")[0]
    assert "interference model's coefficient" in legend and "time sharing" in legend
