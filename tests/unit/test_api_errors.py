"""One error shape: `details` always a list of {field, rule, reason, ...}, the request's id in it."""

from __future__ import annotations

import asyncio

from vmplacer.api.errors import ErrorBody, error_body, problems
from vmplacer.api.request_id import RequestIdMiddleware, chosen_id, current_request_id


def test_every_kind_of_details_becomes_a_list_of_problems():
    assert problems(None, "unauthorized", "no token") == []
    assert problems({"host": "h1", "job": "j"}, "busy", "host h1 is busy") == [
        {"field": None, "rule": "busy", "reason": "host h1 is busy", "host": "h1", "job": "j"}]
    assert problems({"guest": "g", "host": "h1", "field": "base_xml"}, "exists", "taken") == [
        {"field": "base_xml", "rule": "exists", "reason": "taken", "guest": "g", "host": "h1"}]
    assert problems([{"field": "vcpus", "reason": "too many"}, {"field": "name", "rule": "pattern", "reason": "bad"}],
                    "validation", "two problems") == [
        {"field": "vcpus", "rule": "validation", "reason": "too many"},
        {"field": "name", "rule": "pattern", "reason": "bad"}]
    assert problems(["plain text"], "conflict", "lost a race") == [
        {"field": None, "rule": "conflict", "reason": "plain text"}]


def test_an_error_body_matches_its_schema_and_names_the_request():
    body = error_body("no-fit", "guest g does not fit", {"guest": "g", "host": "h1", "reasons": []})
    parsed = ErrorBody.model_validate(body)
    assert parsed.error.details.root[0].field is None and parsed.error.details.root[0].rule == "no-fit"
    assert body["error"]["request_id"] and body["error"]["details"][0]["reasons"] == []


def test_a_callers_request_id_is_kept_only_when_safe_to_repeat():
    assert chosen_id([(b"x-request-id", b"orchestrator:7.a_b-c")]) == "orchestrator:7.a_b-c"
    for bad in (b"", b"has space", b"x" * 129, b"semi;colon", "é".encode("latin-1"), b"line\nbreak"):
        made = chosen_id([(b"x-request-id", bad)])
        assert made != bad.decode("latin-1") and len(made) == 32, bad
    assert chosen_id([]) != chosen_id([])


def test_the_middleware_sets_the_header_once_and_the_id_for_errors_below():
    seen: list[str] = []
    sent: list[dict] = []

    async def app(_scope, _receive, send):  # type: ignore[no-untyped-def]
        seen.append(current_request_id())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-request-id", b"inner")]})
        await send({"type": "http.response.body", "body": b""})

    async def send(message):  # type: ignore[no-untyped-def]
        sent.append(message)

    scope = {"type": "http", "headers": [(b"x-request-id", b"abc-1")]}
    asyncio.run(RequestIdMiddleware(app)(scope, None, send))
    assert seen == ["abc-1"]
    assert [v for k, v in sent[0]["headers"] if k == b"x-request-id"] == [b"abc-1"]
