"""Composition of the rebalancer: settings + container → adapters → `Rebalancer`.

Kept next to `bootstrap.py` and `bootstrap_profiler.py` (same role): the CLI,
the API and the timer build rebalancers through `build_rebalancer`, never by
wiring adapters themselves. Optional steps are wired when their modules are
present and otherwise reported as unavailable (the run goes on without them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlacementUpdates, SqlPlanStore, new_holder
from vmplacer.adapters.db.throttles import SqlThrottleLedger
from vmplacer.adapters.libvirt_rebalance import RebalanceHost
from vmplacer.app.executor import ExecutorSettings
from vmplacer.app.rebalance import Rebalancer
from vmplacer.bootstrap import Container
from vmplacer.core.policies.rebalance_state import RebalanceSettings

log = logging.getLogger(__name__)

DEMAND_WINDOW_S = 1.0


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


def _learning(container: Container) -> tuple[Callable[[], Any] | None, Callable[[], str] | None, dict[str, str]]:
    """(load the stored model, learn the profile runs not learned yet, reasons for what is missing)."""
    try:
        from vmplacer.adapters.db.profiles import SqlProfileStore
        from vmplacer.app.learn import learn_from_runs
    except ImportError as exc:
        why = f"model learning cannot be loaded ({exc})"
        return None, None, {"model": why, "learn": why}

    def learn() -> str:
        from sqlalchemy import select

        from vmplacer.adapters.db.models import ProfileRunRow

        with container.sessions() as session:
            runs = sorted(session.scalars(select(ProfileRunRow.id).where(ProfileRunRow.status == "finished")))
        report = learn_from_runs(runs, SqlProfileStore(container.sessions), container.model_repository)
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(report.skipped.items()) if k != "already-learned-run")
        return (f"{report.observations} new observations from runs {report.runs or 'none'}; the model holds "
                f"{report.total_observations}" + (f"; skipped: {skipped}" if skipped else ""))

    return container.load_model, learn, {}


def _profiler(container: Container) -> tuple[Callable[[str, float, Sequence[str]], str] | None, str]:
    try:
        from vmplacer.app.profiler import ProfilerConfig, SensitiveSelector
        from vmplacer.bootstrap_profiler import build_profiler
    except ImportError as exc:  # the profiler's adapters need libvirt-python and friends
        return None, f"the Freeze'nSense profiler cannot be loaded ({exc})"

    def profile(host: str, seconds: float, scope: Sequence[str]) -> str:
        defaults = container.settings.profiler
        config = ProfilerConfig(
            t_m_s=defaults.t_m_ms / 1e3,
            t_sleep_s=min(defaults.t_sleep_s, max(0.2, seconds / 10)),
            max_freeze_s=defaults.max_freeze_ms / 1e3,
            excluded=tuple(defaults.excluded_domains),
            scope=tuple(scope) if tuple(scope) not in ((), ("*",)) else defaults.scope,
            sensitive=SensitiveSelector.parse(defaults.sensitive, []),
            duration_s=seconds,
        )
        profiler, freezer = build_profiler(container, host, config)
        try:
            result = profiler.run()
        finally:
            freezer.close()
        return (f"run {result.run_id}: {len(result.vms)} VMs, {result.freezes} freezes, "
                f"{result.stopped_because or 'done'}")

    return profile, ""


def build_rebalancer(
    container: Container,
    *,
    settings: RebalanceSettings | None = None,
    executor_settings: ExecutorSettings | None = None,
    holder: str | None = None,
    measure_demand: bool = True,
) -> Rebalancer:
    hosts = {h.name: RebalanceHost(container.hypervisor(h.name)) for h in container.settings.hosts}
    load_model, learn, unavailable = _learning(container)
    profile, why = _profiler(container)
    if profile is None:
        unavailable["profile"] = why
    store = container.placement_store

    def specs(name: str) -> Any:
        record = store.get(name)
        return record.get("spec") if record else None

    def demand(host: str, names: list[str]) -> dict[str, float]:
        return hosts[host].vcpu_demand(names, DEMAND_WINDOW_S)

    return Rebalancer(
        hosts,
        plans=SqlPlanStore(container.sessions),
        leases=SqlLeaseStore(container.sessions),
        clock=SystemClock(),
        wall=time.time,
        holder=holder or new_holder(),
        settings=settings,
        executor_settings=executor_settings,
        placements=SqlPlacementUpdates(container.sessions, {h.name: h.uri for h in container.settings.hosts}),
        audit=store,
        throttles=SqlThrottleLedger(container.sessions),
        specs=specs,
        load_model=load_model,
        learn=learn,
        profile=profile,
        allocation=container.allocation_options,
        in_maintenance=lambda: container.maintenance.current().keys(),
        demand=demand if measure_demand else None,
        probe=(lambda host, seconds: profile(host, seconds, ("*",))) if profile else None,
        unavailable=unavailable,
        solver=CpSatLayoutSolver(),
    )
