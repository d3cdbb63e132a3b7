"""Finding a guest from any page's header (/ui/search), and returning to the page that asked
for a sign-in: in-process against the real application over a real SQLite database, the
guests recorded on the built-in example host (one of them named with hostile markup)."""

from __future__ import annotations

from urllib.parse import parse_qs, quote, urlencode, urlsplit

import pytest

from tests.functional.test_web_view import SITE, elements, sign_in, web  # noqa: F401 - `web` is a fixture
from tests.functional.web_support import DEDICATED, HOSTILE, SHARED
from vmplacer.config import EXAMPLE_HOST_NAME
from vmplacer.web import search
from vmplacer.web.return_to import MAX_NEXT


def _results(html: str) -> list[tuple[str, str]]:
    return [(a["data-guest"], a["data-host"]) for t, a in elements(html) if t == "tr" and "data-guest" in a]


def _guest_href(host: str, guest: str) -> str:
    return f"/ui/hosts/{quote(host, safe='')}/guests/{quote(guest, safe='')}"


# ----- the search -----------------------------------------------------------------------------------
def test_every_page_header_holds_a_get_search_form(web):  # noqa: F811
    client, _, read, _ = web
    sign_in(client, read)
    for path in ("/ui/", f"/ui/hosts/{EXAMPLE_HOST_NAME}", "/ui/plans", "/ui/model", "/ui/search?q=x"):
        forms = [a for t, a in elements(client.get(path).text) if t == "form" and a.get("action") == "/ui/search"]
        assert len(forms) == 1 and forms[0]["method"] == "get", path
        inputs = [a for t, a in elements(client.get(path).text) if t == "input" and a.get("id") == "search-q"]
        assert inputs[0]["name"] == "q" and inputs[0]["maxlength"] == str(search.MAX_QUERY)
    assert "search-q" not in client.get("/ui/login").text  # signed in only


def test_a_name_substring_finds_guests_in_any_case_with_links_to_guest_and_host(web):  # noqa: F811
    client, _, read, _ = web
    sign_in(client, read)
    page = client.get("/ui/search", params={"q": "  DB-  "})
    assert page.status_code == 200
    assert _results(page.text) == [(DEDICATED, EXAMPLE_HOST_NAME)]
    links = [a["href"] for t, a in elements(page.text) if t == "a" and a.get("class") in ("guest", "host")]
    assert links == [_guest_href(EXAMPLE_HOST_NAME, DEDICATED), f"/ui/hosts/{EXAMPLE_HOST_NAME}"]
    for link in links:  # both lead to a page
        assert client.get(link).status_code == 200
    assert "1 guest(s) whose name holds" in page.text
    both = _results(client.get("/ui/search?q=-1").text)
    assert both == sorted([(DEDICATED, EXAMPLE_HOST_NAME), (SHARED, EXAMPLE_HOST_NAME)])
    assert 'value="DB-"' in page.text  # the header's box keeps the query


def test_the_query_is_matched_literally_and_rendered_as_text(web):  # noqa: F811
    client, _, read, _ = web
    sign_in(client, read)
    every = {DEDICATED, SHARED, HOSTILE}
    # what a LIKE pattern or a regular expression would read as "anything": no name holds them
    for wildcard in ("%", "_", ".", ".*", "[a-z]", "*", "\\", "'; --", "%' OR '1'='1"):
        page = client.get("/ui/search", params={"q": wildcard})
        assert page.status_code == 200 and _results(page.text) == [], wildcard
        assert "0 guest(s) whose name holds" in page.text
    markup = client.get("/ui/search", params={"q": "<img src=x"})
    assert [g for g, _ in _results(markup.text)] == [HOSTILE]
    assert HOSTILE not in markup.text and "<img src=x" not in markup.text
    assert not [t for t, _ in elements(markup.text) if t == "img"]
    assert "&lt;img src=x onerror=alert(1)&gt;" in markup.text
    assert _guest_href(EXAMPLE_HOST_NAME, HOSTILE) in [a.get("href") for t, a in elements(markup.text) if t == "a"]
    script = client.get("/ui/search", params={"q": '"><script>alert(1)</script>'})
    assert script.status_code == 200 and "<script>alert" not in script.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in script.text
    assert {g for g, _ in _results(client.get("/ui/search?q=E").text)} == {g for g in every if "e" in g}


