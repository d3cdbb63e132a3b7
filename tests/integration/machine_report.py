"""What the machine was doing when a live test failed: load, CPU steal, busy processes, domains.

A live test that fails on a busy or stalled machine and one that fails on a product bug
look alike in a log; this snapshot, attached to the failure report, tells them apart.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from dataclasses import dataclass

import psutil

from tests.support import describe_process, thread_states
from vmplacer.testbed import daemons

VIRSH_TIMEOUT_S = 15


@dataclass(frozen=True)
class CpuTimes:
    """Jiffies per CPU from /proc/stat: (busy, idle, steal)."""

    per_cpu: dict[str, tuple[int, int, int]]
    wall: float

    @classmethod
    def now(cls) -> CpuTimes:
        per_cpu = {}
        with open("/proc/stat") as stat:
            for line in stat:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                name, *fields = line.split()
                values = [int(v) for v in fields[:8]] + [0] * max(0, 8 - len(fields))
                user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
                per_cpu[name] = (user + nice + system + irq + softirq, idle + iowait, steal)
        return cls(per_cpu, time.monotonic())

    def since(self, before: CpuTimes) -> str:
        parts = []
        for name, (busy, idle, steal) in sorted(self.per_cpu.items()):
            b0, i0, s0 = before.per_cpu.get(name, (busy, idle, steal))
            total = (busy - b0) + (idle - i0) + (steal - s0)
            if total > 0:
                parts.append(f"{name} busy {(busy - b0) / total:.0%} steal {(steal - s0) / total:.0%}")
        return f"over the last {self.wall - before.wall:.0f} s: " + ", ".join(parts)


def busiest_processes(sample_s: float = 0.5, top: int = 6) -> list[str]:
    processes = list(psutil.process_iter(["pid", "name", "cmdline"]))
    for process in processes:
        try:
            process.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(sample_s)
    rows = []
    for process in processes:
        try:
            rows.append((process.cpu_percent(None), process.pid,
                         " ".join(process.info["cmdline"] or [process.info["name"] or "?"])[:140]))
        except psutil.Error:
            continue
    rows.sort(reverse=True)
    return [f"{pct:5.0f}% pid {pid} {cmd}" for pct, pid, cmd in rows[:top]]


def domains(uri: str) -> str:
    started = time.monotonic()
    try:
        done = subprocess.run([daemons.binary("virsh"), "-c", uri, "list", "--all"], capture_output=True,
                              text=True, timeout=VIRSH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"{uri}: no answer within {VIRSH_TIMEOUT_S} s"
    took = time.monotonic() - started
    return f"{uri} (answered in {took:.1f} s, exit {done.returncode}):\n{done.stdout}{done.stderr}"


def writeback() -> str:
    """Dirty page cache and I/O pressure: a process throttled while writing (or in fsync) waits
    where no signal handler runs, and looks hung."""
    meminfo = {}
    with open("/proc/meminfo") as info:
        for line in info:
            key, _, value = line.partition(":")
            meminfo[key] = value.strip()
    parts = [f"Dirty {meminfo.get('Dirty', '?')}, Writeback {meminfo.get('Writeback', '?')}"]
    for resource in ("io", "memory"):
        try:
            with open(f"/proc/pressure/{resource}") as pressure:
                parts.append(f"{resource} pressure: {pressure.readline().strip()}")
        except OSError:
            pass
    return "; ".join(parts)


def blocked_processes(limit: int = 8) -> list[str]:
    """Processes with a thread in uninterruptible sleep (D) or stopped (T, t), as the kernel sees
    them (thread states, wait channels, kernel stacks): where a hang without a Python stack waits."""
    found = []
    for pid in sorted(int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        if {t.state for t in thread_states(pid)} & {"D", "T", "t"}:
            found.append(describe_process(pid))
            if len(found) == limit:
                break
    return found


def daemon_threads() -> list[str]:
    """Each testbed libvirtd's threads grouped by state and wait channel: a daemon that does not
    answer shows whether it is busy, waiting on something, or stopped."""
    dirs = daemons.StateDirs.default()
    rows = []
    for host in (daemons.host1(dirs), daemons.host2(dirs)):
        pid = daemons.daemon_pid(host, "libvirtd")
        if pid is None:
            rows.append(f"{host.name} libvirtd: not running")
            continue
        groups = Counter(f"{t.state} {t.wchan}" for t in thread_states(pid))
        rows.append(f"{host.name} libvirtd pid {pid} threads: "
                    + ", ".join(f"{n} x {k}" for k, n in sorted(groups.items())))
    return rows


def snapshot(before: CpuTimes | None) -> str:
    lines = [f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    if before is not None:
        lines.append(CpuTimes.now().since(before))
    lines.append(writeback())
    lines.append("busiest processes now:")
    lines.extend("  " + row for row in busiest_processes())
    lines.extend(daemon_threads())
    blocked = blocked_processes()
    lines.append("processes blocked (D) or stopped (T): " + ("none" if not blocked else ""))
    lines.extend(blocked)
    for uri in (daemons.HOST1_URI, daemons.HOST2_URI):
        lines.append(domains(uri))
    return "\n".join(lines)
