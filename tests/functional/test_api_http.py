"""The REST API over real HTTP: `vmplacer serve` in a subprocess, on SQLite and PostgreSQL.

Hosts: libvirt's built-in test driver ("t", whose memory is full, so every
placement there is a NoFit: nothing changes) and a host whose libvirtd is not
there ("down", a closed port on loopback).
"""

from __future__ import annotations

import concurrent.futures
import json
import threading

import httpx
import pytest

from tests.functional.test_api_helpers import (
    Server,
    free_port,
    scratch_database,
    vmplacer,
    wait_job,
    write_config,
)

LIMIT = 64 * 1024


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"api-{request.param}")
    with scratch_database(request.param, directory) as url:
        config = write_config(directory, url, [
            {"name": "t", "uri": "test:///default", "domain_type": "qemu"},
            {"name": "down", "uri": f"qemu+tcp://127.0.0.1:{free_port()}/system"},
        ], max_request_bytes=LIMIT)
        instance = Server(config, directory, instance=f"http-{request.param}").start()
        try:
            yield instance
        finally:
            code = instance.stop()
            # SIGTERM: graceful shutdown, then uvicorn re-raises the signal (systemd: a clean exit)
            assert code in (0, -15), instance.log()
            assert "Application shutdown complete" in instance.log()


@pytest.fixture
def api(server):
    with server.client() as client:
        yield client


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"code", "message", "details"} <= set(body["error"])
    return body["error"]


def test_openapi_document_lists_the_routes_and_bearer_auth(server, api):
    assert httpx.get(f"{server.url}/openapi.json").status_code == 401
    document = api.get("/openapi.json").json()
    assert document["openapi"].startswith("3.")
    for path in ("/v1/hosts", "/v1/hosts/{host}/topology", "/v1/placements", "/v1/placements/{guest}",
                 "/v1/profiles", "/v1/profiles/{guest}", "/v1/jobs/{job_id}", "/v1/audit", "/readyz",
                 "/metrics", "/healthz"):
        assert path in document["paths"], path
    schemes = document["components"]["securitySchemes"]
    assert any(s.get("scheme") == "bearer" for s in schemes.values())
    assert document["paths"]["/healthz"]["get"]["security"] == []


def test_hosts_and_topology(api):
    hosts = {h["name"]: h for h in api.get("/v1/hosts").json()["hosts"]}
    assert hosts["t"]["reachable"] is True and hosts["t"]["driver"] == "TEST"
    assert hosts["down"]["reachable"] is False and "host down" in hosts["down"]["error"]
    topology = api.get("/v1/hosts/t/topology").json()
    assert topology["name"] == "t"
    assert len(topology["nodes"]) == 2
    missing = api.get("/v1/hosts/nowhere/topology")
    assert missing.status_code == 404 and "nowhere" in _error(missing)["message"]


def test_validation_errors_name_every_field(api):
    response = api.post("/v1/placements", json={"name": "g1", "vcpus": "4", "memory_mib": 0,
                                                 "cpu_policy": "dedicatd", "dry_run": True})
    assert response.status_code == 422
    fields = {p["field"] for p in _error(response)["details"]}
    assert {"vcpus", "memory_mib", "cpu_policy"} <= fields
    # a rule only the guest spec knows, through an OpenStack extra spec
    response = api.post("/v1/placements", json={
        "name": "g1", "vcpus": 2, "memory_mib": 64, "cpu_policy": "shared",
        "extra_specs": {"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": "sometimes"}, "dry_run": True})
    assert response.status_code == 422
    error = _error(response)
    fields = {p["field"] for p in error["details"]}
    assert "extra_specs.hw:cpu_policy" in fields and "thread_policy" in fields
    assert "guest g1" in error["message"]
    unknown = api.post("/v1/placements", json={"name": "g1", "vcpus": 1, "memory_mib": 64, "colour": "red",
                                               "dry_run": True})
    assert unknown.status_code == 422 and _error(unknown)["details"][0]["field"] == "colour"
    start_without_define = api.post("/v1/placements", json={"name": "g1", "vcpus": 1, "memory_mib": 64,
                                                            "define": False, "start": True})
    assert start_without_define.status_code == 422
    assert _error(start_without_define)["details"][0]["field"] == "start"
    bad_host = api.post("/v1/placements", json={"name": "g1", "vcpus": 1, "memory_mib": 64, "host": "elsewhere"})
    assert bad_host.status_code == 422 and _error(bad_host)["details"][0]["field"] == "host"


