"""Helpers shared by tests: the CI rule "missing infrastructure fails, never skips", and running a
command (the installed `vmplacer` above all) so that a hang reports where it hung."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
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
    before the test fails: a hang then says where it hung instead of only that it did."""
    environment = dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")
    hung = False
    with subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=environment, cwd=cwd) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            hung = True
            process.send_signal(signal.SIGABRT)
            try:
                out, err = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
    if hung:
        pytest.fail(f"{' '.join(cmd)} was still running after {timeout:g} s; its threads then:\n"
                    f"{err[-12000:]}\n--- its stdout:\n{out[-2000:]}", pytrace=False)
    return subprocess.CompletedProcess(list(cmd), process.returncode, out, err)


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
    return run_reporting_hangs([VMPLACER, *args], env=clean_env() if env is None else env, cwd=cwd,
                               timeout=timeout)
