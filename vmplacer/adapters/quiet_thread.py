"""Helper threads that never take a signal.

The kernel hands a process-directed signal (SIGTERM, SIGINT) to any thread that does not
block it, and Python then runs the handler in the main thread at its next chance, whatever
that thread's own mask says. A process that blocks its stop signals around work that must
finish (the freeze guardian resuming guests) is only safe if no other thread accepts them:
the libvirt helper threads are started with every such signal blocked, which they inherit.

The fatal signals faulthandler reports on (SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL) stay
deliverable: no Python handler runs for them, and a helper thread that takes a SIGABRT sent to
a hung process prints every thread's stack even while the main thread blocks signals itself.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any


FATAL_SIGNALS = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL})


def quiet_signals() -> set[signal.Signals]:
    """The signals a helper thread blocks: all but the fatal ones."""
    return set(signal.valid_signals()) - FATAL_SIGNALS


def start_quiet_thread(target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()) -> threading.Thread:
    """A started daemon thread with every signal but the fatal ones blocked."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, quiet_signals())
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return thread
