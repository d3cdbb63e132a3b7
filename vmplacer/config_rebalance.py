"""The `rebalance:` section of the config file: the rebalancing policy's settings, grouped
by the stage of planning they steer, each key mapped to one `RebalanceSettings` field.

The file sets the defaults every run starts from (`vmplacer rebalance`, the systemd timer,
the API's plans); a command-line flag overrides its key for that run. Values are checked by
type here and then by `RebalanceSettings` itself, and every problem names its key.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Literal

from vmplacer.core.durations import duration_seconds, is_bare_number
from vmplacer.core.rebalance.state import RebalanceInputError, RebalanceSettings

# "seconds": a duration key (`cooldown_s`), a number of seconds or text with a unit (`10m`), as
# everywhere in the file (core/durations.py)
Kind = Literal["number", "integer", "flag", "seconds"]

# stage -> key in the file -> (RebalanceSettings field, kind). Every field appears exactly once
# (tests/unit/test_config_rebalance.py holds that), so the file can say anything a flag can.
REBALANCE_KEYS: dict[str, dict[str, tuple[str, Kind]]] = {
    "hysteresis": {
        "min_gain": ("min_gain", "number"),
        "min_gain_share": ("min_gain_share", "number"),
        "min_migration_gain": ("min_migration_gain", "number"),
        "cooldown_s": ("cooldown_s", "seconds"),
        "backoff_s": ("backoff_s", "seconds"),
    },
    "objective": {
        "fairness": ("fairness", "number"),
        "latency_critical_weight": ("latency_critical_weight", "number"),
        "horizon_s": ("horizon_s", "seconds"),
    },
    "search": {
        "max_actions": ("max_actions", "integer"),
        "max_rounds": ("max_rounds", "integer"),
        "move_candidates": ("move_candidates", "integer"),
        "swap_candidates": ("swap_candidates", "integer"),
        "migration_candidates": ("migration_candidates", "integer"),
        "destination_candidates": ("destination_candidates", "integer"),
        "pin_floating_guests": ("pin_floating_guests", "flag"),
        "memory_budget_mib": ("memory_budget_mib", "integer"),
        "host_budget_s": ("host_budget_s", "number"),
    },
    "migration": {
        "allow": ("allow_migration", "flag"),
        "bandwidth_mib_s": ("migration_bandwidth_mib_s", "number"),
        "max_downtime_s": ("max_downtime_s", "seconds"),
        "copy_slowdown": ("copy_slowdown", "number"),
        "default_dirty_mib_s": ("default_dirty_mib_s", "number"),
        "memory_move_mib_s": ("memory_move_mib_s", "number"),
    },
    "exact": {
        "max_cpus": ("exact_max_cpus", "integer"),
        "time_s": ("exact_time_s", "number"),
        "budget_s": ("exact_budget_s", "number"),
        "exhaustive_limit": ("exhaustive_limit", "integer"),
    },
    "pessimistic": {
        "pessimism": ("pessimism", "number"),
        "guess_weight": ("guess_weight", "number"),
    },
    "probes": {
        "below_confidence": ("probe_below_confidence", "number"),
        "seconds": ("probe_seconds", "seconds"),
    },
    "trials": {
        "enabled": ("trials", "flag"),
        "seconds": ("trial_seconds", "seconds"),
        "min_gain": ("trial_min_gain", "number"),
        "tolerance": ("trial_tolerance", "number"),
        "recheck": ("trial_recheck", "number"),
        "refuted_bar": ("trial_refuted_bar", "number"),
        "memory_s": ("trial_memory_s", "seconds"),
        "max": ("trial_max", "integer"),
        "exploration": ("exploration", "number"),
    },
    "disruption": {
        "max_trials": ("max_trials", "integer"),
        "max_trial_repins": ("max_trial_repins", "integer"),
        "max_moves_per_guest_hour": ("max_moves_per_guest_hour", "integer"),
        "max_frozen_share_per_guest_hour": ("max_frozen_share_per_guest_hour", "number"),
        "max_migrations_in_flight": ("max_migrations_in_flight", "integer"),
    },
    "rounds": {
        "batch_hosts": ("round_batch_hosts", "integer"),
        "rest_s": ("round_rest_s", "seconds"),
        "parallel_hosts": ("parallel_hosts", "integer"),
    },
}

# keys the file no longer takes -> why (a file that still sets one is refused, the reason named,
# rather than the value silently ignored: the operator set it to get a behaviour that is gone)
RETIRED_KEYS: dict[str, str] = {
    "trials.step_trials": "removed: the single-step trials changed the rebalance benchmark's results by less "
                          "than 0.1 point (docs/research/rebalance-results.md §6, Ablation); delete the key",
    "trials.second_opinion": "removed: the second opinion (the model's other form on refuted hosts) changed the "
                             "rebalance benchmark's results by less than 0.1 point "
                             "(docs/research/rebalance-results.md §6, Ablation); "
                             "delete the key",
}

FIELD_KEYS: dict[str, str] = {name: f"rebalance.{stage}.{key}"
                              for stage, keys in REBALANCE_KEYS.items() for key, (name, _) in keys.items()}


def config_key_of(field_name: str) -> str:
    """The file's key for a `RebalanceSettings` field (for messages that name both)."""
    return FIELD_KEYS[field_name]


