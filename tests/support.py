"""Helpers shared by tests: the CI rule "missing infrastructure fails, never skips", and running a
command (the installed `vmplacer` above all) so that a hang reports where it hung."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

VMPLACER = str(Path(sys.executable).with_name("vmplacer"))
"""The console script installed beside the interpreter running the tests."""


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, reason: str) -> None:
    """Skip outside CI when `condition` is false; under CI=true, fail instead."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"required infrastructure missing under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


STALL_ALLOWANCE = 4
"""A command the machine keeps waiting (for a CPU, or in uninterruptible sleep: disk, page
cache) gets up to this many times its timeout in wall time before it counts as hung."""

POLL_S = 0.5


def run_reporting_hangs(cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                        cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(cmd, capture_output=True, text=True)`, except that a Python command still
    running after `timeout` of its OWN time is made to print every thread's stack (faulthandler,
    on SIGABRT) before the test fails: a hang then says where it hung instead of only that it did.

    Its own time is wall time less what the machine withheld (`OwnClock`): a command starved of
    CPU by a busy machine is not the product hanging, so the timeout measures what the product
    controls; `STALL_ALLOWANCE` times the timeout in wall time still ends any run. The report
    starts with that accounting and the machine's pressure, then the kernel's view of the command
    and its children (state, wait channel and kernel stack of every thread; a process blocked
    where no signal handler runs prints no Python stack, and this says where it waits), then its
    stacks read from outside (py-spy) and from inside (faulthandler)."""
    environment = dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")
    hung = False
    report = ""
    caller_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=environment, cwd=cwd) as process:
        clock = OwnClock(process.pid)
        while True:
            try:
                out, err = process.communicate(timeout=POLL_S)  # retrying loses no output
                break
            except subprocess.TimeoutExpired:
                clock.sample()
                if clock.own_s() < timeout and clock.wall_s() < timeout * STALL_ALLOWANCE:
                    continue
            hung = True
            report = clock.summary(timeout) + "\n" + machine_pressure()
            tree = process_tree(process.pid)
            report += "\n--- the kernel's view of it then:\n" + "\n".join(describe_process(pid) for pid in tree)
            report += "\n" + python_stacks(process.pid)
            # a child starts with its parent's mask: one inherited with SIGABRT blocked prints no stack
            report += f"\n--- signals this test's thread blocked when it started the command: {sorted(caller_mask)}"
            process.send_signal(signal.SIGABRT)  # only the command: a child may be holding guests paused
            try:
                out, err = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
            break
    if hung:
        stacks = "\n".join(line for line in err.splitlines() if not line.startswith("Extension modules:"))
        pytest.fail(f"{' '.join(cmd)} was still running after {timeout:g} s of its own time: {report}\n--- its threads' stacks (SIGABRT):\n"
                    f"{stacks[-12000:]}\n--- its stdout:\n{out[-2000:]}", pytrace=False)
    return subprocess.CompletedProcess(list(cmd), process.returncode, out, err)


class OwnClock:
    """A process's own time: wall time since it started less the longest time any of its threads
    was kept waiting by the machine, i.e. runnable without a CPU (the kernel's run delay, exact)
    or in uninterruptible sleep (sampled at each `sample()`). A deadlocked or spinning process
    still runs out of own time; a starved one does not."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.started = time.monotonic()
        self.last = self.started
        self.run_delay: dict[int, float] = {}
        self.uninterruptible: dict[int, float] = {}
        self.cpu: dict[int, float] = {}
        self.states: Counter[str] = Counter()

    def sample(self) -> None:
        now = time.monotonic()
        for tid, (state, cpu_s, delay_s) in task_clocks(self.pid).items():
            self.run_delay[tid] = delay_s
            self.cpu[tid] = cpu_s
            if state == "D":
                self.uninterruptible[tid] = self.uninterruptible.get(tid, 0.0) + (now - self.last)
            if tid == self.pid:
                self.states[state] += 1
        self.last = now

    def wall_s(self) -> float:
        return self.last - self.started

    def withheld_s(self) -> float:
        tids = set(self.run_delay) | set(self.uninterruptible)
        return max((self.run_delay.get(t, 0.0) + self.uninterruptible.get(t, 0.0) for t in tids), default=0.0)

    def own_s(self) -> float:
        return self.wall_s() - self.withheld_s()

    def summary(self, timeout: float) -> str:
        main_delay = self.run_delay.get(self.pid, 0.0)
        main_d = self.uninterruptible.get(self.pid, 0.0)
        states = ", ".join(f"{state} {n}" for state, n in self.states.most_common())
        return (f"{self.own_s():.1f} s of its own time (timeout {timeout:g} s) in {self.wall_s():.1f} s wall; "
                f"the machine withheld {self.withheld_s():.1f} s (main thread: {main_delay:.1f} s runnable "
                f"without a CPU, ~{main_d:.1f} s in uninterruptible sleep); CPU used "
                f"{sum(self.cpu.values()):.1f} s; main thread's state at {sum(self.states.values())} samples: {states}")


def task_clocks(pid: int) -> dict[int, tuple[str, float, float]]:
    """tid -> (state, CPU seconds, seconds runnable without a CPU) of each thread of `pid`."""
    clocks = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return clocks
    for task in tasks:
        fields = _stat_fields(task / "stat")
        schedstat = _read(task / "schedstat").split()
        if not fields or len(schedstat) < 2:
            continue
        clocks[int(task.name)] = (fields[0], int(schedstat[0]) / 1e9, int(schedstat[1]) / 1e9)
    return clocks


def machine_pressure(sample_s: float = 0.5, top: int = 5) -> str:
    """The machine in a few lines: load, pressure stall information (share of time some task
    waited for CPU, I/O or memory), available memory, and the processes using the most CPU."""
    lines = [f"--- machine: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    for resource in ("cpu", "io", "memory"):
        pressure = _read(Path(f"/proc/pressure/{resource}")).splitlines()
        if pressure:
            lines.append(f"  {resource} pressure: {' | '.join(pressure)}")
    meminfo = dict(line.split(":", 1) for line in _read(Path("/proc/meminfo")).splitlines() if ":" in line)
    lines.append("  " + ", ".join(f"{key} {meminfo.get(key, '?').strip()}"
                                  for key in ("MemAvailable", "Cached", "Dirty", "Writeback")))
    before = _cpu_by_process()
    time.sleep(sample_s)
    after = _cpu_by_process()
    busiest = sorted(((after[pid][0] - before[pid][0], pid) for pid in after if pid in before), reverse=True)
    for used, pid in busiest[:top]:
        lines.append(f"  {used / sample_s:5.0%} cpu pid {pid} {after[pid][1][:120]}")
    return "\n".join(lines)


def _cpu_by_process() -> dict[int, tuple[float, str]]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry / "stat")
            if len(fields) > 14:
                found[int(entry.name)] = ((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
                                          _read(entry / "cmdline").replace("\0", " ").strip()
                                          or f"[{_read(entry / 'comm').strip()}]")
    return found


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it, parents before children (from /proc: no psutil here,
    so the helper also runs where only the standard library is)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry / "stat")
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        tree.append(current)
        queue.extend(sorted(children.get(current, [])))
    return tree


@dataclass(frozen=True)
class ThreadState:
    tid: int
    name: str
    state: str  # R running, S sleeping, D uninterruptible, T/t stopped, Z zombie
    wchan: str  # the kernel function it waits in, "-" if none


def thread_states(pid: int) -> list[ThreadState]:
    """Each thread of `pid` as the kernel sees it; [] if the process is gone."""
    try:
        tasks = sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda t: int(t.name))
    except OSError:
        return []
    threads = []
    for task in tasks:
        fields = _stat_fields(task / "stat")
        threads.append(ThreadState(int(task.name), _read(task / "comm").strip(), fields[0] if fields else "?",
                                   _read(task / "wchan").strip() or "-"))
    return threads


def describe_process(pid: int) -> str:
    """One process as the kernel sees it: command line, then each thread's state, wait channel
    and kernel stack (the stack needs root; left out where unreadable)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return f"pid {pid}: gone"
    lines = [f"pid {pid}: {command[:300]}"]
    for thread in thread_states(pid):
        task = Path(f"/proc/{pid}/task/{thread.tid}")
        lines.append(f"  thread {thread.tid} ({thread.name}) state {thread.state} wchan {thread.wchan} "
                     f"cpu {_cpu_seconds(task):.1f} s {_scheduling(task)} {_signal_masks(task)}")
        lines.extend(f"    {frame}" for frame in _read(Path(f"/proc/{pid}/task/{thread.tid}/stack")).splitlines()[:20])
    return "\n".join(lines)


def python_stacks(pid: int) -> str:
    """Every Python thread's stack of `pid` read from outside (py-spy, no signal involved): a
    process that blocks SIGABRT, or spins where faulthandler cannot run, still says where it is.
    Native frames are included (`--native`): a C library spinning is named too."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return "--- py-spy not installed: no stacks read from outside"
    try:
        done = subprocess.run([spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"--- py-spy dump failed: {exc}"
    return f"--- py-spy dump (exit {done.returncode}):\n{done.stdout[-8000:]}{done.stderr[-2000:]}"


def _cpu_seconds(task: Path) -> float:
    """User + system CPU time a thread used so far (busy spinning shows here, not in its state)."""
    fields = _stat_fields(task / "stat")
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError):
        return 0.0


def _scheduling(task: Path) -> str:
    """Nice, scheduling policy and allowed CPUs: a thread kept off the CPUs by its own settings
    looks starved, not hung."""
    fields = _stat_fields(task / "stat")
    allowed = [line.split(":", 1)[1].strip() for line in _read(task / "status").splitlines()
               if line.startswith("Cpus_allowed_list")]
    nice = fields[16] if len(fields) > 16 else "?"
    policy = fields[38] if len(fields) > 38 else "?"
    return f"nice {nice} policy {policy} cpus {allowed[0] if allowed else '?'}"


def _signal_masks(task: Path) -> str:
    """Blocked and pending signals of a thread (a blocked SIGABRT means faulthandler cannot run)."""
    wanted = {"SigBlk", "SigPnd", "ShdPnd", "SigIgn", "SigCgt"}
    parts = [line.replace("\t", " ") for line in _read(task / "status").splitlines() if line.split(":")[0] in wanted]
    return " ".join(parts)


def _stat_fields(path: Path) -> list[str]:
    """Fields of a /proc stat file after the command name: [state, ppid, ...]."""
    text = _read(path)
    return text.rsplit(")", 1)[1].split() if ")" in text else []


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


_TEST_DATA_DIR = tempfile.mkdtemp(prefix="vmplacer-test-data-")


def clean_env(extra: Mapping[str, str] | None = None, *, drop: tuple[str, ...] = ("VMPLACER_",)) -> dict[str, str]:
    """This process's environment without the machine's own `VMPLACER_*` settings (a test sets
    the ones it means), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(extra or {})
    return env


def run_vmplacer(*args: str, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`vmplacer ARGS` as an operator runs it, in `clean_env()` unless `env` is given; a hang fails
    the test with every thread's stack (`run_reporting_hangs`)."""
    if env is None:
        env = clean_env()
        if not any(a == "--config" or a.startswith("--config=") for a in args):
            # Without a config the data directory would be the machine's (/var/lib/vmplacer as
            # root), and its state would decide the test: this test run has its own.
            env["VMPLACER_DATA_DIR"] = _TEST_DATA_DIR
    return run_reporting_hangs([VMPLACER, *args], env=env, cwd=cwd,
                               timeout=timeout)


def systemd_verify_problems(units: Sequence[Path], workdir: Path) -> list[str] | None:
    """What `systemd-analyze verify` finds wrong with `units` (None without systemd-analyze).

    The units name `man:vmplacer(1)`, which systemd checks with `man`: the page is generated
    from this checkout (`vmplacer manpage`) into `workdir` and found there through MANPATH, as
    an installed one is. Missing executables are the machine's, not the unit's, and are left out."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return None
    man1 = workdir / "man" / "man1"
    man1.mkdir(parents=True, exist_ok=True)
    page = run_vmplacer("manpage")
    assert page.returncode == 0, page.stderr
    (man1 / "vmplacer.1").write_text(page.stdout)
    env = {**os.environ, "MANPATH": f"{workdir / 'man'}:"}
    result = subprocess.run([analyze, "verify", *map(str, units)], capture_output=True, text=True, env=env)
    return [line for line in (result.stdout + result.stderr).splitlines()
            if line.strip() and "is not executable" not in line and "No such file" not in line]


class SerialisedHost:
    """A simulated host (vmplacer.lab.simulator) whose calls all take one lock: the simulator
    is not thread safe, and tests of code that works on hosts from several threads test that
    code, not the simulator. With `fail_pins`, pinning raises HypervisorError; with `gate`, the
    first pin waits there (every host's first pin at once)."""

    lock = threading.Lock()

    def __init__(self, inner, *, fail_pins: bool = False, gate=None):  # type: ignore[no-untyped-def]
        self.inner, self.name, self.fail_pins, self.gate = inner, inner.name, fail_pins, gate

    def pin_vcpu(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        from vmplacer.ports import HypervisorError

        gate, self.gate = self.gate, None
        if gate is not None:
            gate.wait()
        if self.fail_pins:
            raise HypervisorError(f"host {self.name}: pinning refused")
        with self.lock:
            return self.inner.pin_vcpu(*args, **kwargs)

    def __getattr__(self, item):  # type: ignore[no-untyped-def]
        attr = getattr(self.inner, item)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            with self.lock:
                return attr(*args, **kwargs)
        return call
