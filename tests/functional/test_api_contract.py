"""The OpenAPI document as a client generator reads it, and the server keeping to it.

The document is the contract an orchestrator generates its client from: the same for every
deployment, with readable operation ids, the headers the server reads and sets, one error
shape, timestamps as date-times, optional bodies as optional. The server side of each
promise is checked on the real app (SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import re
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from tests.functional.test_api_helpers import make_container, roomy_test_driver

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from vmplacer.adapters.db.api import SqlTokenStore
from vmplacer.adapters.db.models import AuditRow
from vmplacer.api.app import create_app
from vmplacer.api.idempotency import KEY_PATTERN, KEY_RE
from vmplacer.api.job_views import job_view
from vmplacer.api.routes.plans import APPLY_JOB, PLAN_JOB
from vmplacer.api.routes.profiles import PROFILE_JOB
from vmplacer.api.routes.protect import PROTECT_JOB
from vmplacer.api.schemas import JOB_KINDS, JOB_STATUSES, PLACEMENT_STATES, JobResult, JobView, PlanView
from vmplacer.api.services import ApiOptions
from vmplacer.core.rebalance.plan import PLAN_STATES
from vmplacer.ports import JobRecord

GUEST = {"name": "g1", "vcpus": 1, "memory_mib": 64, "dry_run": True}
ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
OPERATIONS = {
    ("get", "/healthz"): "getHealth",
    ("get", "/readyz"): "getReadiness",
    ("get", "/metrics"): "getMetrics",
    ("get", "/v1/audit"): "listAuditEntries",
    ("get", "/v1/hosts"): "listHosts",
    ("get", "/v1/hosts/{host}/topology"): "getHostTopology",
    ("put", "/v1/hosts/{host}/maintenance"): "enterMaintenance",
    ("delete", "/v1/hosts/{host}/maintenance"): "leaveMaintenance",
    ("get", "/v1/jobs"): "listJobs",
    ("get", "/v1/jobs/{job_id}"): "getJob",
    ("post", "/v1/jobs/{job_id}/cancel"): "cancelJob",
    ("get", "/v1/placements"): "listPlacements",
    ("post", "/v1/placements"): "createPlacement",
    ("get", "/v1/placements/{guest}"): "getPlacement",
    ("delete", "/v1/placements/{guest}"): "deletePlacement",
    ("get", "/v1/plans"): "listPlans",
    ("post", "/v1/plans"): "createPlan",
    ("get", "/v1/plans/{plan_id}"): "getPlan",
    ("post", "/v1/plans/{plan_id}/apply"): "applyPlan",
    ("post", "/v1/plans/{plan_id}/cancel"): "cancelPlan",
    ("post", "/v1/profiles"): "startProfile",
    ("get", "/v1/profiles/{guest}"): "getProfile",
    ("post", "/v1/protect"): "startProtection",
    ("get", "/v1/protect/{job_id}"): "getProtection",
    ("delete", "/v1/protect/{job_id}"): "stopProtection",
    ("post", "/v1/reconcile"): "reconcileHosts",
}


def _container(database_url: str, directory: Path, hosts: list[str],  # type: ignore[no-untyped-def]
               max_request_bytes: int | None = None):
    from vmplacer.adapters.db import migrate
    from vmplacer.bootstrap import Container
    from vmplacer.config import settings_from_mapping

    migrate.upgrade(database_url)
    document: dict[str, Any] = {"data_dir": str(directory), "database_url": database_url,
                                "hosts": [{"name": name, "uri": "test:///default", "domain_type": "qemu"}
                                          for name in hosts]}
    if max_request_bytes is not None:
        document["api"] = {"max_request_bytes": max_request_bytes}
    return Container(settings_from_mapping(document, "test", environ={}))


def _document(database_url: str, directory: Path, hosts: list[str], max_request_bytes: int | None = None) -> str:
    directory.mkdir()
    container = _container(database_url, directory, hosts, max_request_bytes)
    try:
        app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
        return json.dumps(app.openapi(), sort_keys=True)
    finally:
        container.close()


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    directory = tmp_path_factory.mktemp("spec")
    return json.loads(_document(f"sqlite:///{directory / 'spec.db'}", directory / "app", ["t"]))


@pytest.fixture
def api(database_url, tmp_path):  # type: ignore[no-untyped-def]
    with roomy_test_driver():
        container = make_container(database_url, tmp_path, [{"name": "t", "uri": "test:///default",
                                                             "domain_type": "qemu"}])
        admin = SqlTokenStore(container.sessions).create("ops", "admin")
        app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
        try:
            with TestClient(app, raise_server_exceptions=False) as client:
                client.headers["Authorization"] = f"Bearer {admin}"
                yield client, container
        finally:
            container.close()


def _operations(spec: dict[str, Any]):  # type: ignore[no-untyped-def]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            yield method, path, operation


def _error(response) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details", "request_id"}, body
    assert body["error"]["request_id"] == response.headers["X-Request-Id"]
    for problem in body["error"]["details"]:
        assert {"field", "rule", "reason"} <= set(problem), problem
    return body["error"]


# ----- the document


def test_the_document_is_the_same_for_every_deployment(tmp_path):
    """Hosts and limits are the deployment's: none of them shapes the contract."""
    one = _document(f"sqlite:///{tmp_path / 'one.db'}", tmp_path / "one", ["alpha"])
    two = _document(f"sqlite:///{tmp_path / 'two.db'}", tmp_path / "two", ["beta-2", "gamma"],
                    max_request_bytes=64 * 1024)
    assert one == two
    for name in ("alpha", "beta-2", "gamma", "example"):
        assert f'"{name}"' not in one
    schemas = json.loads(one)["components"]["schemas"]
    host = schemas["PlacementRequest"]["properties"]["host"]["anyOf"][0]
    assert host == {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", "minLength": 1,
                    "maxLength": 63}
    assert schemas["PlanRequest"]["properties"]["hosts"]["anyOf"][0]["items"] == host
    assert schemas["ProfileRequest"]["properties"]["host"]["anyOf"][0] == host


