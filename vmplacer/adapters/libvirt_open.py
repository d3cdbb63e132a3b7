"""Open a libvirt connection within a time limit, with keepalive on it.

`virConnectOpen` has no timeout of its own: against a daemon that accepts the connection and
never answers (stopped, deadlocked, a host whose network drops replies) it waits forever, and
with it `vmplacer hosts`, a placement or a timer's rebalance run. The open runs in a helper
thread; the caller waits at most `timeout_s` and gets an error naming the host. A connection the
helper obtains after the caller gave up is closed, so nothing leaks; the helper thread itself
stays blocked until libvirt returns (libvirt offers no way to cancel an open).

Once open, a call on the connection waits for its reply just as long: the connection gets
libvirt's keepalive (its messages are answered by the daemon's event loop even while a long
call such as a migration runs), so a daemon that stops answering closes the connection after
KEEPALIVE_INTERVAL_S x (KEEPALIVE_COUNT + 1) and the call fails instead of waiting forever.
Keepalive needs libvirt's event loop, which is started before the open; a driver without
keepalive (the test driver, a local hypervisor) goes without.
"""

from __future__ import annotations

import threading

import libvirt

from vmplacer.adapters.libvirt_domain_events import start_event_loop
from vmplacer.adapters.quiet_thread import start_quiet_thread

# libvirtd's own defaults for its side of the same check (libvirtd.conf keepalive_*).
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 5


class OpenTimedOut(Exception):
    """The daemon did not complete the open within the limit."""


class _Attempt:
    """One open, handed over to whoever is still interested when it ends."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.abandoned = False
        self.conn: libvirt.virConnect | None = None
        self.error: libvirt.libvirtError | None = None

    def run(self, uri: str) -> None:
        conn, error = None, None
        try:
            conn = libvirt.open(uri)
        except libvirt.libvirtError as exc:
            error = exc
        with self.lock:  # outcome and `done` together: `abandon` sees both or neither
            if self.abandoned:
                if conn is not None:
                    _close_quietly(conn)
            else:
                self.conn, self.error = conn, error
            self.done.set()

    def abandon(self) -> bool:
        """Give up on the open; False if it ended meanwhile (its outcome then stands)."""
        with self.lock:
            if self.done.is_set():
                return False
            self.abandoned = True
            return True


def open_within(uri: str, timeout_s: float) -> libvirt.virConnect:
    """`libvirt.open(uri)` with keepalive, or OpenTimedOut after `timeout_s`; libvirt's own errors
    pass through."""
    start_event_loop()  # before the open: a connection opened without it gets no keepalive (nor events)
    attempt = _Attempt()
    start_quiet_thread(attempt.run, f"libvirt-open {uri}", (uri,))
    if not attempt.done.wait(timeout_s) and attempt.abandon():
        raise OpenTimedOut(f"no answer within {timeout_s:g} s")
    if attempt.error is not None:
        raise attempt.error
    assert attempt.conn is not None
    _keep_alive(attempt.conn)
    return attempt.conn


def _keep_alive(conn: libvirt.virConnect) -> None:
    try:
        conn.setKeepAlive(KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT)
    except libvirt.libvirtError:
        pass  # the driver has none (test://, a local hypervisor): nothing between to break


def _close_quietly(conn: libvirt.virConnect) -> None:
    try:
        conn.close()
    except libvirt.libvirtError:
        pass
