"""A command the tests run that hangs must say where: the helper makes it print its stack."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from tests.support import run_reporting_hangs

STUCK = "import time\ndef stuck_in_here():\n    time.sleep(120)\nprint('started', flush=True)\nstuck_in_here()\n"


def test_a_hung_command_fails_the_test_with_its_stack_and_output():
    with pytest.raises(pytest.fail.Exception) as failed:
        run_reporting_hangs([sys.executable, "-c", STUCK], timeout=1)
    message = str(failed.value)
    assert "still running after 1 s" in message
    assert "stuck_in_here" in message  # the frame it hung in
    assert "started" in message  # what it printed before


def test_a_command_that_ends_is_returned_as_run_returns_it():
    done = run_reporting_hangs([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], timeout=60)
    assert (done.returncode, done.stdout) == (3, "out\n")


def test_a_hung_command_reports_how_the_kernel_sees_it_and_its_children():
    parent = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],\n"
              "                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
              "print('child', child.pid, flush=True)\n"
              "time.sleep(120)\n")
    with pytest.raises(pytest.fail.Exception) as failed:
        run_reporting_hangs([sys.executable, "-c", parent], timeout=2)
    message = str(failed.value)
    child_pid = int(message.split("--- its stdout:\nchild ", 1)[1].split()[0])
    view = message.split("the kernel's view of it then:", 1)[1].split("--- its threads' stacks", 1)[0]
    assert f"pid {child_pid}:" in view  # the child is described too
    assert " state S " in view  # each thread's scheduler state (a sleeping process: S)
    try:
        os.kill(child_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
