"""The `ipc` sampler: instructions per cycle from libvirt's per-domain perf events.

The seed's metric (chapter 5): IPC tracks throughput and reacts to shared
caches and memory bandwidth, not only to CPU time. Libvirt opens the
counters on the QEMU process once (`setPerfEvents`, kept open between
samples: no per-sample set-up) and reports cumulative `perf.instructions`
and `perf.cpu_cycles`; a sample is the ratio of their increments.

Virtual PMUs are ragged (seed §5.5.2): increments that are negative (the
counters were reopened or the domain restarted), cycle rates no CPU runs at,
or IPC beyond any core's retire width are rejected.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import libvirt

from vmplacer.adapters.samplers.counters import (
    CounterSampler,
    RaggedSample,
    Window,
    counter_delta,
    vcpu_count,
)
from vmplacer.adapters.samplers.stats import StatsReader

PERF_EVENTS = ("instructions", "cpu_cycles")
MAX_IPC = 8.0  # wider than any shipping core retires per cycle
MAX_HZ_PER_THREAD = 7e9  # above any shipping clock, turbo included
MIN_CYCLES = 10_000  # fewer: the vCPUs idled, no IPC to speak of


class PerfIpcSampler(CounterSampler):
    metric = "ipc"
    groups = ("state", "perf", "vcpu")

    def __init__(self, reader: StatsReader,
                 enable: Callable[[list[str]], None] | None = None):
        super().__init__(reader)
        self._enable = enable
        self._enabled: set[str] = set()
        self._enable_lock = threading.Lock()

    def prepare(self, domains: list[str]) -> None:
        """Open the counters on domains not seen yet (outside any freeze: it is an RPC each)."""
        if self._enable is None:
            return
        with self._enable_lock:
            fresh = [d for d in domains if d not in self._enabled]
            if fresh:
                self._enable(fresh)
                self._enabled.update(fresh)

    def begin(self, domains: list[str]) -> object:
        self.prepare(domains)
        return super().begin(domains)

    def measure(self, before: dict, after: dict, window: Window) -> float:
        cycles = counter_delta(before, after, "perf.cpu_cycles")
        instructions = counter_delta(before, after, "perf.instructions")
        if cycles < MIN_CYCLES:
            raise RaggedSample(f"idle: {cycles:.0f} cycles in {window.seconds * 1e3:.2f} ms")
        threads = vcpu_count(after) + 1
        if cycles > MAX_HZ_PER_THREAD * threads * (window.seconds + window.slack):
            raise RaggedSample(
                f"outside physical bounds: {cycles:.3g} cycles in {window.seconds * 1e3:.2f} ms "
                f"on {threads - 1} vCPU(s)"
            )
        ipc = instructions / cycles
        if ipc > MAX_IPC:
            raise RaggedSample(f"outside physical bounds: IPC {ipc:.2f} > {MAX_IPC}")
        return ipc


def enable_perf_events(connection: Callable[[], libvirt.virConnect]) -> Callable[[list[str]], None]:
    """A function opening the instructions/cycles counters on running domains (live only)."""

    def enable(names: list[str]) -> None:
        conn = connection()
        for name in names:
            try:
                dom = conn.lookupByName(name)
                dom.setPerfEvents({event: True for event in PERF_EVENTS}, libvirt.VIR_DOMAIN_AFFECT_LIVE)
            except libvirt.libvirtError:
                continue  # the sample of this domain will say what is missing

    return enable
