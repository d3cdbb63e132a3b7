"""The config file's `rebalance:` section: every policy setting has one key, grouped by
stage; values are checked with every problem named; flags override the file per run."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from vmplacer.config import ConfigError, settings_from_mapping
from vmplacer.config_rebalance import REBALANCE_KEYS, RETIRED_KEYS, read_rebalance
from vmplacer.core.rebalance.state import RebalanceSettings


def test_every_setting_has_exactly_one_key():
    mapped = [name for keys in REBALANCE_KEYS.values() for name, _ in keys.values()]
    assert sorted(mapped) == sorted(f.name for f in fields(RebalanceSettings))
    assert len(mapped) == len(set(mapped))


def test_values_from_the_file_reach_the_settings():
    settings = settings_from_mapping({"rebalance": {
        "hysteresis": {"min_gain": 0.02, "cooldown_s": 1200},
        "search": {"max_actions": 4},
        "migration": {"allow": False},
        "trials": {"enabled": False, "max": 1},
    }}, "vmplacer.yaml", environ={}).rebalance
    assert (settings.min_gain, settings.cooldown_s, settings.max_actions) == (0.02, 1200.0, 4)
    assert not settings.allow_migration and not settings.trials and settings.trial_max == 1
    assert settings.fairness == RebalanceSettings().fairness  # untouched keys keep their defaults


def test_without_the_section_the_defaults_hold():
    assert settings_from_mapping(None, "t", environ={}).rebalance == RebalanceSettings()
    assert settings_from_mapping({"rebalance": None}, "t", environ={}).rebalance == RebalanceSettings()


def test_every_problem_is_named_at_once():
    with pytest.raises(ConfigError) as excinfo:
        settings_from_mapping({"rebalance": {
            "hysteresis": {"min_gain": -1, "min_gian": 0.1},
            "serach": {},
            "search": {"max_actions": 2.5},
            "migration": {"allow": "no"},
            "pessimistic": {"guess_weight": 3},
        }}, "vmplacer.yaml", environ={})
    problems = excinfo.value.problems
    expected = {
        "rebalance.hysteresis.min_gain": "must be a number >= 0",
        "rebalance.hysteresis.min_gian": "unknown key (allowed: min_gain,",
        "rebalance.serach": "unknown stage (allowed: hysteresis,",
        "rebalance.search.max_actions": "must be a whole number",
        "rebalance.migration.allow": "must be true or false",
        "rebalance.pessimistic.guess_weight": "must be in [0, 1]",
    }
    for key, rule in expected.items():
        assert any(f"vmplacer.yaml: key '{key}': {rule}" in p for p in problems), (key, problems)
    assert len(problems) == len(expected)


def test_a_retired_key_is_refused_with_why_it_went():
    """A file that still sets a removed setting is told so, not silently run without it."""
    with pytest.raises(ConfigError) as excinfo:
        settings_from_mapping({"rebalance": {"trials": {"step_trials": 2, "max": 3}}}, "vmplacer.yaml", environ={})
    (problem,) = excinfo.value.problems
    assert "key 'rebalance.trials.step_trials': removed:" in problem and "delete the key" in problem
    for key in RETIRED_KEYS:  # gone from the table the file and its schema are made of
        stage, name = key.split(".")
        assert name not in REBALANCE_KEYS.get(stage, {})


def test_a_flag_overrides_the_file_for_one_run():
    from vmplacer.cli.rebalance import settings_with_flags

    from_file = settings_from_mapping({"rebalance": {"hysteresis": {"min_gain": 0.02},
                                                     "search": {"max_actions": 4}}}, "t", environ={}).rebalance
    run = settings_with_flags(argparse.Namespace(max_actions=2, min_gain=None), from_file)
    assert (run.max_actions, run.min_gain) == (2, 0.02)
    assert settings_with_flags(argparse.Namespace(), from_file) == from_file


def test_duration_keys_take_a_unit_like_every_duration_of_the_file():
    problems: list[tuple[str, str]] = []
    settings = read_rebalance({"hysteresis": {"cooldown_s": "15m", "backoff_s": "1h"},
                               "trials": {"seconds": "3s", "memory_s": "1d"}, "probes": {"seconds": 5},
                               "rounds": {"rest_s": "90"}}, lambda key, reason: problems.append((key, reason)))
    assert problems == []
    assert (settings.cooldown_s, settings.backoff_s, settings.trial_seconds, settings.trial_memory_s,
            settings.probe_seconds, settings.round_rest_s) == (900.0, 3600.0, 3.0, 86400.0, 5.0, 90.0)
    for bad in ("10 parsecs", "nan", "-5m", True):
        problems.clear()
        read_rebalance({"hysteresis": {"cooldown_s": bad}}, lambda key, reason: problems.append((key, reason)))
        assert [key for key, _ in problems] == ["rebalance.hysteresis.cooldown_s"], (bad, problems)
        assert "a duration with a unit" in problems[0][1]
    problems.clear()  # a rate is not a duration: `*_mib_s` keys stay numbers
    read_rebalance({"migration": {"bandwidth_mib_s": "10m"}}, lambda key, reason: problems.append((key, reason)))
    assert problems and "must be a number" in problems[0][1]
