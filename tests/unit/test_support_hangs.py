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
    assert "still running after 1 s of its own time" in message
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


SPIN = "import time\nstart = time.process_time()\nwhile time.process_time() - start < {cpu_s}: pass\n"


def _on_one_cpu_under(policy: int):
    """preexec_fn: the child runs on this process's first allowed CPU under `policy`."""
    cpu = min(os.sched_getaffinity(0))

    def setup() -> None:
        os.sched_setaffinity(0, {cpu})
        os.sched_setscheduler(0, policy, os.sched_param(0))
    return setup


def test_time_the_machine_withholds_is_not_the_commands_own():
    """A command starved of CPU (SCHED_IDLE beside a normal spinner on its only CPU) is kept
    runnable without a CPU most of the time: the clock counts that as the machine's, not its own."""
    import subprocess
    import time

    from tests.support import OwnClock

    hog = subprocess.Popen([sys.executable, "-c", SPIN.format(cpu_s=600)], preexec_fn=_on_one_cpu_under(os.SCHED_OTHER))
    try:
        starved = subprocess.Popen([sys.executable, "-c", SPIN.format(cpu_s=0.2)],
                                   preexec_fn=_on_one_cpu_under(os.SCHED_IDLE))
        clock = OwnClock(starved.pid)
        while starved.poll() is None and not (sum(clock.cpu.values()) > 0 and clock.wall_s() > 1):
            time.sleep(0.2)
            clock.sample()
        starved.kill()
        starved.wait()
    finally:
        hog.kill()
        hog.wait()
    cpu = sum(clock.cpu.values())
    assert cpu > 0, "the starved command never ran"
    # causal: under SCHED_IDLE against a spinner it waits far longer than it runs
    assert clock.withheld_s() > 3 * cpu, (clock.withheld_s(), cpu)
    assert clock.own_s() < clock.wall_s() - clock.withheld_s() + 1e-9
    assert "runnable without a CPU" in clock.summary(1)


def test_a_hung_command_reports_the_machine_and_its_own_time():
    with pytest.raises(pytest.fail.Exception) as failed:
        run_reporting_hangs([sys.executable, "-c", STUCK], timeout=1)
    message = str(failed.value)
    assert "of its own time (timeout 1 s)" in message
    assert "--- machine: load average" in message
    # how the kernel schedules each thread (the command inherits this process's niceness)
    assert f" nice {os.nice(0)} policy 0 cpus " in message
