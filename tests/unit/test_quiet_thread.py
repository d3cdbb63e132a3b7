"""libvirt helper threads never take a signal a handler runs for: a process that blocks its stop
signals around work that must finish relies on no other thread accepting them. The fatal ones
stay open, so a hung process sent SIGABRT still prints its stacks (faulthandler)."""

from __future__ import annotations

import signal
import threading

from vmplacer.adapters.quiet_thread import FATAL_SIGNALS, start_quiet_thread


def test_the_thread_blocks_every_signal_but_the_fatal_ones_and_the_caller_keeps_its_own_mask():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    seen: list[set[signal.Signals]] = []
    done = threading.Event()

    def report() -> None:
        seen.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        done.set()

    start_quiet_thread(report, "probe")
    assert done.wait(30)
    # every standard signal (the C library keeps two real-time ones for itself)
    standard = {s for s in signal.valid_signals() if s < 32} - {signal.SIGKILL, signal.SIGSTOP} - FATAL_SIGNALS
    assert standard <= seen[0], sorted(standard - seen[0])
    assert {signal.SIGTERM, signal.SIGINT, signal.SIGHUP} <= seen[0]
    assert not FATAL_SIGNALS & seen[0], sorted(FATAL_SIGNALS & seen[0])
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