def test_operations_have_readable_stable_ids_and_declared_tags(spec):
    found = {(method, path): operation["operationId"] for method, path, operation in _operations(spec)}
    assert found == OPERATIONS
    declared = {tag["name"] for tag in spec["tags"]}
    for _method, _path, operation in _operations(spec):
        assert len(operation["tags"]) == 1 and operation["tags"][0] in declared, operation["operationId"]


def test_every_post_declares_the_idempotency_key_as_the_server_checks_it(spec):
    parameter = spec["components"]["parameters"]["IdempotencyKey"]
    assert (parameter["name"], parameter["in"], parameter["required"]) == ("Idempotency-Key", "header", False)
    assert parameter["schema"] == {"type": "string", "minLength": 1, "maxLength": 255, "pattern": KEY_PATTERN}
    for key in ("a", "!~", "x" * 255, "create-db1-7f3a", "has space", "", "x" * 256, "é", "tab\there"):
        assert bool(re.match(KEY_PATTERN, key)) == bool(KEY_RE.match(key)), key
    posts = [operation for method, _path, operation in _operations(spec) if method == "post"]
    assert len(posts) == 8
    for operation in posts:
        assert {"$ref": "#/components/parameters/IdempotencyKey"} in operation["parameters"], operation["operationId"]
    for method, _path, operation in _operations(spec):
        if method != "post":
            assert all(p.get("name") != "Idempotency-Key" and "$ref" not in p
                       for p in operation.get("parameters", [])), operation["operationId"]


def test_response_headers_are_declared_where_the_server_sets_them(spec):
    headers = spec["components"]["headers"]
    assert headers["XRequestId"]["required"] is True and headers["Location"]["required"] is True
    assert headers["RetryAfter"]["schema"] == {"type": "integer", "minimum": 0}
    for method, _path, operation in _operations(spec):
        for status, response in operation["responses"].items():
            declared = response["headers"]
            assert declared["X-Request-Id"] == {"$ref": "#/components/headers/XRequestId"}
            if status in ("201", "202"):
                assert declared["Location"] == {"$ref": "#/components/headers/Location"}, operation["operationId"]
            if status == "202":
                assert declared["Retry-After"]["required"] is True
            if status == "503":
                assert "Retry-After" in declared
            assert ("Idempotent-Replayed" in declared) == (method == "post")
    for path in ("/v1/placements", "/v1/jobs", "/v1/plans", "/v1/audit"):  # lists link their next page
        assert spec["paths"][path]["get"]["responses"]["200"]["headers"]["Link"] == {
            "$ref": "#/components/headers/Link"}, path
        assert "cursor" in {p["name"] for p in spec["paths"][path]["get"]["parameters"]}, path
    schemas = spec["components"]["schemas"]
    assert schemas["JobStatus"]["enum"] == ["queued", "running", "succeeded", "failed", "cancelled"]
    assert schemas["JobResult"]["required"] == ["empty"]
    assert spec["components"]["headers"]["Allow"]["schema"] == {"type": "string"}
    for _method, _path, operation in _operations(spec):
        assert operation["responses"]["default"]["headers"]["Allow"] == {"$ref": "#/components/headers/Allow"}
    polled = spec["paths"]["/v1/jobs/{job_id}"]["get"]["responses"]["200"]["headers"]["Retry-After"]
    assert polled["schema"] == {"type": "integer", "minimum": 0} and "required" not in polled
    statuses = {status for _m, _p, operation in _operations(spec) for status in operation["responses"]}
    assert "429" not in statuses  # no API route answers it (only the web view's sign-in does)


