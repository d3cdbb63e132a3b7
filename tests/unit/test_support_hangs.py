"""A command the tests run that hangs must say where: the helper makes it print its stack."""

from __future__ import annotations

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
