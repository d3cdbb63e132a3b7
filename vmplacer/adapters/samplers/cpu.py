"""The `cpu` sampler: the share of its runnable time a domain actually ran.

    ζ = Σ run time / (Σ run time + Σ run-queue delay)     over the window

For a CPU-bound guest alone this is ~1; two CPU-bound guests time-sharing one
pCPU each run half the time and wait the other half, so each gets 0.5 — the
speed each has relative to running alone. Unlike run time per wall second,
the ratio needs no precise window length (the two counters come from the same
stats call), so millisecond windows whose brackets jitter by a millisecond
still measure correctly, and a guest that idles part of the window is not
mistaken for a slowed one: only time it wanted the CPU and waited counts.

Sources (one `domainListGetStats` call, VCPU + CPU_TOTAL groups):
- run time: `cpu.time` (the domain's cgroup CPU time, nanosecond resolution).
  Libvirt's per-vCPU `vcpu.N.time` comes from /proc .../stat in clock ticks
  (10 ms at the usual CLK_TCK=100), far too coarse for 10 ms windows; it is
  used only when `cpu.time` is missing, and then windows under
  COARSE_MIN_WINDOW_S are rejected.
- run-queue delay: `vcpu.N.delay` (schedstat wait time, nanoseconds).

`cpu.time` also counts QEMU's emulator and I/O threads; their CPU time is
small next to busy vCPUs, and it only makes ζ slightly optimistic.
"""

from __future__ import annotations

from vmplacer.adapters.samplers.counters import (
    CounterSampler,
    RaggedSample,
    Window,
    counter_delta,
    vcpu_count,
    vcpu_indexes,
)
from vmplacer.adapters.samplers.stats import StatsReader

NS = 1e9
COARSE_MIN_WINDOW_S = 0.2  # 20 ticks: quantization below ~5 %
# Less runnable time than this share of the window says too little to measure.
MIN_BUSY_SHARE = 0.02
MIN_BUSY_S = 100e-6


class CpuShareSampler(CounterSampler):
    metric = "cpu"
    groups = ("state", "cpu_total", "vcpu")

    def __init__(self, reader: StatsReader):
        super().__init__(reader)

    def prepare(self, domains: list[str]) -> None:
        """Let the reader find new domains now, outside any freeze (the /proc reader scans
        the process list once per domain start)."""
        prepare = getattr(self.reader, "prepare", None)
        if prepare is not None:
            prepare(domains)

    def measure(self, before: dict, after: dict, window: Window) -> float:
        delays = vcpu_indexes(before, after, "delay")
        if not delays:
            raise RaggedSample("no run-queue delay: the host reports no vcpu.N.delay (libvirt >= 7.9 needed)")
        waited = sum(counter_delta(before, after, f"vcpu.{i}.delay") for i in delays) / NS
        if "cpu.time" in before and "cpu.time" in after:
            ran = counter_delta(before, after, "cpu.time") / NS
        else:
            times = vcpu_indexes(before, after, "time")
            if not times:
                raise RaggedSample("missing counter: neither cpu.time nor vcpu.N.time")
            if window.seconds < COARSE_MIN_WINDOW_S:
                raise RaggedSample(
                    f"window too short: {window.seconds * 1e3:.1f} ms with tick-resolution vcpu.N.time "
                    f"(needs >= {COARSE_MIN_WINDOW_S * 1e3:.0f} ms)"
                )
            ran = sum(counter_delta(before, after, f"vcpu.{i}.time") for i in times) / NS
        # Emulator threads may add a little CPU time beyond the vCPUs' share.
        ceiling = (vcpu_count(after) + 1) * (window.seconds + window.slack)
        if ran > ceiling or waited > ceiling:
            raise RaggedSample(
                f"outside physical bounds: ran {ran * 1e3:.2f} ms, waited {waited * 1e3:.2f} ms "
                f"in a {window.seconds * 1e3:.2f} ms window"
            )
        busy = ran + waited
        if busy < max(MIN_BUSY_S, MIN_BUSY_SHARE * window.seconds):
            raise RaggedSample(f"idle: runnable {busy * 1e3:.3f} ms of {window.seconds * 1e3:.2f} ms")
        return ran / busy