def _value(value: Any, kind: Kind) -> float | int | bool:
    """One value checked by kind; ValueError says the rule."""
    if kind == "seconds" and isinstance(value, str):
        seconds = float(value) if is_bare_number(value) else duration_seconds(value, "s", days=True)
        if seconds is None or not math.isfinite(seconds):
            raise ValueError("must be a number of seconds or a duration with a unit (s, m, h, d; e.g. 30s, 10m, 1h)")
        return seconds
    if kind == "flag":
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError({"integer": "must be a whole number", "seconds": "must be a number of seconds or a "
                          "duration with a unit (s, m, h, d; e.g. 30s, 10m, 1h)"}.get(kind, "must be a number"))
    if kind == "integer":
        if isinstance(value, float) and not value.is_integer():
            raise ValueError("must be a whole number")
        return int(value)
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return float(value)


def read_rebalance(raw: Any, problem: Any) -> RebalanceSettings:
    """Settings from the section's document (None: the defaults). `problem(key, reason)` notes
    one problem; every problem is noted, then the defaults stand in for a section in error."""
    if raw is None:
        return RebalanceSettings()
    if not isinstance(raw, dict):
        problem("rebalance", f"must be a mapping of stages ({', '.join(REBALANCE_KEYS)})")
        return RebalanceSettings()
    values: dict[str, Any] = {}
    failed = False
    for stage, section in raw.items():
        keys = REBALANCE_KEYS.get(stage) if isinstance(stage, str) else None
        if keys is None:
            problem(f"rebalance.{stage}", f"unknown stage (allowed: {', '.join(REBALANCE_KEYS)})")
            failed = True
            continue
        if section is None:
            continue
        if not isinstance(section, dict):
            problem(f"rebalance.{stage}", f"must be a mapping of {', '.join(keys)}")
            failed = True
            continue
        for key, value in section.items():
            retired = RETIRED_KEYS.get(f"{stage}.{key}")
            if retired:
                problem(f"rebalance.{stage}.{key}", retired)
                failed = True
                continue
            if key not in keys:
                problem(f"rebalance.{stage}.{key}", f"unknown key (allowed: {', '.join(keys)})")
                failed = True
                continue
            name, kind = keys[key]
            try:
                values[name] = _value(value, kind)
            except ValueError as exc:
                problem(f"rebalance.{stage}.{key}", f"{exc}, got {value!r}"[:200])
                failed = True
    defaults = RebalanceSettings()
    for name, value in values.items():  # each value against the settings' own rules, all reported
        try:
            replace(defaults, **{name: value})
        except RebalanceInputError as exc:
            text = str(exc)
            at = text.find(" must ")
            problem(FIELD_KEYS[name], text[at + 1:] if at >= 0 else text)
            failed = True
    return defaults if failed else replace(defaults, **values)


def rebalance_to_mapping(settings: RebalanceSettings) -> dict[str, dict[str, Any]]:
    """The section as the file spells it, every key with its value."""
    return {stage: {key: getattr(settings, name) for key, (name, _) in keys.items()}
            for stage, keys in REBALANCE_KEYS.items()}
