"""Composition of the Freeze'nSense profiler: settings + container -> adapters -> app.

Part of the composition root (one job): the CLI, the API service and
benchmarks build profilers and replay the freeze journal through these
functions, never by wiring adapters themselves.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

# Only what the journal replay needs is imported up front: a restarted profiler
# or API service replays first thing, and every import delays the resume.
from vmplacer.adapters.db.freeze_rescues import write_rescues
from vmplacer.adapters.db.profiles import SqlFreezeJournal, SqlProfileStore
from vmplacer.adapters.freeze_guardian import FreezeGuardian, shared_guardian
from vmplacer.adapters.libvirt_freeze import LibvirtFreezableHost, labels_from_xml
from vmplacer.adapters.process_identity import current_owner, owner_alive
from vmplacer.app.observe.freeze import Freezer, ReplayReport, replay_journal
from vmplacer.bootstrap.container import Container
from vmplacer.ports import HypervisorError

if TYPE_CHECKING:
    from vmplacer.adapters.samplers import ProbeSource
    from vmplacer.app.observe.profiler import Profiler, ProfilerConfig, Progress

log = logging.getLogger(__name__)


def freezable_host(container: Container, name: str, *, with_labels: bool = False) -> LibvirtFreezableHost:
    hypervisor = container.hypervisor(name)
    labels = None
    if with_labels and importlib.util.find_spec("vmplacer.adapters.domain_xml") is not None:
        labels = labels_from_xml(hypervisor)
    return LibvirtFreezableHost(hypervisor, labels=labels)


def freeze_journal(container: Container) -> SqlFreezeJournal:
    return SqlFreezeJournal(container.sessions)


def profile_store(container: Container) -> SqlProfileStore:
    return container.profile_store


def replay_freeze_journal(container: Container, host: str | None = None, *, cause: str = "start",
                          hosts: dict[str, LibvirtFreezableHost] | None = None) -> ReplayReport:
    """Resume every domain a dead vmplacer process left paused, and audit what was resumed.

    Run at start-up (cause "start") and periodically ("housekeeping", "guard");
    a caller that replays often passes its own `hosts` cache to keep the
    libvirt handles between rounds.
    """
    cache: dict[str, LibvirtFreezableHost] = {} if hosts is None else hosts

    def lookup(name: str) -> LibvirtFreezableHost:
        if name not in cache:
            cache[name] = freezable_host(container, name)
        return cache[name]

    report = replay_journal(freeze_journal(container), lookup, owner_alive, host=host, cause=cause)
    _audit_rescues(container, report)
    return report


def _audit_rescues(container: Container, report: ReplayReport) -> None:
    if not any(r["resumed"] or r["errors"] for r in report.rescues):
        return
    try:
        write_rescues(container.sessions, report.rescues, actor="vmplacer")
    except Exception as exc:  # noqa: BLE001 - the resumes are done; only their record is missing
        report.errors.append(f"freeze rescues not audited: {exc}")


def freeze_guardian(container: Container, host_name: str) -> FreezeGuardian:
    """This process's guardian, watching `host_name` (spawned and connected now, before any freeze)."""
    guardian = shared_guardian(container.settings.database_url)
    guardian.watch(host_name, container.settings.host(host_name).uri)
    return guardian


def choose_host_metric(container: Container, host_name: str, override: str | None = None) -> tuple[str, str]:
    """The sampler metric for a host: `override`, else the host's setting, else auto-detected."""
    from vmplacer.adapters.samplers import choose_metric, detect_perf_counters

    preference = override or container.settings.host(host_name).sampler
    hypervisor = container.hypervisor(host_name)
    return choose_metric(preference, lambda: detect_perf_counters(hypervisor.connection(), hypervisor.uri))


def build_profiler(
    container: Container,
    host_name: str,
    config: ProfilerConfig,
    *,
    metric: str | None = None,
    probes: Mapping[str, ProbeSource] | None = None,
    probe_kind: str = "counter",
    store: bool = True,
    on_progress: Callable[[Progress], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> tuple[Profiler, Freezer]:
    """A ready profiler for one host; close the returned Freezer when done."""
    from vmplacer.adapters.samplers import make_sampler, runs_here
    from vmplacer.app.observe.profiler import Profiler

    hypervisor = container.hypervisor(host_name)
    needs_labels = bool(config.sensitive.labels or config.sensitive.workload_class)
    host = freezable_host(container, host_name, with_labels=needs_labels)
    chosen, why = choose_host_metric(container, host_name, metric)
    log.info("host %s: sampling %s (%s)", host_name, chosen, why)
    sampler = make_sampler(chosen, hypervisor.connection, probes, probe_kind,
                           local=runs_here(container.settings.host(host_name).uri))
    journal = freeze_journal(container)
    freezer = Freezer(host, journal, max_freeze_s=config.max_freeze_s, owner=current_owner(),
                      on_phase=on_phase, guard=freeze_guardian(container, host_name))
    try:
        topology = hypervisor.topology()
    except (HypervisorError, ImportError, ValueError) as exc:
        log.warning("host %s: topology unavailable, neighbour distances will be 'unknown': %s", host_name, exc)
        topology = None
    from vmplacer.app.observe.frozen_share import FrozenShareGate

    # a run that records its freezes is held to the guests' frozen share (the protection loop's
    # unrecorded runs have their own budget, protect.freeze_budget)
    gate = FrozenShareGate(container.settings.rebalance.max_frozen_share_per_guest_hour,
                           profile_store(container).freezes_since) if store else None
    profiler = Profiler(
        host, sampler, freezer, config,
        store=profile_store(container) if store else None,
        frozen_share=gate,
        topology=topology,
        replay=lambda: replay_freeze_journal(container, host_name, cause="profiler", hosts={host_name: host}),
        on_progress=on_progress,
        on_phase=on_phase,
    )
    return profiler, freezer