def _time_fields(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: prop for name, prop in schema.get("properties", {}).items()
            if name == "at" or name == "since" or name.endswith("_at")}


def test_every_timestamp_in_a_response_is_a_date_time(spec):
    seen = set()
    for model, schema in spec["components"]["schemas"].items():
        for name, prop in _time_fields(schema).items():
            options = [o for o in prop.get("anyOf", [prop]) if o.get("type") != "null"]
            assert options == [{**options[0], "type": "string", "format": "date-time"}], (model, name, prop)
            seen.add(f"{model}.{name}")
    assert {"AuditEntry.at", "JobView.created_at", "JobView.finished_at", "Lease.expires_at", "Maintenance.since",
            "PlanView.created_at", "PlanSummary.created_at", "CancelRequest.at", "ProfileRun.started_at",
            "ProtectView.last_round_at"} <= seen


def test_errors_have_one_named_details_schema(spec):
    schemas = spec["components"]["schemas"]
    error = schemas["ErrorDetail"]
    assert set(error["required"]) == {"code", "message", "details", "request_id"}
    assert error["properties"]["details"]["$ref"] == "#/components/schemas/ErrorDetails"
    assert schemas["ErrorDetails"]["type"] == "array"
    assert schemas["ErrorDetails"]["items"] == {"$ref": "#/components/schemas/Problem"}
    assert set(schemas["Problem"]["required"]) == {"field", "rule", "reason"}
    for _method, _path, operation in _operations(spec):
        for status, response in operation["responses"].items():
            if status.startswith(("4", "5")) and operation["operationId"] != "getReadiness":
                assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}


