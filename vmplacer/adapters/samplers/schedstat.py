"""Scheduler statistics of a local domain's vCPU threads, read from /proc.

The `cpu` sampler needs, per vCPU, how long it ran and how long it waited
runnable. libvirt reads exactly these from /proc/<pid>/task/<tid>/schedstat,
but one `domainListGetStats` call costs ~3 ms here (RPC, a domain job, QEMU
queried for the vCPU list), and Freeze'nSense makes two of them while every
neighbour is frozen: for t_m = 10 ms the neighbours stood still ~15 ms longer
than the sample. On the host the daemon runs on, the same counters are a few
file reads away (~50 µs), so the frozen span shrinks to t_m plus suspend and
resume.

Which threads: QEMU names its vCPU threads "CPU <n>/KVM" (or /TCG) when
started with `debug-threads=on`, which libvirt always asks for; the QEMU
process is found once per domain start by its `-uuid` argument and cached by
the libvirt run id. A domain that cannot be found here (a remote host, a
QEMU without thread names) is read through libvirt as before, so the reader
is never less capable than `LibvirtStatsReader`.

The values carry libvirt's key names, so the `cpu` sampler needs no change:
`vcpu.<n>.time` and `vcpu.<n>.delay` (ns, schedstat), `vcpu.current`, and
`cpu.time` from the QEMU process's CPU-time clock (`clock_gettime` on the
process clock id: every thread, like libvirt's cgroup `cpu.time`). Schedstat's
run time only moves at scheduler events — a spinning vCPU's counter can lag by
a whole tick (4 ms at HZ=250), too coarse for 2–10 ms windows — while the
process clock also counts the slice running right now.
"""

from __future__ import annotations

import ctypes
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vmplacer.adapters.samplers.stats import DomainStats, StatsReader, StatsSnapshot

_VCPU_THREAD = re.compile(r"^CPU (\d+)/[A-Za-z]+$")
RUNNING = 1  # libvirt VIR_DOMAIN_RUNNING: a found process is a started domain
RETRY_NOT_FOUND_S = 30.0  # a domain read through libvirt is looked for here again after this long


@dataclass(frozen=True)
class DomainIdentity:
    """What libvirt says about a domain: enough to find its QEMU process."""

    name: str
    uuid: str
    run_id: int  # libvirt domain id; -1 when not running


@dataclass(frozen=True)
class VcpuThreads:
    pid: int
    start_ticks: int  # process start time: a reused pid is another process
    run_id: int
    threads: dict[int, int]  # vCPU index -> thread id


class ProcSchedstatReader:
    """A `StatsReader` for the `cpu` sampler that reads local vCPU threads from /proc."""

    def __init__(self, identify: Callable[[str], DomainIdentity | None], fallback: StatsReader,
                 proc: Path = Path("/proc"), clock: Callable[[], float] = time.perf_counter,
                 process_cpu_time: Callable[[int], int | None] | None = None):
        self._identify = identify
        self._fallback = fallback
        self._proc = proc
        self._clock = clock
        self._cpu_time = process_cpu_time or process_cpu_ns
        self._found: dict[str, VcpuThreads | None] = {}
        self._not_found_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def read(self, names: Sequence[str]) -> StatsSnapshot:
        located = {name: self._threads(name) for name in names}
        local = [n for n in names if located[n] is not None]
        remote = [n for n in names if located[n] is None]
        domains: dict[str, DomainStats] = {}
        started = self._clock()
        for name in local:
            threads = located[name]
            assert threads is not None
            values = self._schedstat(threads)
            if values is None:  # the process went away since it was found
                with self._lock:
                    self._found.pop(name, None)
                continue
            domains[name] = DomainStats(name, threads.run_id, values)
        finished = self._clock()
        if remote:
            other = self._fallback.read(remote)
            domains.update(other.domains)
            started, finished = min(started, other.started), max(finished, other.finished)
        return StatsSnapshot(domains, started, finished)

    # ----- finding the threads --------------------------------------------------------------
    def _threads(self, name: str) -> VcpuThreads | None:
        with self._lock:
            if name in self._found:
                cached = self._found[name]
                if cached is not None and self._alive(cached):
                    return cached
                if cached is None and self._clock() - self._not_found_at[name] < RETRY_NOT_FOUND_S:
                    return None
        identity = self._identify(name)
        found = self._locate(identity) if identity is not None and identity.run_id >= 0 else None
        with self._lock:
            self._found[name] = found
            self._not_found_at[name] = self._clock()
        return found

    def prepare(self, names: Sequence[str]) -> None:
        """Find these domains' threads now (a process-list scan), not inside a freeze."""
        for name in names:
            self._threads(name)

    def forget(self, name: str) -> None:
        """Look the domain up again on the next read (e.g. after it restarted)."""
        with self._lock:
            self._found.pop(name, None)

    def _alive(self, found: VcpuThreads) -> bool:
        return _start_ticks(self._proc / str(found.pid)) == found.start_ticks

    def _locate(self, identity: DomainIdentity) -> VcpuThreads | None:
        needle = f"\0-uuid\0{identity.uuid}\0".encode()
        for entry in self._proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if needle not in b"\0" + cmdline:
                continue
            threads = _vcpu_threads(entry)
            start = _start_ticks(entry)
            if not threads or start is None:
                return None  # QEMU without thread names: libvirt reads it
            return VcpuThreads(int(entry.name), start, identity.run_id, threads)
        return None

    def _schedstat(self, found: VcpuThreads) -> dict[str, float] | None:
        values: dict[str, float] = {"state.state": RUNNING, "vcpu.current": len(found.threads)}
        task = self._proc / str(found.pid) / "task"
        for vcpu, tid in sorted(found.threads.items()):
            try:
                fields = (task / str(tid) / "schedstat").read_text().split()
            except OSError:
                return None
            values[f"vcpu.{vcpu}.time"] = int(fields[0])
            values[f"vcpu.{vcpu}.delay"] = int(fields[1])
        cpu_time = self._cpu_time(found.pid)
        if cpu_time is None:
            return None
        values["cpu.time"] = cpu_time
        return values


def process_cpu_ns(pid: int) -> int | None:
    """CPU time of every thread of process `pid`, up to now, in ns (None: the process is gone).

    The kernel's CPU-time clock of another process: clock id ((~pid) << 3) | CPUCLOCK_SCHED,
    read as a 32-bit clockid_t.
    """
    clock_id = ctypes.c_int32((((~pid) << 3) | 2) & 0xFFFFFFFF).value
    try:
        return time.clock_gettime_ns(clock_id)
    except OSError:
        return None


def _vcpu_threads(process: Path) -> dict[int, int]:
    threads: dict[int, int] = {}
    try:
        tasks = list((process / "task").iterdir())
    except OSError:
        return {}
    for task in tasks:
        try:
            match = _VCPU_THREAD.match((task / "comm").read_text().strip())
        except OSError:
            continue
        if match:
            threads[int(match.group(1))] = int(task.name)
    return threads


def _start_ticks(process: Path) -> int | None:
    """Field 22 of /proc/<pid>/stat (after the parenthesised command name, which may hold spaces)."""
    try:
        stat = (process / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])
