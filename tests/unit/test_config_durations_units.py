"""One duration convention in the config file: every duration key takes the units s, m, h and d;
a bare number is seconds only on a key whose name ends in `_s`, and refused elsewhere with a
message naming the key and asking for a unit. The reader, the JSON Schema and the shipped
schema say the same."""

from __future__ import annotations

import json
import re

import pytest

from vmplacer.api.file_schemas import SHIPPED_DIR
from vmplacer.config import ConfigError, settings_from_mapping
from vmplacer.config_schema import config_file_schema
from vmplacer.core.durations import bare_number_is_seconds, config_duration

HOST = {"name": "h", "uri": "test:///default"}
DAY = 86_400.0
UNITS = [("90s", 90.0), ("10m", 600.0), ("2h", 7200.0), ("1d", DAY), ("0.5d", 0.5 * DAY), (" 3 h ", 3 * 3600.0)]


def read(document: dict):
    return settings_from_mapping({"hosts": [HOST], **document}, "t.yaml", environ={})


def refusal(document: dict) -> str:
    with pytest.raises(ConfigError) as refused:
        read(document)
    return str(refused.value)


# A duration key not named for its unit, and how to read it back from the settings.
UNNAMED = [
    ("retention.plans", lambda v: {"retention": {"plans": v}}, lambda s: s.retention.plans_s),
    ("retention.profiles", lambda v: {"retention": {"profiles": v}}, lambda s: s.retention.profiles_s),
    ("retention.audit", lambda v: {"retention": {"audit": v}}, lambda s: s.retention.audit_s),
    ("retention.jobs", lambda v: {"retention": {"jobs": v}}, lambda s: s.retention.jobs_s),
    ("placement.model_refresh", lambda v: {"placement": {"model_refresh": v}},
     lambda s: s.placement.model_refresh_s),
]
# A key named for its unit, with a range that holds a day.
NAMED = [
    ("web.session_idle_s", lambda v: {"web": {"session_idle_s": v}}, lambda s: s.web.session_idle_s),
    ("profiler.t_sleep_s", lambda v: {"profiler": {"t_sleep_s": v}}, lambda s: s.profiler.t_sleep_s),
    ("protect.budget_window_s", lambda v: {"protect": {"budget_window_s": v}}, lambda s: s.protect.budget_window_s),
]


@pytest.mark.parametrize(("key", "document", "value"), UNNAMED + NAMED, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize(("text", "seconds"), UNITS, ids=[text.strip() for text, _ in UNITS])
def test_every_duration_key_takes_every_unit(key, document, value, text, seconds):
    assert value(read(document(text))) == pytest.approx(seconds)


@pytest.mark.parametrize(("key", "document", "value"), UNNAMED, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("bare", [30, 30.5, "30", " 30 "])
def test_a_bare_number_on_a_key_not_named_for_a_unit_is_refused_naming_key_and_rule(key, document, value, bare):
    message = refusal(document(bare))
    shown = str(bare) if not isinstance(bare, str) else repr(bare)
    assert f"t.yaml: key '{key}': a duration needs a unit (s, m, h, d), got {shown}" in message, message


def test_the_refusal_reads_as_the_operator_wrote_it():
    assert refusal({"retention": {"plans": 30}}).endswith("key 'retention.plans': a duration needs a unit "
                                                         "(s, m, h, d), got 30")


@pytest.mark.parametrize(("key", "document", "value"), NAMED, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize(("bare", "seconds"), [(600, 600.0), (90.5, 90.5), ("600", 600.0)])
def test_a_bare_number_on_a_key_named_for_seconds_is_still_seconds(key, document, value, bare, seconds):
    assert value(read(document(bare))) == seconds


@pytest.mark.parametrize(("document", "key", "rule"), [
    ({"retention": {"jobs": "0d"}}, "retention.jobs", "must be longer than 0"),
    ({"placement": {"model_refresh": "0s"}}, "placement.model_refresh", "must be longer than 0"),
    ({"placement": {"model_refresh": "soon"}}, "placement.model_refresh", "must be a duration with a unit"),
    ({"retention": {"audit": True}}, "retention.audit", "must be a duration with a unit"),
    ({"retention": {"audit": "3 weeks"}}, "retention.audit", "must be a duration with a unit (s, m, h, d"),
    ({"web": {"session_idle_s": "31d"}}, "web.session_idle_s", "must be between 1 s and 720 h"),
    ({"protect": {"interval_s": "1d"}}, "protect.interval_s", "must be between 200 ms and 1 h"),
    ({"profiler": {"t_sleep_s": float("inf")}}, "profiler.t_sleep_s", "must be a finite number of seconds"),
    ({"profiler": {"t_sleep_s": [1]}}, "profiler.t_sleep_s", "must be a number of seconds or a duration"),
])
def test_other_refusals_name_the_key_and_the_rule(document, key, rule):
    message = refusal(document)
    assert f"key '{key}': {rule}" in message, message


def test_model_refresh_takes_days_as_retention_does():
    settings = read({"placement": {"model_refresh": "1d"}, "retention": {"jobs": "1d"}})
    assert settings.placement.model_refresh_s == settings.retention.jobs_s == DAY


def test_the_rule_goes_by_the_key_name():
    assert bare_number_is_seconds("protect.interval_s") and bare_number_is_seconds("rebalance.rounds.rest_s")
    assert not bare_number_is_seconds("retention.plans") and not bare_number_is_seconds("placement.model_refresh")
    assert config_duration(30, "retention.plans") == "a duration needs a unit (s, m, h, d), got 30"
    assert config_duration(30, "x.interval_s") == 30.0


def _unnamed_schemas(schema: dict) -> list[dict]:
    defs = schema["$defs"]
    return [defs["placement"]["properties"]["model_refresh"],
            *(defs["retention"]["properties"][name] for name in ("plans", "profiles", "audit", "jobs"))]


@pytest.mark.parametrize("schema", [config_file_schema(),
                                    json.loads((SHIPPED_DIR / "config.schema.json").read_text("utf-8"))],
                         ids=["made", "shipped"])
def test_the_schema_asks_the_same_of_keys_not_named_for_a_unit(schema):
    for key in _unnamed_schemas(schema):
        assert not any(branch.get("type") in ("number", "integer") for branch in key["anyOf"]), key
        pattern = next(branch["pattern"] for branch in key["anyOf"] if branch.get("type") == "string")
        for text, _ in UNITS:
            assert re.match(pattern, text), (pattern, text)
        for bare in ("30", " 30 ", "1.5", "30x"):
            assert not re.match(pattern, bare), (pattern, bare)
    idle = schema["$defs"]["web"]["properties"]["session_idle_s"]
    assert {"type": "number", "minimum": 1, "maximum": 30 * DAY} in idle["anyOf"]
