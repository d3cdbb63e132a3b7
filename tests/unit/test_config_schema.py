"""The config file's JSON Schema says what the reader says: the same keys (a key the reader
does not know, the schema refuses; a key the settings write, the schema has), the same
choices, ranges and types, checked by a validator of its own (jsonschema_rs) against the
reader itself (settings_from_mapping)."""

from __future__ import annotations

import importlib.util
import json
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import require
from vmplacer.config import (CONFIG_KEYS, ConfigError, HostSettings, Settings, XmlPolicySettings,
                             settings_from_mapping, settings_to_mapping)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA: dict[str, Any] = json.loads((files("vmplacer") / "data" / "schemas" / "config.schema.json").read_text("utf-8"))
HOST = {"name": "h1", "uri": "test:///default"}


def _validator():
    require(importlib.util.find_spec("jsonschema_rs") is not None, "jsonschema_rs is not installed")
    import jsonschema_rs

    return jsonschema_rs.validator_for(SCHEMA)


def _document(section: str, key: str, value: Any) -> dict[str, Any]:
    """The smallest config holding `value` under `key` of `section` (a CONFIG_KEYS section)."""
    if section == "":
        return {key: value}
    if section == "hosts[]":
        return {"hosts": [{**HOST, key: value}]}
    if section == "hosts[].xml_policy":
        return {"hosts": [{**HOST, "xml_policy": {key: value}}]}
    if section.startswith("rebalance."):
        return {"rebalance": {section.split(".", 1)[1]: {key: value}}}
    return {section: {key: value}}


def _reader_problems(document: dict[str, Any]) -> list[str]:
    try:
        settings_from_mapping(document, "test.yaml", environ={})
    except ConfigError as exc:
        return list(exc.problems)
    return []


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _key_schema(section: str, key: str) -> dict[str, Any]:
    document_schema = SCHEMA
    for part in (section.replace("[]", "").split(".") if section else []):
        document_schema = _resolve(document_schema["properties"][part])
        document_schema = _resolve(document_schema.get("items", document_schema))
    return document_schema["properties"][key]


def _all_keys() -> list[tuple[str, str]]:
    return [(section, key) for section, keys in CONFIG_KEYS.items() for key in keys]


def test_the_example_config_and_what_config_show_writes_are_valid_by_the_schema():
    validator = _validator()
    example = yaml.safe_load((ROOT / "examples" / "vmplacer.yaml").read_text())
    assert [error.message for error in validator.iter_errors(example)] == []
    shown = settings_to_mapping(settings_from_mapping(example | {"hosts": [HOST]}, "example", environ={}))
    assert [error.message for error in validator.iter_errors(shown)] == []


@pytest.mark.parametrize("section", sorted(CONFIG_KEYS), ids=lambda s: s or "top")
def test_a_key_the_reader_does_not_know_the_schema_refuses(section):
    document = _document(section, "no_such_key", 1)
    problems = _reader_problems(document)
    assert any("no_such_key" in p and "unknown" in p for p in problems), problems
    assert not _validator().is_valid(document)


