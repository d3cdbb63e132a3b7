"""Answers validated on the route's own thread equal what FastAPI's response_model makes."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.exceptions import ResponseValidationError
from fastapi.testclient import TestClient

from vmplacer.api.responses import validated_json
from vmplacer.api.schemas import PlacementView

ANSWER = {
    "guest": "g1", "host": "h", "state": "defined", "dry_run": False,
    "placement": {"guest": "g1", "vcpupin": {"0": [1, 2]}, "score": 0.1 + 0.2, "label": "ünïcode"},
    "xml": "<domain type=\"kvm\">\n  <name>g1</name>\n</domain>\n", "domain_uuid": None,
    "narrowed": ["g0"], "narrowed_pins": [{"guest": "g0", "host": "h", "vcpupin": {"0": [3]}, "emulatorpin": [3]}],
    "isolation_violations": [], "candidates": [{"host": "h", "score": 1e-7}],
}


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/framework", response_model=PlacementView, status_code=201)
    def framework() -> dict:
        return ANSWER

    @app.post("/here", response_model=PlacementView)
    def here() -> object:
        return validated_json(PlacementView, ANSWER, status_code=201, headers={"Location": "/v1/placements/g1"})

    return app


def test_the_answer_is_the_bytes_fastapi_would_send():
    client = TestClient(_app())
    framework, here = client.post("/framework"), client.post("/here")
    assert here.status_code == framework.status_code == 201
    assert here.content == framework.content
    assert here.headers["content-type"] == framework.headers["content-type"] == "application/json"
    assert here.headers["location"] == "/v1/placements/g1"


def test_an_answer_that_breaks_its_model_is_refused_naming_the_field():
    broken = {key: value for key, value in ANSWER.items() if key != "xml"}
    with pytest.raises(ResponseValidationError) as refused:
        validated_json(PlacementView, {**broken, "narrowed": "not a list"})
    fields = {error["loc"] for error in refused.value.errors()}
    assert fields == {("response", "xml"), ("response", "narrowed")}
