"""Helpers shared by tests: the CI rule "missing infrastructure fails, never skips", and running a
command (the installed `vmplacer` above all) so that a hang reports where it hung."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
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


def run_reporting_hangs(cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                        cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(cmd, capture_output=True, text=True)`, except that a Python command still
    running after `timeout` is made to print every thread's stack (faulthandler, on SIGABRT)
    before the test fails: a hang then says where it hung instead of only that it did. The
    kernel's view of the command and its children (state, wait channel and kernel stack of every
    thread) is read first: a process blocked where no signal handler runs (an uninterruptible
    wait, a stopped or frozen task) prints no Python stack, and this says where it waits."""
    environment = dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")
    hung = False
    kernel_view = ""
    caller_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=environment, cwd=cwd) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            hung = True
            tree = process_tree(process.pid)
            kernel_view = "\n".join(describe_process(pid) for pid in tree)
            kernel_view += "\n" + python_stacks(process.pid)
            # a child starts with its parent's mask: one inherited with SIGABRT blocked prints no stack
            kernel_view += f"\n--- signals this test's thread blocked when it started the command: {sorted(caller_mask)}"
            process.send_signal(signal.SIGABRT)  # only the command: a child may be holding guests paused
            try:
                out, err = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
    if hung:
        pytest.fail(f"{' '.join(cmd)} was still running after {timeout:g} s; the kernel's view of it then:\n"
                    f"{kernel_view}\n--- its threads' stacks (SIGABRT):\n"
                    f"{err[-12000:]}\n--- its stdout:\n{out[-2000:]}", pytrace=False)
    return subprocess.CompletedProcess(list(cmd), process.returncode, out, err)


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
                     f"cpu {_cpu_seconds(task):.1f} s {_signal_masks(task)}")
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
