"""Composition of the rebalancer: settings + container → adapters → `Rebalancer`.

Part of the composition root (same role as `container.py` and `profiler.py`): the CLI,
the API and the timer build rebalancers through `build_rebalancer`, never by
wiring adapters themselves. Optional steps are wired when their modules are
present and otherwise reported as unavailable (the run goes on without them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
from vmplacer.adapters.db.plans import new_holder
from vmplacer.adapters.db.rounds import SqlRoundStore
from vmplacer.adapters.libvirt_rebalance import RebalanceHost
from vmplacer.app.apply.actions.probe import OnVerdict
from vmplacer.app.apply.executor import ExecutorSettings
from vmplacer.app.observe.profiler import measured_of
from vmplacer.app.rebalance.rebalancer import ROUNDS_PER_PROFILE, RebalancePorts, Rebalancer
from vmplacer.bootstrap.container import Container
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.text import plural
from vmplacer.core.rebalance.trial import Measured
from vmplacer.ports import SystemClock

log = logging.getLogger(__name__)

DEMAND_WINDOW_S = 1.0


def _learning(container: Container, hosts: dict[str, RebalanceHost],
              ) -> tuple[Callable[[], Any] | None, Callable[[], str] | None, dict[str, str]]:
    """(load the stored model, learn the profile runs not learned yet, reasons for what is missing).
    Sampled guests are keyed as the planner keys them: from their labels on `hosts` and their records."""
    try:
        from vmplacer.app.learn.online import learn_from_runs
        from vmplacer.bootstrap.learning import guest_identities
    except ImportError as exc:
        why = f"model learning cannot be loaded ({exc})"
        return None, None, {"model": why, "learn": why}

    def learn() -> str:
        store = container.profile_store
        report = learn_from_runs(store.finished_run_ids(), store, container.model_repository,
                                  identify=guest_identities(container, lambda: hosts.values()))
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(report.skipped.items()) if k != "already-learned-run")
        return (f"{report.observations} new observations from runs {report.runs or 'none'}; the model holds "
                f"{report.total_observations}" + (f"; skipped: {skipped}" if skipped else ""))

    return container.load_model, learn, {}


SPARED_SHOWN = 10  # guests a one-line message names before it only counts the rest


def spared_text(frozen_share: Mapping[str, Any] | None) -> str:
    """The guests a profile run left running because of their frozen share of the last hour,
    with the seconds each had been frozen ("" when none): what its `frozen_share.spared` holds
    (app/observe/frozen_share.py), in one line for the run's and the rebalance report's text."""
    spared = (frozen_share or {}).get("spared")
    if not isinstance(spared, Mapping) or not spared:
        return ""
    share = (frozen_share or {}).get("max_share_per_hour")
    limit = (f" (max_frozen_share_per_guest_hour {share * 100:g} % of the hour)"
             if isinstance(share, (int, float)) and not isinstance(share, bool) else "")
    names = sorted(spared)
    shown = ", ".join(f"{name} ({_seconds(spared[name])} frozen)" for name in names[:SPARED_SHOWN])
    more = f" and {len(names) - SPARED_SHOWN} more" if len(names) > SPARED_SHOWN else ""
    return f"left running for their frozen share{limit}: {shown}{more}"


def _seconds(value: Any) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) and not isinstance(value, bool) else "? s"


def profile_step(container: Container) -> tuple[Callable[[str, float, Sequence[str]], Measured] | None, str]:
    try:
        from vmplacer.bootstrap.profiler import build_profiler
        from vmplacer.bootstrap.profiler_config import profiler_config
    except ImportError as exc:  # the profiler's adapters need libvirt-python and friends
        return None, f"the Freeze'nSense profiler cannot be loaded ({exc})"

    def profile(host: str, seconds: float, scope: Sequence[str]) -> Measured:
        defaults = container.settings.profiler
        config = profiler_config(
            defaults,
            t_sleep_s=min(defaults.t_sleep_s, max(0.2, seconds / ROUNDS_PER_PROFILE)),
            scope=tuple(scope) if tuple(scope) != ("*",) else (),
            duration_s=seconds,
        )
        profiler, freezer = build_profiler(container, host, config)
        try:
            result = profiler.run()
        finally:
            freezer.close()
        message = (f"run {result.run_id}: {plural(len(result.vms), 'VM')}, {plural(result.freezes, 'freeze')}, "
                   f"{result.stopped_because or 'done'}")
        spared = spared_text(result.frozen_share)
        if spared:
            message += f"; {spared}"
        return measured_of(host, result.vms, message)

    return profile, ""


def build_rebalancer(
    container: Container,
    *,
    settings: RebalanceSettings | None = None,
    executor_settings: ExecutorSettings | None = None,
    holder: str | None = None,
    measure_demand: bool = True,
    on_trial: OnVerdict | None = None,
) -> Rebalancer:
    """`settings` default to the config file's `rebalance:` section. `on_trial` is told of each
    trial verdict while a plan is applied (the API counts them)."""
    hosts = {h.name: RebalanceHost(container.hypervisor(h.name)) for h in container.settings.hosts}
    load_model, learn, unavailable = _learning(container, hosts)
    profile, why = profile_step(container)
    if profile is None:
        unavailable["profile"] = why
    store = container.placement_store

    def specs(name: str) -> Any:
        record = store.get(name)
        return record.get("spec") if record else None

    def demand(host: str, names: list[str]) -> dict[str, float]:
        return hosts[host].vcpu_demand(names, DEMAND_WINDOW_S)

    return Rebalancer(
        RebalancePorts(hosts=hosts, plans=container.plan_store, leases=container.lease_store, clock=SystemClock(),
                       wall=time.time, placements=container.placement_updates(), audit=store,
                       throttles=container.throttle_ledger, specs=specs, load_model=load_model,
                       learn=learn, profile=profile, allocation=container.allocation_options,
                       in_maintenance=lambda: container.maintenance.current().keys(),
                       demand=demand if measure_demand else None,
                       probe=(lambda host, seconds: profile(host, seconds, ("*",))) if profile else None,
                       solver=CpSatLayoutSolver(), on_trial=on_trial, rounds=SqlRoundStore(container.sessions),
                       thread_safe=True),
        holder=holder or new_holder(), settings=settings or container.settings.rebalance,
        executor_settings=executor_settings, unavailable=unavailable,
    )
