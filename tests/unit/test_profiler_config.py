"""Settings → ProfilerConfig in one place: the config's defaults, each caller's values over them."""

from __future__ import annotations

import pytest

from vmplacer.app.observe.profiler import SensitiveSelector
from vmplacer.bootstrap.profiler_config import SensitiveSpecError, profiler_config
from vmplacer.config import ProfilerSettings

DEFAULTS = ProfilerSettings(t_m_ms=20.0, t_sleep_s=7.0, max_freeze_ms=400.0, excluded_domains=("infra-*",),
                            scope=("web-*", "db-*"), sensitive="class:latency-critical")


def test_unset_values_come_from_the_settings():
    config = profiler_config(DEFAULTS)
    assert (config.t_m_s, config.t_sleep_s, config.max_freeze_s) == (0.02, 7.0, 0.4)
    assert config.excluded == ("infra-*",) and config.scope == ("web-*", "db-*")
    assert config.sensitive.workload_class == "latency-critical"
    assert config.samples is None and config.duration_s is None and not config.adaptive
    assert config.pair_probes == DEFAULTS.pair_probes == 4


def test_given_values_win_and_exclusions_add_up():
    config = profiler_config(DEFAULTS, t_m_s=0.005, t_sleep_s=0.0, max_freeze_s=0.1, sensitive="all",
                             vms=["web-1"], exclude=["db-2"], scope=["web-1"], samples=3, adaptive=True)
    assert (config.t_m_s, config.t_sleep_s, config.max_freeze_s) == (0.005, 0.0, 0.1)
    assert config.excluded == ("infra-*", "db-2") and config.scope == ("web-1",)
    assert config.sensitive == SensitiveSelector(frozenset({"web-1"}))
    assert config.samples == 3 and config.adaptive
    assert profiler_config(DEFAULTS, pair_probes=0).pair_probes == 0
    ready = SensitiveSelector(frozenset({"db-1"}))
    assert profiler_config(DEFAULTS, sensitive=ready).sensitive is ready


def test_a_bad_sensitive_spec_is_told_apart_from_inconsistent_values():
    with pytest.raises(SensitiveSpecError, match="label:KEY=VALUE"):
        profiler_config(DEFAULTS, sensitive="some")
    with pytest.raises(ValueError, match="must be shorter than max_freeze") as caught:
        profiler_config(DEFAULTS, t_m_s=0.5)
    assert not isinstance(caught.value, SensitiveSpecError)


def test_the_api_passes_pair_probes_through_and_names_the_field_it_refuses():
    from types import SimpleNamespace

    from vmplacer.api.errors import ApiError
    from vmplacer.api.routes.profiles import profiler_config as from_request

    settings = SimpleNamespace(profiler=DEFAULTS)
    assert from_request({"pair_probes": 2}, settings).pair_probes == 2
    assert from_request({}, settings).pair_probes == DEFAULTS.pair_probes
    with pytest.raises(ApiError) as refused:
        from_request({"pair_probes": -1}, settings)
    assert refused.value.status == 422 and "pair_probes" in str(refused.value.details)
