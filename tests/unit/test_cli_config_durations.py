"""One duration convention in the config file: a key named for its unit (`*_s`) takes a number of
seconds, as its name says, or a number and its unit (`10m`), like `retention.*` and
`placement.model_refresh`; a refusal names the key, the units and the range."""

from __future__ import annotations

import re

import pytest

from vmplacer.config import ConfigError, settings_from_mapping
from vmplacer.config_schema import config_file_schema

HOST = {"name": "h", "uri": "test:///default"}


def read(document: dict):
    return settings_from_mapping({"hosts": [HOST], **document}, "t.yaml", environ={})


def test_seconds_keys_take_a_unit_or_a_number_of_seconds():
    settings = read({"hosts": [{**HOST, "domain_resync_s": "2m", "connect_timeout_s": 45}],
                     "profiler": {"t_sleep_s": "1h"},
                     "protect": {"interval_s": "500ms", "slow_interval_s": "1m", "budget_window_s": "1d",
                                 "startup_allowance_s": "600"},
                     "retention": {"plans": "30d"}})
    host = settings.host("h")
    assert (host.domain_resync_s, host.connect_timeout_s, settings.profiler.t_sleep_s) == (120.0, 45.0, 3600.0)
    protect = settings.protect
    assert (protect.interval_s, protect.slow_interval_s, protect.budget_window_s, protect.startup_allowance_s) == (
        0.5, 60.0, 86_400.0, 600.0)
    assert settings.retention.plans_s == 30 * 86_400.0


@pytest.mark.parametrize(("document", "said"), [
    ({"profiler": {"t_sleep_s": "10x"}},
     "key 'profiler.t_sleep_s': must be a number of seconds or a duration with a unit (s, m, h, d; e.g. 30s, 10m, "
     "1h), got '10x'"),
    ({"protect": {"interval_s": "2h"}}, "key 'protect.interval_s': must be between 200 ms and 1 h, got '2h'"),
    ({"hosts": [{**HOST, "connect_timeout_s": 0}]}, "key 'hosts[0].connect_timeout_s': must be between 1 and 3600"),
    ({"hosts": [{**HOST, "domain_resync_s": True}]}, "key 'hosts[0].domain_resync_s': must be a number of seconds"),
])
def test_a_bad_duration_names_the_key_the_units_and_the_range(document, said):
    with pytest.raises(ConfigError) as refused:
        read(document)
    assert said in str(refused.value), str(refused.value)


def test_the_schema_says_the_same():
    schema = config_file_schema()
    resync = schema["$defs"]["Host"]["properties"]["domain_resync_s"]
    assert {"type": "number", "minimum": 0, "maximum": 3600} in resync["anyOf"]
    text = next(branch for branch in resync["anyOf"] if branch.get("type") == "string")
    assert re.match(text["pattern"], "10m") and re.match(text["pattern"], "1d")
    assert not re.match(text["pattern"], "10x")
