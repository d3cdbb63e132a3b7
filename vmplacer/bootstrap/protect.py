"""Composition of the protection loop: the libvirt host, Freeze'nSense rounds, the rebalancer's
executor (leases, plans, audit, throttle ledger) and the learned interference model."""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Sequence

from vmplacer.adapters.libvirt_freeze import labels_from_xml
from vmplacer.adapters.protect_history import ProtectHistory
from vmplacer.app.observe.profiler import SensitiveSelector
from vmplacer.app.protect.loop import Measurement, ProtectLoop
from vmplacer.bootstrap.container import Container
from vmplacer.bootstrap.profiler import build_profiler
from vmplacer.bootstrap.profiler_config import profiler_config
from vmplacer.bootstrap.rebalance import build_rebalancer
from vmplacer.config import ProtectSettings
from vmplacer.core.model.profile_stats import measured_share
from vmplacer.core.protect.decisions import LoopSettings
from vmplacer.core.protect.cadence import CadenceSettings
from vmplacer.ports import DomainFacts


class _ProtectHost:
    """The libvirt host as the loop reads it: domains, bandwidth, and labels with the workload class."""

    def __init__(self, container: Container, name: str):
        self._host = container.hypervisor(name)
        self._labels = labels_from_xml(self._host)
        self.name = name

    def __getattr__(self, item: str):  # type: ignore[no-untyped-def]
        return getattr(self._host, item)

    def domain_facts(self, names: list[str]) -> dict[str, DomainFacts]:
        facts = {}
        for name in names:
            try:
                facts[name] = DomainFacts(None, self._labels(name))
            except Exception:  # noqa: BLE001 - a domain gone or foreign: no labels, never protected
                facts[name] = DomainFacts(None, {})
        return facts


def build_protect_loop(container: Container, host_name: str, *, scope: Sequence[str] = ("*",),
                       samples: int = 5, t_m_s: float | None = None, holder: str = "protect",
                       interval_s: float | None = None, record: bool = True) -> ProtectLoop:
    """A ready loop for one host; `scope` (globs) limits the guests it reads, freezes and may throttle;
    `samples` and `interval_s` are its fast pace (it backs off from there while floors hold)."""
    settings = container.settings
    protect = settings.protect
    t_m = t_m_s if t_m_s is not None else settings.profiler.t_m_ms / 1e3
    patterns = tuple(scope)
    rebalancer = build_rebalancer(container, holder=holder, measure_demand=False)

    def in_scope(name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)

    def measure(names: list[str], samples: int) -> Measurement:
        # Short freezes, close together: a protection round must answer within its interval.
        # No pair probes: the ratio is all it asks, and its freezes count against a budget.
        config = profiler_config(settings.profiler, t_m_s=t_m, t_sleep_s=max(0.05, t_m * 2),
                                 max_freeze_s=max(0.5, t_m * 4), samples=samples, scope=patterns,
                                 sensitive=SensitiveSelector(frozenset(names)), pair_probes=0)
        profiler, freezer = build_profiler(container, host_name, config, store=False)
        started = time.monotonic()
        try:
            result = profiler.run()
        finally:
            freezer.close()
        shares = {name: measured_share(vm.zeta, vm.zeta_b) for name, vm in result.vms.items() if name in names}
        ratios = {name: share for name, share in shares.items() if share is not None}
        wall = time.monotonic() - started
        return Measurement(ratios, result.frozen_s, wall)

    def propose(host: str):  # type: ignore[no-untyped-def]
        return rebalancer.make_plan([host])

    return ProtectLoop(
        _ProtectHost(container, host_name), measure=measure, ledger=container.throttle_ledger,
        plans=rebalancer.plans, apply=lambda plan_id: rebalancer.apply(plan_id, lease_ttl_s=120.0, wait_s=5.0),
        clock=rebalancer.clock, wall=time.time, defaults=protect.defaults,
        settings=LoopSettings(step=protect.step, release_margin=protect.release_margin),
        model=container.load_model, propose=propose, scope=in_scope,
        cadence=cadence_of(protect, samples, interval_s), t_m_s=t_m,
        history=ProtectHistory.in_data_dir(settings.data_dir).append if record else None,
    )


def cadence_of(protect: ProtectSettings, samples: int, interval_s: float | None) -> CadenceSettings:
    fast = interval_s if interval_s is not None else protect.interval_s
    return CadenceSettings(fast_interval_s=fast, slow_interval_s=max(fast, protect.slow_interval_s),
                           fast_samples=samples, slow_samples=min(2, samples), budget=protect.freeze_budget,
                           window_s=protect.budget_window_s,
                           startup_allowance_s=min(protect.startup_allowance_s,
                                                   protect.freeze_budget * protect.budget_window_s))
