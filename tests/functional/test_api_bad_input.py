"""Every client mistake is a 4xx naming the field and the rule (the real app, SQLite and PostgreSQL).

Hosts: libvirt's built-in test driver ("t"). Refusals must come from the
request schema, before anything reaches libvirt or the database: a NUL in a
VM name used to be a 500 from libvirt's lookupByName.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.functional.test_api_helpers import admin_client


ROOT = Path(__file__).resolve().parents[2]
GUEST = {"name": "g1", "vcpus": 1, "memory_mib": 64, "dry_run": True}


@pytest.fixture
def api(database_url, tmp_path):
    with admin_client(database_url, tmp_path, [{"name": "t", "uri": "test:///default",
                                                         "domain_type": "qemu"}]) as client:
        yield client


def _error(response) -> dict:  # type: ignore[no-untyped-def]
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def _fields(response) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {p["field"]: p["reason"] for p in _error(response)["details"]}


# (method, path, body with the text in one field, the field the refusal must name)
FREE_TEXT_FIELDS = [
    ("POST", "/v1/placements", lambda s: {**GUEST, "name": s}, "name"),
    ("POST", "/v1/placements", lambda s: {**GUEST, "labels": {"env": s}}, "labels.env"),
    ("POST", "/v1/placements", lambda s: {**GUEST, "extra_specs": {"quota:x": s}}, "extra_specs.quota:x"),
    ("POST", "/v1/placements", lambda s: {**GUEST, "affinity": [s]}, "affinity"),
    ("POST", "/v1/profiles", lambda s: {"host": "t", "vms": ["test", s]}, "vms.1"),
    ("POST", "/v1/profiles", lambda s: {"host": "t", "sensitive": s}, "sensitive"),
    ("POST", "/v1/profiles", lambda s: {"host": "t", "scope": [s]}, "scope.0"),
    ("POST", "/v1/profiles", lambda s: {"host": "t", "exclude": [s]}, "exclude.0"),
    ("POST", "/v1/plans", lambda s: {"hosts": ["t"], "scope": [s]}, "scope.0"),
    ("POST", "/v1/plans", lambda s: {"hosts": [s]}, "hosts.0"),
    ("POST", "/v1/reconcile", lambda s: {"hosts": [s]}, "hosts.0"),
    ("PUT", "/v1/hosts/t/maintenance", lambda s: {"reason": s}, "reason"),
    ("POST", "/v1/plans/1/cancel", lambda s: {"reason": s}, "reason"),
]
CONTROL_TEXTS = {"nul": "a\u0000b", "newline": "a\nb", "escape": "\u001b[31m", "delete": "a\u007f",
                 "c1": "a\u0085b", "surrogate": "a\ud800b"}


@pytest.mark.parametrize("kind", sorted(CONTROL_TEXTS))
def test_control_characters_are_refused_in_every_free_text_field(api, kind):
    text = CONTROL_TEXTS[kind]
    for method, path, body, field in FREE_TEXT_FIELDS:
        # ASCII JSON: a lone surrogate travels as its \\u escape, as a hostile client would send it
        response = api.request(method, path, content=json.dumps(body(text)),
                               headers={"Content-Type": "application/json"})
        assert response.status_code == 422, (path, field, response.text)
        fields = _fields(response)
        assert field in fields, (path, field, fields)
        assert _error(response)["code"] == "validation"
    # nothing was written on the way: no maintenance, no audit entry but the token's own
    assert api.get("/v1/hosts").json()["hosts"][0]["maintenance"] is None
    assert {e["action"] for e in api.get("/v1/audit").json()["entries"]} == {"token-create"}


def test_refusals_name_the_rule(api):
    response = api.post("/v1/profiles", json={"host": "t", "vms": ["a\u0000b"]})
    reason = _fields(response)["vms.0"]
    assert "U+0000 at position 1" in reason and "control characters" in reason and "libvirt domain name" in reason
    reason = _fields(api.put("/v1/hosts/t/maintenance", json={"reason": "kernel\nupdate"}))["reason"]
    assert "U+000A at position 6" in reason and "control characters" in reason
    labels = _fields(api.post("/v1/placements", json={**GUEST, "labels": {"env": "a\u0085"}}))["labels.env"]
    assert "U+0085" in labels  # labels and reasons: one rule, one wording
    assert labels.split(" is not allowed: ")[1] == reason.split(" is not allowed: ")[1]


def test_vm_names_follow_libvirts_rules(api):
    for bad, rule in (("a/b", "'/'"), ("é" * 126, "252 bytes"), ("", "")):
        response = api.post("/v1/profiles", json={"host": "t", "vms": [bad]})
        assert response.status_code == 422, bad
        assert rule in _fields(response)["vms.0"], _fields(response)
    longest = "é" * 125 + "x"  # 251 bytes: a valid name, just not of a domain on this host
    response = api.post("/v1/profiles", json={"host": "t", "vms": [longest]})
    assert response.status_code == 422 and "not on host t" in _fields(response)["vms"]


def test_invalid_json_says_line_and_column(api):
    body = b'{"host": "t",\n  "vms": [test]}'
    response = api.post("/v1/profiles", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    error = _error(response)
    assert error["code"] == "invalid-json"
    assert "line 2, column 11" in error["message"] and "field 2" not in error["message"]
    detail = error["details"][0]
    assert (detail["field"], detail["line"], detail["column"]) == ("body", 2, 11)
    not_utf8 = api.post("/v1/profiles", content=b'{"host": "\xff"}', headers={"Content-Type": "application/json"})
    assert not_utf8.status_code == 422 and _error(not_utf8)["code"] == "invalid-json"


def test_no_host_left_is_503_with_retry_after(api):
    assert api.put("/v1/hosts/t/maintenance", json={"reason": "firmware"}).status_code == 200
    response = api.post("/v1/placements", json=GUEST)
    assert response.status_code == 503
    assert _error(response)["code"] == "no-hosts" and "firmware" in _error(response)["message"]
    assert int(response.headers["retry-after"]) > 0


# ----- the one table of error codes -------------------------------------------------------------------


def _documented() -> set[tuple[str, str]]:
    docs = (ROOT / "docs" / "api.md").read_text()
    table = docs[docs.index("| status | code | when |"):]
    table = table[:table.index("\n\n")]
    pairs = set()
    for line in table.splitlines()[2:]:
        status, codes = (cell.strip() for cell in line.strip("|").split("|")[:2])
        for code in re.findall(r"`([a-z-]+)`", codes):
            pairs.add((status, code))
    return pairs


def _raised() -> set[tuple[str, str]]:
    """(status, code) of every error the API code can answer with, read from its source:
    `ApiError(409, "busy", ...)`, `error_response(...)`, the idempotency answers, one
    conditional form (`ApiError(422 if bad else 409, "validation" if bad else "conflict")`),
    the framework statuses' names, and the body-size refusals."""
    found = set()
    plain = re.compile(r'(?:ApiError|error_response|_json)\(\s*(\d{3})\s*,\s*"([a-z-]+)"')
    either = re.compile(r'ApiError\((\d{3}) if [^,]+ else (\d{3}),\s*"([a-z-]+)" if [^,]+ else "([a-z-]+)"')
    for path in (ROOT / "vmplacer" / "api").rglob("*.py"):
        text = path.read_text()
        found |= set(plain.findall(text))
        for status_a, status_b, code_a, code_b in either.findall(text):
            found |= {(status_a, code_a), (status_b, code_b)}
        mapping = re.search(r"codes = \{([^}]*)\}", text)
        if mapping:
            found |= set(re.findall(r'(\d{3}): "([a-z-]+)"', mapping.group(1)))
    limits = (ROOT / "vmplacer" / "api" / "limits.py").read_text()
    assert '"code": "too-large"' in limits and '"code": "bad-request"' in limits
    return found | {("413", "too-large"), ("400", "bad-request")}