@pytest.mark.parametrize("query, says", [
    ("", "type part of a guest's name"), ("q=", "type part of a guest's name"), ("q=%20%20", "type part of a guest's name"),
    ("q=" + "a" * (search.MAX_QUERY + 1), f"at most {search.MAX_QUERY} characters (this one has {search.MAX_QUERY + 1})"),
    ("q=a%01b", "no control characters"), ("q=a%7Fb", "no control characters"), ("q=a&q=b", "given more than once"),
])
def test_an_empty_or_bad_query_answers_a_page_saying_so(web, query, says):  # noqa: F811
    client, _, read, _ = web
    sign_in(client, read)
    page = client.get(f"/ui/search?{query}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    problems = [a for t, a in elements(page.text) if a.get("id") == "search-problem"]
    assert problems and f"field q: {says}" in page.text.replace("&#39;", "'")
    assert _results(page.text) == []


def test_a_query_of_the_longest_length_is_searched(web):  # noqa: F811
    client, _, read, _ = web
    sign_in(client, read)
    page = client.get("/ui/search", params={"q": "b" * search.MAX_QUERY})
    assert page.status_code == 200 and 'id="search-problem"' not in page.text and "0 guest(s)" in page.text


def test_matches_are_bounded_and_the_page_says_how_many_more(web, monkeypatch):  # noqa: F811
    client, _, read, _ = web
    sign_in(client, read)
    monkeypatch.setattr(search, "SHOWN", 2)
    page = client.get("/ui/search?q=1")  # db-1, web-1 and the hostile name's "(1)"
    shown = _results(page.text)
    assert shown == sorted([(HOSTILE, EXAMPLE_HOST_NAME), (DEDICATED, EXAMPLE_HOST_NAME),
                            (SHARED, EXAMPLE_HOST_NAME)])[:2]
    assert "3 guest(s) whose name holds" in page.text and "the first 2 by name are listed, 1 more match" in page.text


def test_the_search_finds_a_guest_recorded_after_the_page_was_first_served(web):  # noqa: F811
    from vmplacer.core.placement.guest_placement import Placement

    client, _, read, _ = web
    sign_in(client, read)
    assert _results(client.get("/ui/search?q=late").text) == []
    container = client.app.state.services.container
    topology = container.hypervisor(EXAMPLE_HOST_NAME).topology()
    cpu = max(topology.cpus)
    late = Placement(guest="Late-Comer", host=EXAMPLE_HOST_NAME, vcpupin={0: frozenset({cpu})}, memory_kib=1 << 20)
    container.placement_store.record(EXAMPLE_HOST_NAME, "test:///default", late, {"name": "Late-Comer"})
    client.app.state.services.snapshots.invalidate(EXAMPLE_HOST_NAME)  # what the API's writes do
    assert _results(client.get("/ui/search?q=LATE-c").text) == [("Late-Comer", EXAMPLE_HOST_NAME)]


# ----- back to the page asked for after signing in --------------------------------------------------
def _login_next(client, path: str) -> str:  # type: ignore[no-untyped-def]
    """The `next` the login page's form carries for the page `path` ("" for none)."""
    location = client.get(path).headers["location"]
    form = client.get(location).text
    hidden = [a for t, a in elements(form) if t == "input" and a.get("name") == "next"]
    return hidden[0]["value"] if hidden else ""


@pytest.mark.parametrize("path", [
    f"/ui/hosts/{EXAMPLE_HOST_NAME}", "/ui/?q=ex&sort=guests", "/ui/plans/1", "/ui/search?q=db",
    _guest_href(EXAMPLE_HOST_NAME, HOSTILE),
])
def test_signing_in_returns_to_the_page_that_asked(web, path):  # noqa: F811
    client, _, read, _ = web
    asked = client.get(path)
    assert asked.status_code == 303
    assert parse_qs(urlsplit(asked.headers["location"]).query) == {"next": [path]}
    carried = _login_next(client, path)
    assert carried == path
    answer = client.post("/ui/login", data={"token": read, "next": carried})
    assert answer.status_code == 303 and answer.headers["location"] == path
    assert client.get(path).status_code == 200  # signed in: the page itself


OPEN_REDIRECTS = [
    "https://evil.example/ui/", "//evil.example/ui/", "/ui//evil.example", "/\\evil.example", "/ui/\\\\evil.example",
    "\\\\evil.example/ui/", "/ui/../../elsewhere", "/ui/./", "javascript:alert(1)", "http:/ui/", "/ui/#x",
    "/uix", "/ui", "/v1/plans", "/ui/api/fleet", "/ui/static/ui.js", "/ui/login", "/ui/logout", "/ui/login?next=/ui/",
    "/ui/%2F..%2F..%2Fv1", "/ui/%5cevil.example", "/ui/%2e%2e/v1", "/ui/\x00", "/ui/\nLocation: https://evil.example",
    "/ui/é", "/ui/" + "a" * MAX_NEXT, "",
]


@pytest.mark.parametrize("target", OPEN_REDIRECTS)
def test_a_next_that_is_not_a_page_of_the_view_is_ignored(web, target):  # noqa: F811
    client, _, read, _ = web
    form = client.get("/ui/login?" + urlencode({"next": target}))
    assert form.status_code == 200
    assert not [a for t, a in elements(form.text) if t == "input" and a.get("name") == "next"]
    answer = client.post("/ui/login", data={"token": read, "next": target})
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/"  # the fleet, never elsewhere


def test_a_refused_sign_in_keeps_the_page_to_return_to(web):  # noqa: F811
    client, _, read, _ = web
    path = f"/ui/hosts/{EXAMPLE_HOST_NAME}"
    refused = client.post("/ui/login", data={"token": "vmp_guessed", "next": path})
    assert refused.status_code == 401
    assert [a["value"] for t, a in elements(refused.text) if t == "input" and a.get("name") == "next"] == [path]
    answer = client.post("/ui/login", data={"token": read, "next": path}, headers={"Origin": SITE})
    assert answer.headers["location"] == path
