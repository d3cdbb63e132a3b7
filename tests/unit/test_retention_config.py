"""The `retention:` config section, durations in days, and examples/vmplacer.yaml documenting
every key the config accepts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from vmplacer.cli.common import UsageError, parse_duration
from vmplacer.config import RETENTION_KEYS, ConfigError, RetentionSettings, load_settings, settings_from_mapping
from vmplacer.core.durations import duration_seconds

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vmplacer.yaml"
DAY = 86_400.0


def test_defaults_without_a_retention_section():
    retention = settings_from_mapping(None, "cfg.yaml", environ={}).retention
    assert retention == RetentionSettings()
    assert (retention.plans_s, retention.profiles_s, retention.audit_s, retention.jobs_s) == (
        30 * DAY, 90 * DAY, 180 * DAY, 7 * DAY)


@pytest.mark.parametrize(("value", "seconds"), [
    ("30d", 30 * DAY), ("12h", 12 * 3600.0), ("90m", 5400.0), ("3600s", 3600.0),
    ("1.5d", 1.5 * DAY), (" 2 d ", 2 * DAY), ("45s", 45.0), ("0.5s", 0.5),
])
def test_retention_durations(value, seconds):
    retention = settings_from_mapping({"retention": {"jobs": value}}, "cfg.yaml", environ={}).retention
    assert retention.jobs_s == pytest.approx(seconds)
    assert retention.plans_s == RetentionSettings().plans_s  # the others keep their defaults


@pytest.mark.parametrize(("retention", "key", "fragment"), [
    ({"plans": "soon"}, "retention.plans", "must be a duration"),
    ({"profiles": "-3d"}, "retention.profiles", "must be a duration"),
    ({"audit": "0s"}, "retention.audit", "longer than 0"),
    ({"audit": 30}, "retention.audit", "a duration needs a unit"),
    ({"jobs": "0d"}, "retention.jobs", "longer than 0"),
    ({"jobs": True}, "retention.jobs", "must be a duration"),
    ({"jobs": "3 weeks"}, "retention.jobs", "must be a duration"),
    ({"placements": "30d"}, "retention.placements", "unknown key"),
    ("30d", "retention", "must be a mapping"),
])
def test_bad_retention_names_file_and_key(retention, key, fragment):
    with pytest.raises(ConfigError) as excinfo:
        settings_from_mapping({"retention": retention}, "cfg.yaml", environ={})
    message = str(excinfo.value)
    assert message.startswith("cfg.yaml: ") and f"key '{key}'" in message and fragment in message


def test_days_only_where_asked_for():
    assert parse_duration("30d", "--older-than", "s", days=True) == 30 * DAY
    assert duration_seconds("1d", "s") is None
    with pytest.raises(UsageError, match="--tm: '1d' is not a duration \\(e.g. 500us, 10ms, 2.5s, 10m, 1h"):
        parse_duration("1d", "--tm", None)
    with pytest.raises(UsageError, match="--older-than: '3x' is not a duration \\(e.g. 12h, 30d"):
        parse_duration("3x", "--older-than", "s", days=True)
    # the units that existed before days keep their meaning, with or without days
    for text, unit, seconds in (("10ms", "ms", 0.01), ("10", "ms", 0.01), ("2m", "s", 120.0), ("1h", "s", 3600.0),
                                ("500us", "s", 0.0005), ("3min", "s", 180.0)):
        assert parse_duration(text, "--x", unit) == pytest.approx(seconds)
        assert parse_duration(text, "--x", unit, days=True) == pytest.approx(seconds)


# ----- the example config documents every key ------------------------------------------------------
def _allowed(document: object, key: str) -> list[str]:
    """The keys the config accepts at `key`, as its unknown-key error lists them."""
    with pytest.raises(ConfigError) as excinfo:
        settings_from_mapping(document, "cfg.yaml", environ={})
    message = str(excinfo.value)
    assert f"key '{key}'" in message, message
    match = re.search(r"allowed: ([^)]*)\)", message)
    assert match, message
    return [name.strip() for name in match.group(1).split(",")]


def test_example_documents_every_key():
    example = yaml.safe_load(EXAMPLE.read_text())
    host = {"name": "h", "uri": "test:///default"}
    sections = {
        "": (example, _allowed({"no-such-key": 1}, "no-such-key")),
        # across the example's hosts: `capabilities` belongs on a test-driver host only
        "hosts": ({name for entry in example["hosts"] for name in entry},
                  _allowed({"hosts": [{**host, "no-such-key": 1}]}, "hosts[0].no-such-key")),
        "profiler": (example["profiler"], _allowed({"profiler": {"no-such-key": 1}}, "profiler.no-such-key")),
        "api": (example["api"], _allowed({"api": {"no-such-key": 1}}, "api.no-such-key")),
        "retention": (example["retention"], _allowed({"retention": {"no-such-key": 1}}, "retention.no-such-key")),
    }
    for where, (documented, allowed) in sections.items():
        missing = [name for name in allowed if name not in documented]
        assert not missing, f"examples/vmplacer.yaml, {where or 'top level'}: undocumented keys {missing}"
    assert list(RETENTION_KEYS) == sections["retention"][1]


def test_example_retention_shows_the_defaults():
    assert load_settings(EXAMPLE, environ={}).retention == RetentionSettings()
