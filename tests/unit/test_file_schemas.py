"""The JSON Schemas of a request file and of the config file ship with the package and equal what
their sources (the API's guest model, the config reader's key table) generate now: they never
drift. The request schema says of the shipped examples what the loader says; the config schema's
agreement with its reader is tests/unit/test_config_schema.py's."""

from __future__ import annotations

import importlib.util
import json
from importlib.resources import files
from pathlib import Path

import pytest
import yaml

from tests.support import require
from vmplacer.adapters.request_file import RequestFileError, load_request_file
from vmplacer.api.file_schemas import GENERATED, schema_text
from vmplacer.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_REQUESTS = sorted((ROOT / "examples" / "requests").glob("*.yaml"))


def shipped(kind: str) -> str:
    return (files("vmplacer") / "data" / "schemas" / f"{kind}.schema.json").read_text("utf-8")


@pytest.mark.parametrize("kind", sorted(GENERATED))
def test_the_shipped_schema_is_what_the_model_generates(kind):
    assert shipped(kind) == schema_text(GENERATED[kind]()), (
        f"vmplacer/data/schemas/{kind}.schema.json is stale: run `python -m vmplacer.api.file_schemas`")


@pytest.mark.parametrize("kind", ["request", "config"])
def test_the_command_prints_the_shipped_schema(capsys, kind):
    assert main(["config", "schema", kind]) == 0
    assert capsys.readouterr().out == shipped(kind)


def _validator():
    """jsonschema_rs (a dev dependency, through schemathesis): the schema is checked by a
    validator of its own, not by the model that made it."""
    require(importlib.util.find_spec("jsonschema_rs") is not None, "jsonschema_rs is not installed")
    import jsonschema_rs

    return jsonschema_rs.validator_for(json.loads(shipped("request")))


@pytest.mark.parametrize("path", EXAMPLE_REQUESTS, ids=lambda p: p.name)
def test_every_example_request_file_is_valid_by_the_schema_and_by_the_loader(path):
    assert EXAMPLE_REQUESTS, "examples/requests/ holds request files"
    errors = [error.message for error in _validator().iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []
    assert len(load_request_file(path)) == len(yaml.safe_load(path.read_text())["guests"])


@pytest.mark.parametrize("text, wrong", [
    ("guests: []\n", "guests"),
    ("guests:\n  - {name: a, vcpus: 2, memory_mib: 512}\nhosts: [h1]\n", "hosts"),
    ("guests:\n  - {name: a, vcpus: \"2\", memory_mib: 512}\n", "vcpus"),
    ("guests:\n  - {name: a, vcpus: 2}\n", "memory_mib"),
    ("guests:\n  - {name: a, vcpus: 2, memory_mib: 512, cpu_policy: pinned}\n", "cpu_policy"),
])
def test_a_file_the_loader_refuses_the_schema_refuses_too(tmp_path, text, wrong):
    path = tmp_path / "request.yaml"
    path.write_text(text)
    with pytest.raises(RequestFileError) as refused:
        load_request_file(path)
    assert wrong in str(refused.value)
    assert list(_validator().iter_errors(yaml.safe_load(text))), f"the schema let {wrong!r} through"
