"""Guest protection policy: labels and flavor extra specs, validation, per-class defaults."""

from __future__ import annotations

import pytest

from vmplacer.core.placement.guest import GuestSpec, GuestSpecError
from vmplacer.core.protect.policy import (
    MIN_SHARE_LABEL,
    PROTECT_LABEL,
    Protection,
    ProtectionDefaults,
    ProtectionError,
    protection_of,
)


def spec(**fields) -> GuestSpec:
    base = {"name": "web1", "vcpus": 2, "memory_mib": 512}
    base.update(fields)
    return GuestSpec.from_mapping(base)


def problems(**fields) -> list[str]:
    with pytest.raises(GuestSpecError) as caught:
        spec(**fields)
    return [str(p) for p in caught.value.problems]


def test_extra_specs_become_protection_labels():
    guest = spec(extra_specs={"vmplacer:protect": "0.85"})
    assert guest.labels == {PROTECT_LABEL: "0.85"}
    batch = spec(name="b1", extra_specs={"vmplacer:min_cpu_share": 0.2})
    assert batch.labels == {MIN_SHARE_LABEL: "0.2"}


def test_label_and_agreeing_extra_spec_are_one_value():
    guest = spec(labels={PROTECT_LABEL: "0.80"}, extra_specs={"vmplacer:protect": "0.8"})
    assert guest.labels[PROTECT_LABEL] == "0.80"


@pytest.mark.parametrize(("fields", "expected"), [
    ({"labels": {PROTECT_LABEL: "1.5"}}, "guest web1: field labels.vmplacer.protect: must be a ratio 0.05..0.99"),
    ({"labels": {PROTECT_LABEL: "high"}}, "guest web1: field labels.vmplacer.protect: must be a number"),
    ({"extra_specs": {"vmplacer:min_cpu_share": "0"}},
     "guest web1: field extra_specs.vmplacer:min_cpu_share: must be a fraction 0.01..1.0"),
    ({"extra_specs": {"vmplacer:min_cpu_share": True}},
     "guest web1: field extra_specs.vmplacer:min_cpu_share: must be a number"),
    ({"extra_specs": {"vmplacer:protekt": "0.8"}}, "guest web1: field extra_specs.vmplacer:protekt: not supported"),
    ({"labels": {PROTECT_LABEL: "0.8"}, "extra_specs": {"vmplacer:protect": "0.9"}},
     "guest web1: field extra_specs.vmplacer:protect: conflicts with labels.vmplacer.protect='0.8'"),
    ({"labels": {PROTECT_LABEL: "0.8", MIN_SHARE_LABEL: "0.3"}},
     "guest web1: field labels.vmplacer.min_cpu_share: a guest protected by vmplacer.protect is never throttled"),
    ({"labels": {PROTECT_LABEL: "nan"}}, "guest web1: field labels.vmplacer.protect: must be a finite number"),
])
def test_bad_protection_values_name_guest_field_and_rule(fields, expected):
    lines = problems(**fields)
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_labels_win_over_class_defaults():
    defaults = ProtectionDefaults()
    assert protection_of({PROTECT_LABEL: "0.9", "workload_class": "batch"}, defaults) == \
        Protection(floor=0.9, source="labels")
    assert protection_of({MIN_SHARE_LABEL: "0.5"}, defaults, "latency-critical") == \
        Protection(min_share=0.5, source="labels")


def test_class_defaults_are_configurable_and_can_be_switched_off():
    defaults = ProtectionDefaults(latency_critical_floor=0.8, batch_min_share=0.3)
    assert protection_of({"workload_class": "latency-critical"}, defaults).floor == 0.8
    assert protection_of({"workload_class": "batch"}, defaults).min_share == 0.3
    off = ProtectionDefaults(latency_critical_floor=None, batch_min_share=None)
    assert not protection_of({"workload_class": "latency-critical"}, off).protected
    assert not protection_of({"workload_class": "batch"}, off).throttleable


def test_unlabelled_unknown_guest_is_neither_protected_nor_throttleable():
    policy = protection_of({}, ProtectionDefaults())
    assert not policy.protected and not policy.throttleable and policy.source == "none"


def test_labels_edited_by_hand_to_nonsense_protect_nobody():
    policy = protection_of({PROTECT_LABEL: "lots"}, ProtectionDefaults(), "latency-critical")
    assert not policy.protected and not policy.throttleable and policy.source == "invalid labels"


def test_min_share_of_one_opts_out_of_throttling():
    assert not protection_of({MIN_SHARE_LABEL: "1.0"}, ProtectionDefaults()).throttleable


def test_bad_defaults_are_refused_with_their_key():
    with pytest.raises(ProtectionError, match="protect.latency_critical_floor: must be a ratio"):
        ProtectionDefaults(latency_critical_floor=1.2)
    with pytest.raises(ProtectionError, match="protect.batch_min_share: must be a fraction"):
        ProtectionDefaults(batch_min_share=0.0)


def test_config_sets_class_defaults_and_loop_steps():
    from vmplacer.config import settings_from_mapping

    settings = settings_from_mapping({"protect": {"latency_critical_floor": 0.8, "batch_min_share": "none",
                                                  "step": 0.05}}, "test.yaml", environ={})
    assert settings.protect.defaults == ProtectionDefaults(latency_critical_floor=0.8, batch_min_share=None)
    assert settings.protect.step == 0.05


@pytest.mark.parametrize(("document", "key"), [
    ({"protect": {"latency_critical_floor": 1.0}}, "protect.latency_critical_floor"),
    ({"protect": {"batch_min_share": "half"}}, "protect.batch_min_share"),
    ({"protect": {"step": 0}}, "protect.step"),
    ({"protect": {"floor": 0.8}}, "protect.floor"),
])
def test_bad_protect_config_names_the_key(document, key):
    from vmplacer.config import ConfigError, settings_from_mapping

    with pytest.raises(ConfigError, match=f"key '{key}'"):
        settings_from_mapping(document, "test.yaml", environ={})