def test_no_fit_is_409_with_every_reason(api):
    response = api.post("/v1/placements", json={"name": "big", "vcpus": 2, "memory_mib": 512,
                                                 "cpu_policy": "dedicated", "host": "t", "dry_run": True})
    assert response.status_code == 409
    error = _error(response)
    assert error["code"] == "no-fit"
    [detail] = error["details"]
    assert detail["guest"] == "big" and detail["host"] == "t" and detail["rule"] == "no-fit"
    reasons = detail["reasons"]
    assert reasons and all({"constraint", "where", "need", "have"} <= set(r) for r in reasons)
    assert any(r["constraint"] == "memory" for r in reasons)
    # a real placement on the same host: also refused, nothing recorded
    placed = api.post("/v1/placements", json={"name": "big", "vcpus": 2, "memory_mib": 512, "host": "t"})
    assert placed.status_code == 409
    assert api.get("/v1/placements/big").status_code == 404


def test_unreachable_host_is_503_naming_it(api):
    response = api.post("/v1/placements", json={"name": "g2", "vcpus": 1, "memory_mib": 64, "host": "down",
                                                 "dry_run": True})
    assert response.status_code == 503
    error = _error(response)
    assert error["code"] == "host-unavailable" and error["details"][0]["host"] == "down"
    assert "host down" in error["message"]
    assert response.headers["retry-after"]
    # without a host: both tried, one full, one down -> 409 listing both
    response = api.post("/v1/placements", json={"name": "g2", "vcpus": 1, "memory_mib": 64, "dry_run": True})
    assert response.status_code == 409
    candidates = {c["host"]: c for c in _error(response)["details"][0]["candidates"]}
    assert candidates["t"]["reasons"] and "cannot connect" in candidates["down"]["error"]
    ready = api.get("/readyz")
    assert ready.status_code == 503
    checks = {c["name"]: c for c in ready.json()["checks"]}
    assert checks["database"]["ok"] is True
    assert checks["host t"]["ok"] is True
    assert checks["host down"]["ok"] is False and "down" in checks["host down"]["detail"]
    assert api.get("/v1/hosts/down/topology").status_code == 503