def test_every_operation_reads_any_other_status_as_the_error_shape(spec):
    """A status an operation does not list (500 `internal`, 405, 400) still has the one error shape,
    and every POST lists 409 (`idempotency-key-in-use` can answer any keyed request)."""
    for method, _path, operation in _operations(spec):
        default = operation["responses"]["default"]
        assert default["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}, \
            operation["operationId"]
        assert "500" in default["description"] and "405" in default["description"]
        if method == "post":
            assert "409" in operation["responses"], operation["operationId"]
            assert "Retry-After" in operation["responses"]["409"]["headers"], operation["operationId"]


def _named(schema: dict[str, Any]) -> str | None:
    """The component a property's schema refers to (directly, or as its one non-null option)."""
    options = [o for o in schema.get("anyOf", [schema]) if o.get("type") != "null"]
    items = [o.get("items", o) for o in options]
    refs = {o["$ref"].rsplit("/", 1)[-1] for o in items if "$ref" in o}
    return refs.pop() if len(refs) == 1 and len(items) == 1 else None


def test_states_kinds_and_statuses_are_enums_one_schema_per_concept(spec):
    schemas = spec["components"]["schemas"]
    assert schemas["PlacementState"]["enum"] == list(PLACEMENT_STATES) == ["planned", "defined", "running"]
    assert schemas["PlanState"]["enum"] == list(PLAN_STATES)
    assert schemas["JobStatus"]["enum"] == list(JOB_STATUSES)
    assert set(schemas["JobKind"]["enum"]) == set(JOB_KINDS) == {PROFILE_JOB, PROTECT_JOB, PLAN_JOB, APPLY_JOB}
    assert schemas["CancelOutcome"]["enum"] == ["cancelled", "cancel-requested"]
    uses = {("PlacementView", "state"): "PlacementState", ("PlacementRecord", "state"): "PlacementState",
            ("PlanView", "state"): "PlanState", ("PlanSummary", "state"): "PlanState",
            ("JobResult", "state"): "PlanState", ("JobView", "status"): "JobStatus", ("JobView", "kind"): "JobKind",
            ("JobCancelView", "status"): "CancelOutcome", ("PlanCancelView", "status"): "CancelOutcome"}
    for (model, field), concept in uses.items():
        assert _named(schemas[model]["properties"][field]) == concept, (model, field)
    # the query parameters filter by the same schemas
    filters = {("/v1/placements", "state"): "PlacementState", ("/v1/plans", "state"): "PlanState",
               ("/v1/jobs", "status"): "JobStatus", ("/v1/jobs", "kind"): "JobKind"}
    for (path, name), concept in filters.items():
        [parameter] = [p for p in spec["paths"][path]["get"]["parameters"] if p.get("name") == name]
        assert _named(parameter["schema"]) == concept, (path, name)
    # no state, status or kind of any model is a bare string, but what a protection loop's round recorded on
    # disk says of a guest (written by whichever version ran the loop: an enum would refuse an older word)
    recorded = {("ProtectedGuest", "state")}
    for model, schema in schemas.items():
        for field in ("state", "status", "kind"):
            prop = schema.get("properties", {}).get(field)
            if prop is not None and (model, field) not in recorded:
                options = [o for o in prop.get("anyOf", [prop]) if o.get("type") != "null"]
                assert all("enum" in o or "const" in o or "$ref" in o for o in options), (model, field, prop)


def _job(kind: str, result: dict[str, Any] | None) -> dict[str, Any]:
    record = JobRecord(id="00000000-0000-0000-0000-000000000001", kind=kind, hosts=("t",), status="succeeded",
                       progress=1.0, message="", parameters={}, result=result, created_by="ops", created_at=1.0)
    return json.loads(JobView.model_validate(job_view(record)).model_dump_json())


def test_a_job_result_carries_its_kinds_typed_keys_and_no_other_kinds(spec):
    properties = spec["components"]["schemas"]["JobResult"]["properties"]
    assert {"plan_id", "state", "summary", "actions", "stopped_because", "run_id", "freezes", "rounds", "released",
            "stopped_by"} <= set(properties)
    typed = set(properties)
    plan = _job(PLAN_JOB, {"id": 7, "state": "empty", "hosts": ["t"], "summary": "", "predicted_gain": 0.0,
                           "actions": [], "notes": [], "objective_before": 0.5, "empty": True,
                           "empty_reason": "nothing worth doing was found"})["result"]
    assert (plan["plan_id"], plan["id"], plan["state"], plan["objective_before"]) == (7, 7, "empty", 0.5)
    assert set(plan) - typed == {"id", "objective_before"}  # what it sends beyond the typed keys is kept
    protect = _job(PROTECT_JOB, {"host": "t", "rounds": 3, "released": [], "empty": False, "empty_reason": None})
    assert protect["result"] == {"host": "t", "rounds": 3, "released": [], "empty": False, "empty_reason": None}
    old = _job(PROFILE_JOB, {"host": "t", "stopped_because": "samples reached"})  # stored before `empty` existed
    assert old["result"] == {"empty": False, "empty_reason": None, "host": "t", "stopped_because": "samples reached"}
    assert "plan_id" not in _job(APPLY_JOB, {"id": None, "state": "cancelled"})["result"]


def test_links_name_real_operations_and_their_parameters(spec):
    """The links a stateful client follows: each from an answer to an operation of the document,
    filling that operation's own path parameters from a field the answer's schema has."""
    operations = {op["operationId"]: op for path in spec["paths"].values() for op in path.values()}
    schemas = spec["components"]["schemas"]
    followed = set()
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            for status, response in operation["responses"].items():
                for name, link in response.get("links", {}).items():
                    target = operations[link["operationId"]]
                    wanted = {p["name"] for p in target.get("parameters", []) if p.get("in") == "path"}
                    assert set(link["parameters"]) == wanted, (path, method, status, name)
                    for expression in link["parameters"].values():
                        if expression.startswith("$request.path."):
                            assert "{" + expression.rsplit(".", 1)[1] + "}" in path, (path, name)
                            continue
                        assert expression.startswith("$response.body#/"), expression
                        schema = response["content"]["application/json"]["schema"]
                        for step in expression.split("#/", 1)[1].split("/"):
                            schema = schemas[schema["$ref"].rsplit("/", 1)[1]] if "$ref" in schema else schema
                            schema = schema["items"] if step.isdigit() else schema["properties"][step]
                    followed.add(link["operationId"])
    assert {"getPlacement", "deletePlacement", "getPlan", "applyPlan", "cancelPlan", "getJob", "cancelJob",
            "getProtection", "stopProtection", "getHostTopology", "enterMaintenance", "leaveMaintenance"} <= followed


def test_the_cancel_body_is_optional_and_is_the_model_itself(spec):
    body = spec["paths"]["/v1/plans/{plan_id}/cancel"]["post"]["requestBody"]
    assert body["required"] is False
    assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/PlanCancelRequest"}


# ----- the server keeping to it


def test_request_ids_are_echoed_or_made_and_named_in_errors(api):
    client, _ = api
    mine = client.get("/v1/hosts", headers={"X-Request-Id": "orchestrator:42.a_b-c"})
    assert mine.status_code == 200 and mine.headers["X-Request-Id"] == "orchestrator:42.a_b-c"
    made = client.get("/v1/hosts", headers={"X-Request-Id": "no spaces allowed"})
    assert re.match(r"^[0-9a-f]{32}$", made.headers["X-Request-Id"])
    other = client.get("/v1/hosts")
    assert other.headers["X-Request-Id"] not in (made.headers["X-Request-Id"], "orchestrator:42.a_b-c")
    # errors from a route, the token check, the idempotency layer and the size limit alike
    answers = [client.get("/v1/jobs/00000000-0000-0000-0000-000000000000", headers={"X-Request-Id": "r-1"}),
               client.get("/v1/hosts", headers={"Authorization": "Bearer wrong", "X-Request-Id": "r-2"}),
               client.post("/v1/placements", json=GUEST, headers={"Idempotency-Key": "a b", "X-Request-Id": "r-3"}),
               client.post("/v1/placements", content=b"{" + b" " * 2_000_000 + b"}",
                           headers={"Content-Type": "application/json", "X-Request-Id": "r-4"}),
               client.get("/healthz/nothing", headers={"X-Request-Id": "r-5"})]
    assert [a.status_code for a in answers] == [404, 401, 422, 413, 404]
    assert [_error(a)["request_id"] for a in answers] == ["r-1", "r-2", "r-3", "r-4", "r-5"]
    assert _error(answers[2])["details"] == [{"field": "Idempotency-Key", "rule": "string_pattern_mismatch",
                                              "reason": _error(answers[2])["message"]}]
    assert client.get("/healthz").headers["X-Request-Id"]


def test_statuses_no_operation_lists_come_in_the_error_shape(api, monkeypatch):
    client, container = api
    wrong = client.put("/v1/jobs")
    assert wrong.status_code == 405 and _error(wrong)["code"] == "method-not-allowed"
    assert wrong.headers["Allow"] == "GET"

    def broken(*_args: Any, **_filters: Any) -> Any:
        raise RuntimeError("the store broke")

    monkeypatch.setattr(container.pages, "jobs", broken)
    failed = client.get("/v1/jobs", headers={"X-Request-Id": "orchestrator:500"})
    assert failed.status_code == 500
    error = _error(failed)  # the header and the body name the request, as the caller called it
    assert error["code"] == "internal" and "RuntimeError" in error["message"] and error["details"] == []
    assert error["request_id"] == "orchestrator:500"
    made = _error(client.get("/v1/jobs"))  # without one: a new id, the same in the header and the body
    assert re.match(r"^[0-9a-f]{32}$", made["request_id"]) and made["code"] == "internal"

    store = client.app.state.services.idempotency  # a middleware's own failure: answered outside them all
    monkeypatch.setattr(store, "begin", broken)
    outside = client.post("/v1/reconcile", json={"dry_run": True},
                          headers={"Idempotency-Key": "reconcile-1", "X-Request-Id": "orchestrator:501"})
    assert outside.status_code == 500
    assert _error(outside)["request_id"] == "orchestrator:501" and _error(outside)["code"] == "internal"


def test_unknown_query_parameters_are_refused_like_unknown_body_keys(api):
    client, _ = api
    body_key = _error(client.post("/v1/reconcile", json={"dry_run": True, "colour": "red"}))
    assert [(d["field"], d["rule"]) for d in body_key["details"]] == [("colour", "extra_forbidden")]
    for method, path, params in (("GET", "/v1/audit", {"untill": "2026-01-01"}),
                                 ("GET", "/v1/hosts", {"verbose": "1"}),
                                 ("GET", "/v1/plans", {"limit": "5", "colour": "red", "size": "x"}),
                                 ("DELETE", "/v1/placements/g1", {"undefinee": "false"}),
                                 ("POST", "/v1/plans/1/cancel", {"force": "true"})):
        response = client.request(method, path, params=params)
        assert response.status_code == 422, (path, response.text)
        error = _error(response)
        unknown = [name for name in params if name not in ("limit",)]
        assert error["code"] == body_key["code"] == "validation"
        assert [d["field"] for d in error["details"]] == [f"query.{name}" for name in unknown]
        assert {d["rule"] for d in error["details"]} == {"extra_forbidden"}
        assert {d["reason"] for d in error["details"]} == {body_key["details"][0]["reason"]}
    assert client.get("/v1/plans", params={"limit": "5", "state": "empty"}).status_code == 200
    # the token is checked first: no hint about parameters to a caller without one
    assert client.get("/v1/hosts", params={"verbose": "1"}, headers={"Authorization": "Bearer x"}).status_code == 401
    # the web view is not the API: its pages keep their own rules
    assert client.get("/ui/login", params={"next": "/ui/"}).status_code == 200


def _audit(container, *moments: datetime) -> None:  # type: ignore[no-untyped-def]
    with container.sessions.begin() as session:
        for index, moment in enumerate(moments):
            session.execute(insert(AuditRow).values(at=moment, actor="test", action="probe", host="t",
                                                    guest=f"g{index}", outcome="ok", detail={}, message=""))


def test_audit_until_bounds_the_entries_and_times_are_iso(api):
    client, container = api
    start = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
    _audit(container, *(start + timedelta(hours=hours) for hours in range(6)))  # g0 .. g5, an hour apart

    def guests(**params: str) -> list[str]:
        response = client.get("/v1/audit", params={"action": "probe", **params})
        assert response.status_code == 200, response.text
        entries = response.json()["entries"]
        assert all(ISO_UTC.match(entry["at"]) for entry in entries), entries
        return [entry["guest"] for entry in entries]

    assert guests() == ["g5", "g4", "g3", "g2", "g1", "g0"]
    assert client.get("/v1/audit", params={"action": "probe", "limit": "1"}).json()["entries"][0]["at"] == \
        "2026-03-01T17:00:00Z"
    assert guests(until="2026-03-01T14:00:00Z") == ["g2", "g1", "g0"]  # inclusive
    assert guests(until="2026-03-01T14:59:59+01:00") == ["g1", "g0"]
    assert guests(until="2026-03-01 13:30") == ["g1", "g0"]  # no offset: UTC
    assert guests(since="2026-03-01T13:00:00Z", until="2026-03-01T15:00:00Z") == ["g3", "g2", "g1"]
    assert guests(until="2026-02-28") == []
    assert guests(until="2026-03-01T14:00:00Z", limit="2") == ["g2", "g1"]
    assert guests(until="2026-03-01T13:00:00Z") == ["g1", "g0"]
    first = client.get("/v1/audit", params={"action": "probe", "until": "2026-03-01T16:00:00Z", "limit": "2"})
    older = first.json()["entries"][-1]["id"]
    assert guests(until="2026-03-01T16:00:00Z", before_id=str(older)) == ["g2", "g1", "g0"]
    for bad in ("yesterday", "2026-13-01", "2023-02-29", "0000-01-01", "9999-12-31T23:59-01:00"):
        refused = client.get("/v1/audit", params={"until": bad})
        assert refused.status_code == 422 and _error(refused)["details"][0]["field"] == "query.until"


def test_a_job_stop_request_time_is_iso_and_each_202_says_where_and_when(api):
    client, _ = api
    started = client.post("/v1/protect", json={"host": "t"}, headers={"Idempotency-Key": "protect-t-1"})
    assert started.status_code == 202, started.text
    job = started.json()["job"]["id"]
    assert started.headers["Location"] == f"/v1/protect/{job}" and started.headers["Retry-After"] == "1"
    replayed = client.post("/v1/protect", json={"host": "t"}, headers={"Idempotency-Key": "protect-t-1"})
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert (replayed.headers["Location"], replayed.headers["Retry-After"]) == (f"/v1/protect/{job}", "1")
    assert replayed.headers["X-Request-Id"] != started.headers["X-Request-Id"]
    stopped = client.delete(f"/v1/protect/{job}")
    assert stopped.status_code == 202, stopped.text
    assert stopped.headers["Location"] == f"/v1/jobs/{job}" and stopped.headers["Retry-After"] == "1"
    stop = client.get(f"/v1/jobs/{job}").json()["parameters"]["stop"]
    assert ISO_UTC.match(stop["at"]) and stop["by"] == "api:ops"
    assert ISO_UTC.match(stopped.json()["job"]["parameters"]["stop"]["at"])


def test_a_plan_is_cancelled_without_a_body_and_a_null_body_is_refused(api):
    client, _ = api
    created = client.post("/v1/plans", json={"hosts": ["t"]})
    assert created.status_code == 201 and created.headers["Location"] == f"/v1/plans/{created.json()['id']}"
    plan = created.json()["id"]
    assert ISO_UTC.match(created.json()["created_at"])
    no_body = client.post(f"/v1/plans/{plan}/cancel")
    assert no_body.status_code == 409 and _error(no_body)["details"][0]["state"] == "empty"  # final: nothing to cancel
    null = client.post(f"/v1/plans/{plan}/cancel", content=b"null", headers={"Content-Type": "application/json"})
    assert null.status_code == 422 and _error(null)["details"][0]["field"] == "body"


def test_hosts_named_in_bodies_are_checked_by_the_server(api):
    client, _ = api
    for path, body, field in (("/v1/placements", {**GUEST, "host": "elsewhere"}, "host"),
                              ("/v1/plans", {"hosts": ["t", "elsewhere"]}, "hosts"),
                              ("/v1/profiles", {"host": "elsewhere"}, "host"),
                              ("/v1/protect", {"host": "elsewhere"}, "host"),
                              ("/v1/reconcile", {"hosts": ["elsewhere"]}, "hosts")):
        response = client.post(path, json=body)
        assert response.status_code == 422, (path, response.text)
        [problem] = _error(response)["details"]
        assert (problem["field"], problem["rule"]) == (field, "not_configured") and "elsewhere" in problem["reason"]
    assert client.post("/v1/placements", json={**GUEST, "host": "t"}).status_code == 200


# ----- the typed parts of answers the server builds as dicts


def _plan_with_every_shape():  # type: ignore[no-untyped-def]
    from vmplacer.core.placement.guest_placement import GuestCell, Placement
    from vmplacer.core.rebalance.plan import Action, Plan

    def at(host: str, cpus: dict[int, set[int]], memory_node: int | None = None) -> Placement:
        cells = (GuestCell(id=0, vcpus=frozenset(cpus), memory_kib=1024, host_node=0, memory_node=memory_node),)
        return Placement(guest="g1", host=host, vcpupin={v: frozenset(c) for v, c in cpus.items()},
                         memory_nodes=frozenset({0}), cells=cells, memory_kib=1024, score=2)

    actions = (
        Action(0, "migrate", "h1", "g1", "h2", at("h1", {0: {0}}), at("h2", {0: {1}}, memory_node=2),
               reason="crowded", predicted_gain=0.4, cost={"downtime_s": 0.1, "perf_s": 3}, confidence=0.5),
        Action(1, "repin", "h2", "g1", None, at("h2", {0: {1}}, memory_node=2), at("h2", {0: {3}}),
               depends_on=(0,), state="succeeded", message="done"),
        Action(2, "probe", "h2", depends_on=(0, 1), parameters={"seconds": 5}),
    )
    return Plan(actions, ("h1", "h2"), id=7, objective_before=1.0, objective_after=1.6, created_at=1700000000.0)


def _sent_as(body: bytes, key: str, value: Any) -> bool:
    """Whether `body` carries `value` under `key` byte for byte as the untyped dict would be sent."""
    import pydantic_core

    return f'"{key}":'.encode() + pydantic_core.to_json(value) in body


def test_plan_actions_protected_guests_and_reconciled_hosts_are_named_schemas(spec):
    schemas = spec["components"]["schemas"]
    refs = {("PlanView", "actions"): "PlanAction", ("ProtectView", "guests"): "ProtectedGuest",
            ("ProtectView", "throttles"): "ProtectThrottle", ("ReconcileView", "hosts"): "ReconciledHost",
            ("ReconciledHost", "findings"): "ReconcileFinding", ("PlanAction", "before"): "GuestPinning",
            ("GuestPinning", "cells"): "GuestCell", ("PlanView", "diff"): "GuestDiff",
            ("JobResult", "actions"): "PlanAction"}
    for (model, field), name in refs.items():
        assert _named(schemas[model]["properties"][field]) == name, (model, field)
    assert _named(schemas["PlanAction"]["properties"]["kind"]) == "ActionKind"
    assert _named(schemas["PlanAction"]["properties"]["state"]) == "ActionState"
    assert _named(schemas["ReconcileFinding"]["properties"]["kind"]) == "FindingKind"
    for name in ("PlanAction", "GuestPinning", "GuestCell", "GuestDiff", "ProtectedGuest", "ProtectThrottle",
                 "ReconciledHost", "ReconcileFinding"):  # the server builds these with exactly the declared keys
        assert schemas[name]["additionalProperties"] is False, name
    assert "memory_node" not in schemas["GuestCell"]["required"]  # sent only when a cell has one
    assert "default" not in schemas["GuestCell"]["properties"]["memory_node"]
    diff = schemas["GuestDiff"]  # every key always sent, the predictions null when there are none
    assert set(diff["required"]) == set(diff["properties"]) == set(_plan_with_every_shape().diff()[0].to_dict())
    for side in ("perf_before", "perf_after"):
        assert {"type": "null"} in diff["properties"][side]["anyOf"]


def test_typed_parts_of_answers_are_the_bytes_the_server_built():
    from vmplacer.api.responses import validated_json
    from vmplacer.api.routes.plans import plan_view
    from vmplacer.api.schemas import ProtectView, PlanView, ReconcileView
    from vmplacer.app.observe.reconcile import HostResult, Outcome, ReconcileReport
    from vmplacer.core.protect.decisions import ThrottleFinding
    from vmplacer.core.reconcile import Finding

    plan = plan_view(_plan_with_every_shape())
    body = validated_json(PlanView, plan).body
    assert _sent_as(body, "actions", plan["actions"])
    assert b'"memory_node":2' in body and body.count(b'"memory_node"') == 2  # only where a cell has one
    assert b'"score":2}' in body  # an int stays an int

    guests = [{"guest": "web", "ratio": 0.83, "ratio_raw": None, "floor": 1, "state": "held",
               "throttles_applied": 5, "below_floor_s": 0}]
    throttles = [{"guest": "batch", "share": 0.3, "original_share": 1, "protects": "web", "plan_id": None,
                  "age_s": 95.0}]
    job = _job(PROTECT_JOB, None)
    protect = {"job": job, "host": "t", "last_round_at": None, "guests": guests, "budget": None, "pace": None,
               "throttles": throttles}
    body = validated_json(ProtectView, protect).body
    assert _sent_as(body, "guests", guests) and _sent_as(body, "throttles", throttles)

    finding = Finding(guest="old", host="t", kind="gone", action="release", detail="domain undefined",
                      recorded_state="running", age_s=12.5)
    hosts = [HostResult("t", "reconciled", "", [Outcome(finding, "would-apply")],
                        [ThrottleFinding("t", "batch", "throttle-gone", "no longer throttled")]),
             HostResult("u", "busy", "another run holds its lease")]
    report = ReconcileReport(dry_run=True, at=1.0, hosts=hosts).to_dict()
    body = validated_json(ReconcileView, report).body
    assert _sent_as(body, "hosts", report["hosts"])


class _UntypedJobResult(JobResult):
    actions: list[dict[str, Any]] | None = None


class _UntypedJobView(JobView):
    result: _UntypedJobResult | None = None


class _UntypedPlanView(PlanView):
    actions: list[dict[str, Any]]
    diff: list[dict[str, Any]]


def test_a_plans_diff_and_a_plan_jobs_actions_are_the_bytes_they_were_untyped():
    """The whole answer, typed, is byte for byte the answer with these lists as free-form objects:
    the keys in the server's order, a prediction that is an int stays one, a missing one is null."""
    from dataclasses import replace

    from vmplacer.api.job_views import outcome
    from vmplacer.api.responses import validated_json
    from vmplacer.api.routes.plans import plan_view

    predicted = replace(_plan_with_every_shape(), predicted={"g1": {"before": 0.55, "after": 1}})
    for plan in (plan_view(_plan_with_every_shape()), plan_view(predicted)):
        body = validated_json(PlanView, plan).body
        assert body == validated_json(_UntypedPlanView, plan).body
        assert _sent_as(body, "diff", plan["diff"]) and plan["diff"]
    assert b'"perf_before":null,"perf_after":null}' in validated_json(PlanView, plan_view(_plan_with_every_shape())
                                                                      ).body
    assert b'"perf_before":0.55,"perf_after":1}' in validated_json(PlanView, plan_view(predicted)).body

    for kind in (PLAN_JOB, APPLY_JOB):  # the result as the job store keeps it: JSON
        result = json.loads(json.dumps(outcome(plan_view(predicted), None)))
        record = JobRecord(id="00000000-0000-0000-0000-000000000002", kind=kind, hosts=("h1", "h2"),
                           status="succeeded", progress=1.0, message="", parameters={}, result=result,
                           created_by="ops", created_at=1.0)
        body = validated_json(JobView, job_view(record)).body
        assert body == validated_json(_UntypedJobView, job_view(record)).body
        assert _sent_as(body, "actions", result["actions"]) and len(result["actions"]) == 3
        typed = JobView.model_validate(job_view(record)).result
        assert typed is not None and typed.actions is not None
        assert [action.kind for action in typed.actions] == ["migrate", "repin", "probe"]


def test_the_token_is_checked_before_the_idempotency_key_and_integers_take_whole_numbers(api):
    """What schemathesis holds the server to: a request without a valid token is a 401 whatever
    else is wrong with it (a malformed key too); an `integer` is any JSON number without a
    fractional part, as JSON Schema has it, never a string or a fraction."""
    client, container = api
    from vmplacer.adapters.db.api import SqlTokenStore

    reader = SqlTokenStore(container.sessions).create("reader", "read")
    for token, status in (("Bearer wrong", 401), (f"Bearer {reader}", 403)):
        refused = client.post("/v1/reconcile", json={}, headers={"Authorization": token, "Idempotency-Key": "two words"})
        assert refused.status_code == status, refused.text
    bad_key = client.post("/v1/reconcile", json={"dry_run": True}, headers={"Idempotency-Key": "two words"})
    assert bad_key.status_code == 422 and _error(bad_key)["details"][0]["field"] == "Idempotency-Key"
    whole = client.post("/v1/placements", json={**GUEST, "vcpus": 1.0, "memory_mib": 64.0})
    assert whole.status_code == 200, whole.text
    for vcpus in ("1", 1.5, True):
        refused = client.post("/v1/placements", json={**GUEST, "vcpus": vcpus})
        assert refused.status_code == 422 and _error(refused)["details"][0]["field"] == "vcpus", vcpus
