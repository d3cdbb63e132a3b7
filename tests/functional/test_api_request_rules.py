"""Request rules at the API edge (the real app, SQLite and PostgreSQL): JSON without NaN or
Infinity, profiles readable under any libvirt domain name, and the configured number of
request threads in force."""

from __future__ import annotations

import time
import warnings
from urllib.parse import quote

import pytest

from tests.functional.test_api_helpers import make_container, roomy_test_driver

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from vmplacer.adapters.db.api import SqlTokenStore
from vmplacer.adapters.db.profiles import SqlProfileStore
from vmplacer.api.app import create_app
from vmplacer.api.services import ApiOptions
from vmplacer.ports import Neighbour, ProfileSample

GUEST = {"name": "g1", "vcpus": 1, "memory_mib": 64, "dry_run": True}
THREADS = 7  # not anyio's default (40): the setting must be what runs


@pytest.fixture
def api(database_url, tmp_path):
    with roomy_test_driver():
        yield from _api(database_url, tmp_path)


def _api(database_url, tmp_path):  # type: ignore[no-untyped-def]
    container = make_container(database_url, tmp_path, [{"name": "t", "uri": "test:///default",
                                                         "domain_type": "qemu"}])
    admin = SqlTokenStore(container.sessions).create("ops", "admin")
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False, request_threads=THREADS))
    with TestClient(app, raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {admin}"
        yield client, container
    container.close()


def _error(response) -> dict:  # type: ignore[no-untyped-def]
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused_naming_the_field(api, token):
    client, _ = api
    for body, field in (
        (f'{{"name": "g1", "vcpus": 1, "memory_mib": 64, "dry_run": true, "labels": {{"weight": {token}}}}}',
         "labels.weight"),
        (f'{{"name": "g1", "vcpus": 1, "memory_mib": {token}, "dry_run": true}}', "memory_mib"),
        (f'{{"host": "t", "vms": ["test"], "t_m_ms": {token}}}', "t_m_ms"),
    ):
        path = "/v1/profiles" if "vms" in body else "/v1/placements"
        response = client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 422, response.text
        error = _error(response)
        assert error["code"] == "validation"
        assert [d["field"] for d in error["details"]] == [field], error
        assert token in error["details"][0]["reason"] and "not a JSON number" in error["details"][0]["reason"]
        assert f"field {field}" in error["message"]
    two = client.post("/v1/placements", content='{"name": "g1", "vcpus": 1, "memory_mib": 64, "dry_run": true, '
                      '"labels": {"a": NaN, "b": Infinity}}', headers={"Content-Type": "application/json"})
    assert [d["field"] for d in _error(two)["details"]] == ["labels.a", "labels.b"]


def test_finite_numbers_and_broken_json_are_as_before(api):
    client, _ = api
    assert client.post("/v1/placements", json={**GUEST, "labels": {"weight": 1.5}}).status_code == 200
    broken = client.post("/v1/placements", content=b'{"name": NaNa}', headers={"Content-Type": "application/json"})
    assert broken.status_code == 422 and _error(broken)["code"] == "invalid-json"


def _store_profile(container, guest: str) -> int:  # type: ignore[no-untyped-def]
    store = SqlProfileStore(container.sessions)
    run = store.start_run("t", "ipc", {})
    now = time.time()
    store.add_samples(run, [ProfileSample(guest, kind, "ipc", value, 0.1, 5.0, now)
                            for kind, value in (("zeta", 1.0), ("zeta_b", 1.2), ("zeta", 0.9), ("zeta_b", 1.1))])
    store.finish_run(run, {})
    return run


def test_profiles_are_read_under_any_libvirt_domain_name(api):
    client, container = api
    name = "web server (é) #1+x"  # spaces, parentheses, '#', non-ASCII: a valid libvirt name
    run = _store_profile(container, name)
    response = client.get(f"/v1/profiles/{quote(name, safe='')}")
    assert response.status_code == 200, response.text
    assert response.json()["guest"] == name and response.json()["run"]["id"] == run
    for bad, rule in (("a\u0001b", "U+0001"), ("é" * 126, "252 bytes")):
        refused = client.get(f"/v1/profiles/{quote(bad, safe='')}")
        assert refused.status_code == 422, refused.text
        assert any(rule in d["reason"] and "libvirt domain name" in d["reason"] for d in _error(refused)["details"])
    assert client.get(f"/v1/profiles/{quote('nobody here', safe='')}").status_code == 404


def test_a_stored_profile_says_what_each_probed_neighbour_alone_costs(api):
    client, container = api
    store = SqlProfileStore(container.sessions)
    run = store.start_run("t", "ipc", {"pair_probes": 1})
    now = time.time()
    both = (Neighbour("noisy", "same-core", True), Neighbour("quiet", "same-llc", True))
    store.add_samples(run, [
        ProfileSample("web", "zeta", "ipc", 0.5, 0.1, 5.0, now),
        ProfileSample("web", "zeta_b", "ipc", 1.0, 0.1, 5.0, now + 1, both),
        ProfileSample("web", "zeta_p", "ipc", 0.7, 0.1, 5.0, now + 2,
                      (Neighbour("noisy", "same-core", False), Neighbour("quiet", "same-llc", True))),
        ProfileSample("web", "zeta_p", "ipc", 0.95, 0.1, 5.0, now + 3,
                      (Neighbour("noisy", "same-core", True), Neighbour("quiet", "same-llc", False))),
    ])
    store.finish_run(run, {})
    pairs = client.get("/v1/profiles/web").json()["profile"]["pairs"]
    assert [(p["neighbour"], p["distance"], p["n"]) for p in pairs] == [("noisy", "same-core", 1),
                                                                      ("quiet", "same-llc", 1)]
    assert [round(p["degradation"]["estimate"], 3) for p in pairs] == [0.3, 0.05]


def test_request_threads_setting_is_in_force(api):
    client, _ = api
    from anyio.to_thread import current_default_thread_limiter

    assert client.portal.call(lambda: current_default_thread_limiter().total_tokens) == THREADS