WRONG = [
    ("", "data_dir", 5), ("", "database_url", ["sqlite://"]), ("", "hosts", []), ("", "hosts", "h1"),
    ("", "profiler", [1]), ("", "retention", "30d"), ("", "rebalance", "fast"),
    ("hosts[]", "name", "bad name!"), ("hosts[]", "name", 5), ("hosts[]", "uri", 5), ("hosts[]", "uri", "  "),
    ("hosts[]", "reserved_cpus", [0]), ("hosts[]", "domain_type", "xen"), ("hosts[]", "sampler", "perf"),
    ("hosts[]", "cpu_allocation_ratio", "4"), ("hosts[]", "reserved_memory_mib_per_node", 1.5),
    ("hosts[]", "domain_resync_s", True), ("hosts[]", "xml_policy", ["hostdev"]), ("hosts[]", "capabilities", 5),
    ("hosts[].xml_policy", "allow", "hostdev"), ("hosts[].xml_policy", "allow", ["no-such-exception"]),
    ("hosts[].xml_policy", "storage_paths", "/srv"), ("hosts[].xml_policy", "storage_paths", ["images"]),
    ("profiler", "t_m_ms", "10"), ("profiler", "excluded_domains", [1]), ("profiler", "scope", []),
    ("profiler", "scope", "*"), ("profiler", "sensitive", "some"), ("profiler", "pair_probes", 2.5),
    ("placement", "interference_candidates", 1.5), ("placement", "model_refresh", "30"), ("placement", "model_refresh", 60),
    ("placement", "model_refresh", True), ("placement", "model_refresh", 0), ("api", "listen", "localhost"),
    ("api", "max_request_bytes", "1M"), ("retention", "plans", "1w"), ("retention", "plans", 30), ("retention", "jobs", "7"), ("retention", "audit", 0),
    ("retention", "jobs", False), ("protect", "latency_critical_floor", "off"), ("protect", "batch_min_share", True),
    ("protect", "step", "0.1"), ("rebalance", "search", [1]), ("rebalance.hysteresis", "min_gain", "0.1"),
    ("rebalance.search", "max_actions", 2.5), ("rebalance.migration", "allow", "yes"),
    ("rebalance.trials", "enabled", 1),
]


@pytest.mark.parametrize("section, key, value", WRONG, ids=lambda v: repr(v))
def test_a_wrong_value_both_the_reader_and_the_schema_refuse(section, key, value):
    document = _document(section, key, value)
    problems = _reader_problems(document)
    assert any(f"{key}" in p for p in problems), problems
    assert not _validator().is_valid(document), f"the schema let {section}.{key}: {value!r} through"


def _bounded() -> list[tuple[str, str, dict[str, Any]]]:
    """Every key whose schema has a numeric range, with the branch that holds it."""
    found = []
    for section, key in _all_keys():
        schema = _key_schema(section, key)
        for branch in [schema, *schema.get("anyOf", [])]:
            if "minimum" in branch:
                found.append((section, key, branch))
    return found


@pytest.mark.parametrize("section, key, branch", _bounded(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_schemas_ranges_are_the_readers(section, key, branch):
    """At each bound both accept; just beyond it both refuse: a range changed in the reader
    alone (or in the table alone) fails here."""
    assert _bounded(), "the schema has ranges"
    low, high = branch["minimum"], branch["maximum"]

    def step(bound: float) -> float:  # the nearest value beyond a bound either could tell apart
        return 1 if branch["type"] == "integer" else max(abs(bound), 1) * 1e-9

    validator = _validator()
    for value in (low, high):
        document = _document(section, key, value)
        assert [p for p in _reader_problems(document) if key in p] == [], value
        assert validator.is_valid(document), value
    for value in (low - step(low), high + step(high)):
        document = _document(section, key, value)
        assert any(key in p for p in _reader_problems(document)), value
        assert not validator.is_valid(document), value


def test_the_schema_has_exactly_the_keys_the_settings_write():
    """Adding a setting (to settings_to_mapping and the reader) without its key in the table
    fails here, and so does a key in the table the settings never write."""
    settings = Settings(Path("/srv/vmplacer"), "sqlite:////srv/vmplacer/vmplacer.db",
                        (HostSettings("h1", "test:///default", xml_policy=XmlPolicySettings(storage_paths=("/srv",))),))
    compared: list[str] = []

    def same_keys(value: Any, schema: dict[str, Any], path: str) -> None:
        schema = _resolve(schema)
        if isinstance(value, dict):
            assert sorted(value) == sorted(schema["properties"]), path or "top level"
            assert schema["additionalProperties"] is False, path
            compared.append(path)
            for name, item in value.items():
                same_keys(item, schema["properties"][name], f"{path}.{name}".lstrip("."))
        elif isinstance(value, list) and "items" in schema:
            for item in value:
                same_keys(item, schema["items"], f"{path}[]")

    same_keys(settings_to_mapping(settings), SCHEMA, "")
    assert sorted(compared) == sorted(CONFIG_KEYS), "every section of the reader was compared"
