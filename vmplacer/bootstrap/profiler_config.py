"""Settings → `ProfilerConfig`: the one place the config's profiler defaults meet what a
caller asked for (a CLI command, an API request, the rebalancer's probe, the protection loop).

Kept apart from `profiler.py` so validating a request loads no libvirt or database adapter.
"""

from __future__ import annotations

from collections.abc import Sequence

from vmplacer.app.observe.profiler import ProfilerConfig, SensitiveSelector
from vmplacer.config import ProfilerSettings


class SensitiveSpecError(ValueError):
    """The sensitive-set spec is not all, label:KEY=VALUE or class:NAME."""


def profiler_config(
    defaults: ProfilerSettings,
    *,
    t_m_s: float | None = None,
    t_sleep_s: float | None = None,
    max_freeze_s: float | None = None,
    sensitive: str | SensitiveSelector | None = None,
    vms: Sequence[str] = (),
    exclude: Sequence[str] = (),
    scope: Sequence[str] = (),
    samples: int | None = None,
    duration_s: float | None = None,
    adaptive: bool = False,
    pair_probes: int | None = None,
) -> ProfilerConfig:
    """A profiler configuration: each value the caller gives, else the settings' default.

    `sensitive` is a spec (default: the settings') naming which of `vms` get ζb, or a ready
    selector; `exclude` adds to the configured exclusions; an empty `scope` is the configured
    one. Raises SensitiveSpecError for a bad spec and ValueError for inconsistent values."""
    if not isinstance(sensitive, SensitiveSelector):
        try:
            sensitive = SensitiveSelector.parse(sensitive or defaults.sensitive, list(vms))
        except ValueError as exc:
            raise SensitiveSpecError(str(exc)) from None
    return ProfilerConfig(
        t_m_s=t_m_s if t_m_s is not None else defaults.t_m_ms / 1e3,
        t_sleep_s=t_sleep_s if t_sleep_s is not None else defaults.t_sleep_s,
        max_freeze_s=max_freeze_s if max_freeze_s is not None else defaults.max_freeze_ms / 1e3,
        sensitive=sensitive,
        excluded=tuple(defaults.excluded_domains) + tuple(exclude),
        scope=tuple(scope) or defaults.scope,
        samples=samples,
        duration_s=duration_s,
        adaptive=adaptive,
        pair_probes=pair_probes if pair_probes is not None else defaults.pair_probes,
    )