def test_request_body_limit_is_413(server, api):
    padding = "x" * (LIMIT + 1)
    response = api.post("/v1/placements", json={"name": "g3", "vcpus": 1, "memory_mib": 64,
                                                 "base_xml": padding})
    assert response.status_code == 413 and _error(response)["code"] == "too-large"

    def chunks():
        yield b'{"name": "g3", "vcpus": 1, "memory_mib": 64, "labels": {"pad": "'
        for _ in range(LIMIT // 1024 + 2):
            yield b"y" * 1024
        yield b'"}}'

    streamed = api.post("/v1/placements", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413
    # also with an Idempotency-Key (that middleware reads the body itself)
    keyed = api.post("/v1/placements", content=chunks(),
                     headers={"Content-Type": "application/json", "Idempotency-Key": "big-1"})
    assert keyed.status_code == 413
    # one answer, whether the size was declared or counted while streaming
    assert "content-length" in response.request.headers and "content-length" not in streamed.request.headers
    bodies = [_error(answer) for answer in (response, streamed, keyed)]
    assert len({body.pop("request_id") for body in bodies}) == 3  # each answer names its own request
    assert bodies[0] == bodies[1] == bodies[2]
    assert bodies[0]["details"] == [{"field": "body", "rule": "too-large", "reason": bodies[0]["message"],
                                     "limit": LIMIT}]


def test_caller_xml_cannot_inject(api):
    doctype = ("<?xml version='1.0'?><!DOCTYPE d [<!ENTITY x SYSTEM 'file:///etc/shadow'>]>"
               "<domain type='qemu'><name>&x;</name></domain>")
    response = api.post("/v1/placements", json={"name": "g4", "vcpus": 1, "memory_mib": 64, "host": "t",
                                                 "dry_run": True, "base_xml": doctype})
    assert response.status_code == 422
    assert _error(response)["details"][0]["field"] == "base_xml"
    commandline = ("<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>"
                   "<name>g4</name><qemu:commandline><qemu:arg value='-monitor'/></qemu:commandline></domain>")
    response = api.post("/v1/placements", json={"name": "g4", "vcpus": 1, "memory_mib": 64, "host": "t",
                                                 "dry_run": True, "base_xml": commandline})
    assert response.status_code == 422 and "commandline" in _error(response)["message"]
    for name in ("g4</name><devices>", "../etc", "a b", "-rf", "$(reboot)"):
        response = api.post("/v1/placements", json={"name": name, "vcpus": 1, "memory_mib": 64, "dry_run": True})
        assert response.status_code == 422, name
        assert any(p["field"] == "name" for p in _error(response)["details"])


def test_idempotency_key_replays_the_first_answer(api):
    body = {"name": "idem", "vcpus": 1, "memory_mib": 64, "host": "t"}
    first = api.post("/v1/placements", json=body, headers={"Idempotency-Key": "place-idem-1"})
    again = api.post("/v1/placements", json=body, headers={"Idempotency-Key": "place-idem-1"})
    assert first.status_code == again.status_code == 409
    assert again.json() == first.json()
    assert again.headers.get("idempotent-replayed") == "true"
    assert "idempotent-replayed" not in first.headers
    other = api.post("/v1/placements", json={**body, "vcpus": 2}, headers={"Idempotency-Key": "place-idem-1"})
    assert other.status_code == 422
    assert _error(other)["code"] == "idempotency-key-reused"
    assert _error(other)["details"][0]["field"] == "Idempotency-Key"
    bad = api.post("/v1/placements", json=body, headers={"Idempotency-Key": "has space"})
    assert bad.status_code == 422


def test_a_recreated_token_of_the_same_name_never_replays_the_old_ones_answers(server):
    body = {"name": "idem-rotated", "vcpus": 1, "memory_mib": 64, "host": "t"}
    key = {"Idempotency-Key": "rotated-1"}
    with server.client(server.create_token("rotated", "admin")) as old:
        first = old.post("/v1/placements", json=body, headers=key)
        assert old.post("/v1/placements", json=body, headers=key).headers.get("idempotent-replayed") == "true"
    vmplacer(server.config, "token", "revoke", "rotated", "--yes")
    with server.client(server.create_token("rotated", "admin")) as new:
        again = new.post("/v1/placements", json=body, headers=key)
    assert again.status_code == first.status_code
    assert "idempotent-replayed" not in again.headers  # served anew: keys belong to the token, not its name


def test_a_replay_is_the_same_json_in_any_key_order(api):
    first = api.post("/v1/plans", content=b'{"hosts": ["t"], "max_actions": 2}',
                     headers={"Content-Type": "application/json", "Idempotency-Key": "plan-order-1"})
    assert first.status_code == 201, first.text
    reordered = api.post("/v1/plans", content=b'{\n  "max_actions":2,\n  "hosts":[ "t" ]\n}',
                         headers={"Content-Type": "application/json", "Idempotency-Key": "plan-order-1"})
    assert reordered.status_code == 201 and reordered.headers["idempotent-replayed"] == "true"
    assert reordered.json() == first.json()  # the same plan, not a second one
    assert reordered.headers["location"] == first.headers["location"] == f"/v1/plans/{first.json()['id']}"
    other = api.post("/v1/plans", json={"hosts": ["t"], "max_actions": 3}, headers={"Idempotency-Key": "plan-order-1"})
    assert other.status_code == 422 and _error(other)["code"] == "idempotency-key-reused"


def test_profile_job_runs_in_the_background_once_per_key(server, api):
    body = {"host": "t", "duration_s": 1.5, "t_sleep_s": 0.2, "t_m_ms": 5}
    barrier = threading.Barrier(4)

    def post(_: int) -> httpx.Response:
        barrier.wait()  # all four in flight together
        return api.post("/v1/profiles", json=body, headers={"Idempotency-Key": "profile-t-1"})

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(post, range(4)))
    # the duplicates wait for the first answer: every one is that answer, headers included
    assert [a.status_code for a in answers] == [202] * 4, [a.text for a in answers]
    job_id = answers[0].json()["job"]["id"]
    assert {a.json()["job"]["id"] for a in answers} == {job_id}  # one job
    assert [a.headers["location"] for a in answers] == [f"/v1/jobs/{job_id}"] * 4
    assert sorted(a.headers.get("idempotent-replayed", "") for a in answers) == ["", "true", "true", "true"]
    assert answers[0].json()["job"]["status"] == "queued"  # answered at once; the work runs later
    busy = api.post("/v1/profiles", json=body)
    assert busy.status_code == 409 and _error(busy)["code"] == "busy"
    job = wait_job(api, job_id, timeout=60)
    assert job["status"] == "succeeded", job
    assert job["progress"] == 1.0 and job["owner"] == server.instance
    assert job["result"]["host"] == "t" and job["result"]["stopped_because"] == "duration reached"
    assert job["hosts"] == ["t"] and job["created_by"] == f"admin-{server.instance}"
    listed = api.get("/v1/jobs", params={"kind": "profile"}).json()["jobs"]
    assert job_id in [j["id"] for j in listed]
    replay = api.post("/v1/profiles", json=body, headers={"Idempotency-Key": "profile-t-1"})
    assert replay.status_code == 202 and replay.json()["job"]["id"] == job_id
    assert replay.headers["location"] == f"/v1/jobs/{job_id}"
    # the test driver gives no run-queue delay, so no sample was kept: said so, naming the guest
    missing = api.get("/v1/profiles/test")
    assert missing.status_code == 404 and "test" in _error(missing)["message"]
    unknown_vm = api.post("/v1/profiles", json={"host": "t", "vms": ["ghost"], "samples": 1})
    assert unknown_vm.status_code == 422 and _error(unknown_vm)["details"][0]["field"] == "vms"
    too_long = api.post("/v1/profiles", json={"host": "t", "t_m_ms": 900, "max_freeze_ms": 500})
    assert too_long.status_code == 422 and _error(too_long)["details"][0]["field"] == "t_m_ms"
    for bad in (-1, 1.5, 1001):
        refused = api.post("/v1/profiles", json={"host": "t", "pair_probes": bad})
        assert refused.status_code == 422 and _error(refused)["details"][0]["field"] == "pair_probes", bad
    assert api.get("/v1/jobs/00000000-0000-4000-8000-000000000000").status_code == 404


def test_audit_and_metrics(api):
    entries = api.get("/v1/audit", params={"action": "token-create", "limit": 10}).json()["entries"]
    assert entries and all(e["action"] == "token-create" for e in entries)
    assert api.get("/v1/audit", params={"since": "2000-01-01T00:00:00"}).status_code == 200
    assert api.get("/v1/audit", params={"since": "yesterday"}).status_code == 422
    # any libvirt domain name filters, up to libvirt's 251 bytes; longer ones name the rule
    assert api.get("/v1/audit", params={"guest": "é" * 125}).json()["entries"] == []
    refused = api.get("/v1/audit", params={"guest": "é" * 126})
    assert refused.status_code == 422 and "252 bytes" in _error(refused)["message"]
    assert api.get("/v1/audit", params={"guest": "a/b"}).status_code == 422
    api.post("/v1/placements", json={"name": "m1", "vcpus": 1, "memory_mib": 64, "host": "t", "dry_run": True})
    api.post("/v1/placements", json={"name": "m1", "vcpus": 1, "memory_mib": 64, "host": "down", "dry_run": True})
    text = api.get("/metrics").text
    assert 'vmplacer_placements_total{host="t",mode="dry_run",outcome="no_fit"}' in text
    assert 'vmplacer_libvirt_errors_total{host="down"}' in text
    assert 'vmplacer_http_requests_total{method="POST",route="/v1/placements",status="409"}' in text
    assert "vmplacer_placement_duration_seconds_bucket" in text
    # declared even before the first freeze or job (this test may run alone)
    assert "# TYPE vmplacer_freeze_duration_seconds histogram" in text and "# TYPE vmplacer_jobs gauge" in text
    assert "# TYPE vmplacer_rebalance_trial_outcomes gauge" in text  # stored trials of every process


def test_metrics_show_what_the_newest_plan_spent_of_its_disruption_budget(server, api):
    """The newest stored plan's disruption figures, whichever process made it: what its trials
    spent, the budget, the trials left waiting, and which plan that is."""
    import yaml

    from vmplacer.adapters.db.engine import make_engine, make_session_factory
    from vmplacer.adapters.db.plans import SqlPlanStore
    from vmplacer.core.rebalance.plan import Plan

    engine = make_engine(yaml.safe_load(server.config.read_text())["database_url"])
    try:
        store = SqlPlanStore(make_session_factory(engine))
        spent = {"trials": 3, "trial_repins": 57, "max_trials": 20, "max_trial_repins": 400, "trials_waiting": 2}
        plan = store.save(Plan((), ("t",), summary="trials only", settings={"notes": {"disruption": spent}}))
        store.save(Plan((), ("t",), summary="a plan without a disruption note"))  # newer: not the figures' plan
    finally:
        engine.dispose()
    text = api.get("/metrics").text
    for line in ('vmplacer_rebalance_disruption{what="trials"} 3.0',
                 'vmplacer_rebalance_disruption{what="trial_repins"} 57.0',
                 'vmplacer_rebalance_disruption{what="trials_waiting"} 2.0',
                 'vmplacer_rebalance_disruption_budget{what="trials"} 20.0',
                 'vmplacer_rebalance_disruption_budget{what="trial_repins"} 400.0',
                 f"vmplacer_rebalance_disruption_plan {float(plan.id)}"):
        assert line in text, line


def test_unknown_placements_are_404(api):
    assert api.get("/v1/placements/nobody").status_code == 404
    response = api.delete("/v1/placements/nobody")
    assert response.status_code == 404 and "nobody" in _error(response)["message"]
    assert api.get("/v1/placements").json() == {"placements": [], "next_cursor": None, "next": None}


def test_serve_refuses_an_outdated_schema(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    config = write_config(tmp_path, url, [{"name": "t", "uri": "test:///default"}])
    assert vmplacer(config, "db", "upgrade", "0001").returncode == 0
    result = vmplacer(config, "serve", "--listen", f"127.0.0.1:{free_port()}", timeout=60)
    assert result.returncode == 1
    assert "vmplacer db upgrade" in result.stderr


def test_token_cli(tmp_path):
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'tokens.db'}", [{"name": "t", "uri": "test:///default"}])
    created = vmplacer(config, "token", "create", "ci", "--scope", "read")
    assert created.returncode == 0 and created.stdout.strip().startswith("vmp_")
    again = vmplacer(config, "token", "create", "ci", "--scope", "admin")
    assert again.returncode == 2 and "exists" in again.stderr
    assert vmplacer(config, "token", "create", "bad name", "--scope", "read").returncode == 2
    listing = json.loads(vmplacer(config, "token", "list", "--format", "json").stdout)
    assert [(t["name"], t["scope"]) for t in listing] == [("ci", "read")]
    assert created.stdout.strip() not in json.dumps(listing)
    assert vmplacer(config, "token", "revoke", "ci", "--yes").returncode == 0
    assert vmplacer(config, "token", "revoke", "ci", "--yes").returncode == 2


def _store_plan(server: Server, state: str = "proposed") -> int:
    """A plan of one no-op repin of the test driver's guest (its pins as they are), stored in the
    server's database and moved on to `state`; its id."""
    import yaml

    from vmplacer.adapters.db.engine import make_engine, make_session_factory
    from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlanStore
    from vmplacer.core.placement.guest_placement import Placement
    from vmplacer.core.rebalance.plan import Action, Plan

    engine = make_engine(yaml.safe_load(server.config.read_text())["database_url"])
    try:
        store = SqlPlanStore(make_session_factory(engine))
        live = Placement("test", "t", {0: frozenset(), 1: frozenset()})
        plan = store.save(Plan((Action(0, "repin", "t", "test", before=live, after=live, reason="test"),), ("t",),
                               summary="1 no-op repin"))
        for before, after in (("proposed", "approved"), ("approved", "running")):
            if state == before:
                break
            if after == "running":  # a live executor holds its host's lease while the plan runs
                assert SqlLeaseStore(store.sessions).acquire(["t"], EXECUTOR, 3600)
            assert store.transition(plan.id, before, after)
        return plan.id
    finally:
        engine.dispose()


EXECUTOR = "rebalance@elsewhere"  # the stand-in executor of plans stored `running`


def _release_executor_lease(server) -> None:
    import yaml

    from vmplacer.adapters.db.engine import make_engine, make_session_factory
    from vmplacer.adapters.db.plans import SqlLeaseStore

    engine = make_engine(yaml.safe_load(server.config.read_text())["database_url"])
    try:
        SqlLeaseStore(make_session_factory(engine)).release(["t"], EXECUTOR)
    finally:
        engine.dispose()


def test_plans_dry_run_read_and_apply_once(server, api):
    created = api.post("/v1/plans", json={"hosts": ["t"]})
    assert created.status_code == 201, created.text
    empty = created.json()
    # the test driver's one guest has nothing worth moving: the plan is final at once
    assert empty["state"] == "empty" and empty["hosts"] == ["t"] and empty["actions"] == []
    assert created.headers["location"] == f"/v1/plans/{empty['id']}"
    assert api.get(f"/v1/plans/{empty['id']}").json()["summary"] == empty["summary"]
    refused = api.post(f"/v1/plans/{empty['id']}/apply")
    assert refused.status_code == 409 and "is empty: nothing worth doing was found" in _error(refused)["message"]
    assert _error(refused)["details"][0]["state"] == "empty"
    # listing: every state by default (as before), narrowed by state or include_empty=false
    plan_id = _store_plan(server)
    listed = {p["id"]: p["state"] for p in api.get("/v1/plans").json()["plans"]}
    assert listed[empty["id"]] == "empty" and listed[plan_id] == "proposed"
    without = [p["id"] for p in api.get("/v1/plans", params={"include_empty": "false"}).json()["plans"]]
    assert plan_id in without and empty["id"] not in without
    only = api.get("/v1/plans", params=[("state", "empty"), ("state", "cancelled")]).json()["plans"]
    assert {p["state"] for p in only} <= {"empty", "cancelled"} and empty["id"] in [p["id"] for p in only]
    assert api.get("/v1/plans", params={"state": "done"}).status_code == 422
    # racing applies of one plan: exactly one is accepted
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: api.post(f"/v1/plans/{plan_id}/apply"), range(6)))
    accepted = [a for a in answers if a.status_code == 202]
    assert len(accepted) == 1, [a.text for a in answers]
    assert all(a.status_code == 409 and _error(a)["code"] == "conflict" for a in answers if a not in accepted)
    job = wait_job(api, accepted[0].json()["job"]["id"], timeout=60)
    assert job["status"] == "succeeded", job
    assert job["result"]["state"] == "succeeded"
    assert api.get(f"/v1/plans/{plan_id}").json()["state"] == "succeeded"
    # the executor's entries name the token that asked for the apply, as the request's own entry does
    queued = [e for e in api.get("/v1/audit", params={"action": "rebalance-apply-queued"}).json()["entries"]
              if e["detail"].get("plan_id") == plan_id]
    assert len(queued) == 1 and isinstance(queued[0]["detail"]["token_id"], int)
    for action in ("rebalance-repin", "rebalance-plan"):
        entries = [e for e in api.get("/v1/audit", params={"action": action}).json()["entries"]
                   if e["detail"].get("plan_id") == plan_id]
        assert entries, action
        for entry in entries:
            assert entry["actor"] == f"api:admin-{server.instance}", entry
            assert entry["detail"]["token"] == f"admin-{server.instance}"
            assert entry["detail"]["token_id"] == queued[0]["detail"]["token_id"]
    again = api.post(f"/v1/plans/{plan_id}/apply")
    assert again.status_code == 409 and "succeeded" in _error(again)["message"]
    assert api.post("/v1/plans/999999/apply").status_code == 404
    assert api.get("/v1/plans/999999").status_code == 404
    unknown = api.post("/v1/plans", json={"hosts": ["nowhere"]})
    assert unknown.status_code == 422 and _error(unknown)["details"][0]["field"] == "hosts"


