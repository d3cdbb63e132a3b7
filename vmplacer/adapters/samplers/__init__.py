"""Samplers behind the `Sampler` port, and the choice of one per host.

`auto` picks `ipc` where the host has hardware performance counters and
`cpu` (run-time share from scheduler statistics) where it has none — many
virtualized hosts, this project's CI machine included. A host's `sampler`
setting, or the CLI's `--metric`, overrides the choice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import libvirt

from vmplacer.adapters.samplers.cpu import CpuShareSampler
from vmplacer.adapters.samplers.ipc import PERF_EVENTS, PerfIpcSampler, enable_perf_events
from vmplacer.adapters.samplers.probe import (
    CommandProbe,
    ConsoleCounterProbe,
    HttpProbe,
    ProbeSampler,
    ProbeSource,
)
from vmplacer.adapters.samplers.schedstat import DomainIdentity, ProcSchedstatReader
from vmplacer.adapters.samplers.stats import LibvirtStatsReader
from vmplacer.ports import Sampler

METRICS = ("ipc", "cpu", "probe")
# Failures are reported through our own errors, not printed by libvirt.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)

# PMU devices the kernel registers when the CPU has hardware counters.
_PMU_DEVICES = ("cpu", "cpu_core", "cpu_atom", "armv8_pmuv3", "armv8_pmuv3_0")

__all__ = [
    "CommandProbe", "ConsoleCounterProbe", "CounterSupport", "CpuShareSampler", "HttpProbe",
    "PerfIpcSampler", "ProbeSampler", "ProbeSource", "choose_metric", "detect_perf_counters",
    "libvirt_identity", "make_sampler", "runs_here",
]


@dataclass(frozen=True)
class CounterSupport:
    available: bool
    reason: str


def local_pmu(sysfs_root: Path = Path("/")) -> CounterSupport:
    devices = sysfs_root / "sys" / "bus" / "event_source" / "devices"
    found = [name for name in _PMU_DEVICES if (devices / name).exists()]
    if found:
        return CounterSupport(True, f"kernel PMU device {found[0]} present")
    return CounterSupport(False, f"no hardware PMU under {devices} (only software events)")


def runs_here(uri: str) -> bool:
    """Do this host's domains run on this machine (so their QEMU threads are in our /proc)?

    True for QEMU URIs without a host (qemu:///system) and for loopback hosts.
    """
    parts = urlsplit(uri)
    if parts.scheme.split("+", 1)[0] != "qemu":
        return False
    return parts.hostname is None or parts.hostname in ("localhost", "127.0.0.1", "::1")


def libvirt_identity(connection: Callable[[], libvirt.virConnect]) -> Callable[[str], DomainIdentity | None]:
    """Name -> UUID and run id from libvirt (None when the domain does not exist)."""

    def identify(name: str) -> DomainIdentity | None:
        try:
            dom = connection().lookupByName(name)
            return DomainIdentity(name, dom.UUIDString(), dom.ID())
        except libvirt.libvirtError:
            return None

    return identify


def detect_perf_counters(conn: libvirt.virConnect, uri: str = "") -> CounterSupport:
    """Can libvirt count instructions and cycles on this host's domains?

    Asks libvirt on a running domain: enable the two events (live only), read
    one stats record, then put the domain's events back as they were. With no
    running domain, a local host is judged by its kernel PMU devices and a
    remote one is reported as unknown (so `auto` falls back to cpu).
    """
    try:
        running = conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_RUNNING)
    except libvirt.libvirtError as exc:
        return CounterSupport(False, f"cannot list domains: {exc.get_error_message()}")
    for dom in running:
        try:
            before = dom.perfEvents()
        except libvirt.libvirtError:
            continue  # vanished, or the driver has no perf support: try another
        missing = [e for e in PERF_EVENTS if not before.get(e)]
        try:
            if missing:
                dom.setPerfEvents({e: True for e in missing}, libvirt.VIR_DOMAIN_AFFECT_LIVE)
        except libvirt.libvirtError as exc:
            return CounterSupport(False, f"libvirt cannot open perf events on {dom.name()}: "
                                         f"{exc.get_error_message()}")
        try:
            records = conn.domainListGetStats([dom], libvirt.VIR_DOMAIN_STATS_PERF)
            stats = records[0][1] if records else {}
        except libvirt.libvirtError as exc:
            stats = {}
            reason = exc.get_error_message()
        else:
            reason = "perf stats absent"
        finally:
            if missing:
                try:
                    dom.setPerfEvents({e: False for e in missing}, libvirt.VIR_DOMAIN_AFFECT_LIVE)
                except libvirt.libvirtError:
                    pass
        if "perf.instructions" in stats and "perf.cpu_cycles" in stats:
            return CounterSupport(True, f"perf.instructions and perf.cpu_cycles readable on {dom.name()}")
        return CounterSupport(False, f"{reason} on {dom.name()}")
    if uri and runs_here(uri):  # the same machine, so the same PMU
        return local_pmu()
    return CounterSupport(False, "no running domain to test perf events on")


def choose_metric(preference: str, detect: Callable[[], CounterSupport]) -> tuple[str, str]:
    """(metric, why): the configured metric, or for `auto` ipc when counters work, else cpu."""
    if preference in METRICS:
        return preference, "configured"
    if preference != "auto":
        raise ValueError(f"sampler must be auto or one of {', '.join(METRICS)}, got {preference!r}")
    support = detect()
    if support.available:
        return "ipc", support.reason
    return "cpu", f"no hardware counters ({support.reason})"


def make_sampler(metric: str, connection: Callable[[], libvirt.virConnect],
                 probes: Mapping[str, ProbeSource] | None = None, probe_kind: str = "counter",
                 local: bool = False) -> Sampler:
    """Build the sampler for `metric` on one libvirt connection; `local`: the host's domains run on
    this machine, so `cpu` reads their vCPU threads from /proc (libvirt for any it cannot find)."""
    if metric == "cpu":
        through_libvirt = LibvirtStatsReader(connection, CpuShareSampler.groups)
        if local:
            return CpuShareSampler(ProcSchedstatReader(libvirt_identity(connection), through_libvirt))
        return CpuShareSampler(through_libvirt)
    if metric == "ipc":
        return PerfIpcSampler(LibvirtStatsReader(connection, PerfIpcSampler.groups),
                              enable=enable_perf_events(connection))
    if metric == "probe":
        return ProbeSampler(probes or {}, kind=probe_kind)
    raise ValueError(f"unknown metric {metric!r} (known: {', '.join(METRICS)})")
