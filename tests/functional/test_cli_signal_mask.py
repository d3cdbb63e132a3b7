"""The CLI receives stop and fatal signals whatever mask its parent left it: a mask survives exec,
and a `serve` or `guard` started from a thread that blocked SIGTERM would otherwise ignore every
stop, and a hung command sent SIGABRT could not print where it hangs."""

from __future__ import annotations

import signal
import subprocess
import sys

from vmplacer.cli.main import DELIVERED_SIGNALS

# Blocks every signal, then runs the CLI's entry point as the installed script does (argv from
# sys.argv), then prints the signals still blocked.
CHILD = """
import signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
sys.argv = ["vmplacer", "config", "schema", "request"]
from vmplacer.cli.main import main
code = main()
sys.stdout.flush()
print("\\nBLOCKED", sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])), "EXIT", code)
"""


def blocked_after_main() -> tuple[set[int], str]:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    numbers, code = line.removeprefix("BLOCKED [").split("] EXIT ")
    return {int(n) for n in numbers.split(",") if n.strip()}, code


def test_the_entry_point_unblocks_stop_and_fatal_signals_it_inherited_blocked():
    blocked, code = blocked_after_main()
    assert code == "0"
    assert not blocked & {int(s) for s in DELIVERED_SIGNALS}, sorted(blocked & {int(s) for s in DELIVERED_SIGNALS})
    # only those: the rest of what the parent chose stays as it was
    assert int(signal.SIGUSR1) in blocked and int(signal.SIGCHLD) in blocked


def test_a_caller_passing_argv_keeps_its_own_mask():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        from vmplacer.cli.main import main

        assert main(["config", "schema", "request"]) == 0
        assert signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