def test_every_error_code_is_in_the_one_table():
    raised, documented = _raised(), _documented()
    assert len(raised) >= 20  # the scan still finds the calls
    assert raised - documented == set(), f"docs/api.md's error table misses {sorted(raised - documented)}"
    assert ("503", "no-hosts") in documented


@pytest.mark.parametrize(("code", "status", "answer"), [
    ("VIR_ERR_RPC", 503, "host-unavailable"),  # the daemon hiccuped
    ("VIR_ERR_INTERNAL_ERROR", 502, "host-error"),  # the host failed; the same request fails again
])
def test_libvirt_failures_are_told_apart_by_code(api, monkeypatch, code, status, answer):
    import libvirt

    def failing(_connection, *_args):  # type: ignore[no-untyped-def]
        exc = libvirt.libvirtError("listing failed")
        exc.err = (getattr(libvirt, code), libvirt.VIR_FROM_RPC, "listing failed", 2, None, None, None, 0, 0)
        raise exc

    monkeypatch.setattr(libvirt.virConnect, "listAllDomains", failing)
    api.app.state.services.snapshots.invalidate("t")  # what the server's refresher read before the failure
    response = api.post("/v1/placements", json={**GUEST, "host": "t"})
    assert response.status_code == status, response.text
    error = _error(response)
    assert error["code"] == answer and error["details"][0]["host"] == "t"
    assert ("retry-after" in response.headers) == (status == 503)