def test_plans_cancel(server, api):
    proposed, approved, running = _store_plan(server), _store_plan(server, "approved"), _store_plan(server, "running")
    answer = api.post(f"/v1/plans/{proposed}/cancel", json={"reason": "maintenance"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "cancelled" and body["plan"]["state"] == "cancelled"
    assert body["plan"]["actions"][0]["state"] == "skipped"
    assert body["plan"]["actions"][0]["message"] == f"cancelled by api:admin-{server.instance}: maintenance"
    no_body = api.post(f"/v1/plans/{approved}/cancel")
    assert no_body.status_code == 200
    assert no_body.json()["plan"]["message"] == f"cancelled by api:admin-{server.instance}"
    requested = api.post(f"/v1/plans/{running}/cancel", json={"reason": "stop"})
    assert requested.status_code == 200 and requested.json()["status"] == "cancel-requested"
    shown = api.get(f"/v1/plans/{running}").json()
    assert shown["state"] == "running" and shown["cancel_request"]["reason"] == "stop"
    assert shown["cancel_request"]["by"] == f"api:admin-{server.instance}"
    final = api.post(f"/v1/plans/{proposed}/cancel")
    assert final.status_code == 409 and f"plan {proposed} is cancelled: it is final" in _error(final)["message"]
    assert _error(final)["details"] == [{"field": None, "rule": "conflict", "reason": _error(final)["message"],
                                         "plan": proposed, "state": "cancelled"}]
    assert api.post(f"/v1/plans/{proposed}/apply").status_code == 409
    missing = api.post("/v1/plans/999999/cancel")
    assert missing.status_code == 404 and "plan 999999 does not exist" in _error(missing)["message"]
    assert api.post(f"/v1/plans/{running}/cancel", json={"reason": 5}).status_code == 422
    assert api.post(f"/v1/plans/{running}/cancel", json={"why": "x"}).status_code == 422
    with server.client(token=server.read) as viewer:
        assert viewer.post(f"/v1/plans/{running}/cancel").status_code == 403
    _release_executor_lease(server)  # the stand-in executor "stops": later tests use host t
    audit = api.get("/v1/audit", params={"action": "rebalance-cancel"}).json()
    entries = audit["entries"] if isinstance(audit, dict) else audit
    outcomes = {e["detail"]["plan_id"]: e["outcome"] for e in entries}
    assert outcomes[proposed] == "ok" and outcomes[approved] == "ok" and outcomes[running] == "requested"


def test_reconcile_reports_each_host_and_names_the_unreachable_one(api):
    answer = api.post("/v1/reconcile", json={"dry_run": True})
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert report["dry_run"] is True and report["status"] == "incomplete"
    by_host = {h["host"]: h for h in report["hosts"]}
    assert by_host["t"]["status"] == "reconciled"
    assert {f["guest"]: f["kind"] for f in by_host["t"]["findings"]} == {"test": "unmanaged"}
    assert by_host["down"]["status"] == "unreachable" and "down" in " ".join(report["problems"])
    only_t = api.post("/v1/reconcile", json={"hosts": ["t"], "settle_s": 0})
    assert only_t.status_code == 200 and only_t.json()["status"] == "complete", only_t.text
    unknown = api.post("/v1/reconcile", json={"hosts": ["nowhere"]})
    assert unknown.status_code == 422 and _error(unknown)["details"][0]["field"] == "hosts"
    negative = api.post("/v1/reconcile", json={"settle_s": -1})
    assert negative.status_code == 422 and "settle_s" in negative.text
    metrics = api.get("/metrics").text
    assert 'vmplacer_reconcile_findings_total{host="t",kind="unmanaged",outcome="reported"}' in metrics


def test_maintenance_keeps_new_guests_off_and_drain_plans_need_it(api):
    body = {"name": "m2", "vcpus": 1, "memory_mib": 64, "dry_run": True}
    try:
        entered = api.put("/v1/hosts/t/maintenance", json={"reason": "firmware update"})
        assert entered.status_code == 200, entered.text
        assert entered.json()["changed"] is True and entered.json()["maintenance"]["by"].startswith("api:")
        again = api.put("/v1/hosts/t/maintenance", json={"reason": "something else"})
        assert again.json()["changed"] is False and again.json()["maintenance"]["reason"] == "firmware update"
        hosts = {h["name"]: h for h in api.get("/v1/hosts").json()["hosts"]}
        assert hosts["t"]["maintenance"]["reason"] == "firmware update" and hosts["down"]["maintenance"] is None
        metrics = api.get("/metrics").text
        assert 'vmplacer_host_maintenance{host="t"} 1.0' in metrics
        assert 'vmplacer_host_maintenance{host="down"} 0.0' in metrics

        named = api.post("/v1/placements", json={**body, "host": "t"})
        assert named.status_code == 409 and _error(named)["code"] == "host-in-maintenance"
        assert "firmware update" in _error(named)["message"]
        anywhere = api.post("/v1/placements", json=body)  # only "down" is left, and it does not answer
        assert anywhere.status_code in (502, 503) and "down" in _error(anywhere)["message"]

        drain = api.post("/v1/plans", json={"drain": "t"})
        assert drain.status_code == 201, drain.text
        plan = drain.json()
        assert plan["settings"]["notes"]["drain"] == "t" and plan["state"] == "empty"
        assert plan["settings"]["notes"]["stuck"] == ["test: no other host accepts migrations"]
        outside = api.post("/v1/plans", json={"hosts": ["down"], "drain": "t"})
        assert outside.status_code == 422 and _error(outside)["details"][0]["field"] == "drain"

        for bad in ({}, {"reason": ""}, {"reason": 5}):
            refused = api.put("/v1/hosts/t/maintenance", json=bad)
            assert refused.status_code == 422 and _error(refused)["details"][0]["field"] == "reason", refused.text
        assert api.put("/v1/hosts/nowhere/maintenance", json={"reason": "x"}).status_code == 404
    finally:
        left = api.delete("/v1/hosts/t/maintenance")
    assert left.status_code == 200 and left.json()["changed"] is True
    assert left.json()["maintenance"]["reason"] == "firmware update"
    assert api.delete("/v1/hosts/t/maintenance").json() == {"host": "t", "changed": False, "maintenance": None}
    assert 'vmplacer_host_maintenance{host="t"} 0.0' in api.get("/metrics").text
    not_closed = api.post("/v1/plans", json={"drain": "t"})
    assert not_closed.status_code == 409 and _error(not_closed)["code"] == "not-in-maintenance"
    audit = api.get("/v1/audit", params={"action": "maintenance-start"}).json()["entries"]
    assert [(e["host"], e["message"]) for e in audit] == [("t", "firmware update")]
