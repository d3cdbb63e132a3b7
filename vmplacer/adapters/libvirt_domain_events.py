"""Which of a host's domains may have changed since its domains were last read, from libvirt's
domain events, so that placing re-reads (XMLDesc) only those instead of every domain.

Events cover what others do behind vmplacer's back as it happens, but they arrive
asynchronously and not every change has one (libvirt's test driver sends none for a re-pin;
the QEMU driver none for a change to a shut-off guest's definition or to its NUMA tuning).
So a read is also a full one (every domain re-read) at least every `resync_s`, after the
connection was (re)opened or lost, and always when events cannot be had: `resync_s` bounds
how long a change without an event stays unseen. vmplacer's own changes are marked by the
caller when they return, not when their event comes.

Marks are kept by domain name: a renamed, redefined or new domain is seen under its new name,
which the previous read did not list, and is read for that reason alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import libvirt

from vmplacer.adapters.quiet_thread import start_quiet_thread

log = logging.getLogger(__name__)

DEFAULT_RESYNC_S = 5.0

# Events that may change what a domain's XML says of its placement: defined/undefined/started/
# stopped/migrated (lifecycle), vcpupin/emulatorpin/scheduler (tunable), metadata (labels), and
# devices (memory devices count towards a guest's memory).
WATCHED_EVENTS = tuple(getattr(libvirt, f"VIR_DOMAIN_EVENT_ID_{name}") for name in
                       ("LIFECYCLE", "TUNABLE", "METADATA_CHANGE", "DEVICE_ADDED", "DEVICE_REMOVED"))

_loop_lock = threading.Lock()
_loop_running = False


def start_event_loop() -> bool:
    """libvirt's default event loop, run by one daemon thread, once per process: without it no
    connection delivers events. It must be registered before the connections that are to deliver
    events are opened (a remote connection opened earlier never does). False if libvirt refuses."""
    global _loop_running
    with _loop_lock:
        if _loop_running:
            return True
        try:
            libvirt.virEventRegisterDefaultImpl()
        except libvirt.libvirtError as exc:
            log.warning("libvirt event loop unavailable (%s): every read of a host's domains is a full one",
                        exc.get_error_message())
            return False
        start_quiet_thread(_run_event_loop, "libvirt-events")
        _loop_running = True
        return True


def _run_event_loop() -> None:
    while True:
        if libvirt.virEventRunDefaultImpl() < 0:
            time.sleep(0.1)  # a failed iteration must not spin a core


class DomainEvents:
    """Dirty marks of one host's domains, set by libvirt's event thread and by vmplacer's own
    changes, taken by the (single) reader of the host's domains.

    The reader swaps the mark set for an empty one when its read starts: a mark set while it
    reads lands in the new set and makes the next read re-read that domain, so no mark is lost
    between being set and a read that saw the change."""

    def __init__(self, host: str, resync_s: float = DEFAULT_RESYNC_S,
                 clock: Callable[[], float] = time.monotonic):
        if resync_s < 0:
            raise ValueError(f"host {host}: domain resync interval must be >= 0 s, got {resync_s:g}")
        self.host = host
        self.resync_s = resync_s
        self._clock = clock
        self._lock = threading.Condition()
        self._dirty: set[str] = set()
        self._all_dirty = True  # nothing read yet
        self._last_full: float | None = None
        self._conn: libvirt.virConnect | None = None  # the connection whose events are watched
        self._callbacks: list[int] = []
        self.events_seen = 0  # domain events received so far (how tests know one has arrived)
        self._seen_by_name: dict[str, int] = {}

    # ----- connection ------------------------------------------------------------------------
    def watch(self, conn: libvirt.virConnect) -> bool:
        """Watch a freshly opened connection's domain events (everything read before it is
        suspect: all dirty). False, with every read then a full one, if the connection
        cannot deliver events or `resync_s` is 0 (every read full anyway)."""
        self.mark_all()
        if self.resync_s == 0 or not start_event_loop():
            return False
        ids: list[int] = []
        try:
            for event in WATCHED_EVENTS:
                ids.append(conn.domainEventRegisterAny(None, event, self._on_event, None))
            conn.registerCloseCallback(self._on_close, None)
        except libvirt.libvirtError as exc:
            log.warning("host %s: no domain events (%s): every read of its domains is a full one",
                        self.host, exc.get_error_message())
            _deregister(conn, ids)
            return False
        with self._lock:  # a read that took the marks before the callbacks were in reads all again
            self._conn, self._callbacks = conn, ids
            self._all_dirty = True
        return True

    def unwatch(self, conn: libvirt.virConnect) -> None:
        """Stop watching a connection about to be closed (all dirty: a later one starts afresh)."""
        with self._lock:
            watched = self._conn is conn
            ids, self._callbacks = (self._callbacks, []) if watched else ([], self._callbacks)
            if watched:
                self._conn = None
            self._all_dirty = True
        _deregister(conn, ids)
        if watched:
            try:
                conn.unregisterCloseCallback()
            except libvirt.libvirtError:
                pass

    @property
    def watching(self) -> bool:
        return self._conn is not None

    def _on_event(self, _conn: Any, dom: libvirt.virDomain, *_details: Any) -> None:
        try:
            name = dom.name()
        except libvirt.libvirtError:
            self.mark_all()
            return
        with self._lock:
            self._dirty.add(name)
            self.events_seen += 1
            self._seen_by_name[name] = self._seen_by_name.get(name, 0) + 1
            self._lock.notify_all()

    def events_about(self, name: str) -> int:
        """Domain events received so far about the domain of that name."""
        with self._lock:
            return self._seen_by_name.get(name, 0)

    def wait_for_events(self, seen: int, timeout_s: float, about: str | None = None) -> bool:
        """Wait until more than `seen` domain events have arrived, or, with `about`, more than
        `seen` about that domain (False after `timeout_s`): for callers that must know an
        outside change's event is in before they read. A driver delivers a connection's events
        in the order they happened, so once the event of a later change is in, so are all
        earlier ones."""
        def arrived() -> bool:
            return (self.events_seen if about is None else self._seen_by_name.get(about, 0)) > seen

        with self._lock:
            return self._lock.wait_for(arrived, timeout_s)

    def _on_close(self, conn: Any, _reason: int, _opaque: Any) -> None:
        """The connection was lost: events may have been missed; the next read is a full one."""
        with self._lock:
            if self._conn is conn or self._conn is None:
                self._conn = None
            self._all_dirty = True

    # ----- marks -----------------------------------------------------------------------------
    def mark(self, name: str) -> None:
        """A domain vmplacer itself changed (call when the change has returned)."""
        with self._lock:
            self._dirty.add(name)

    def mark_all(self) -> None:
        with self._lock:
            self._all_dirty = True

    def take(self) -> tuple[bool, frozenset[str]]:
        """For a read starting now: (whether to re-read every domain, the names to re-read), the
        marks cleared. A full read is due when nothing is watched, when all is dirty, or
        `resync_s` after the last full one. Give them back with `give_back` if the read fails."""
        with self._lock:
            now = self._clock()
            full = (self._all_dirty or self._conn is None or self._last_full is None
                    or now - self._last_full >= self.resync_s)
            dirty, self._dirty = frozenset(self._dirty), set()
            self._all_dirty = False
            if full:
                self._last_full = now
            return full, dirty

    def give_back(self, full: bool, dirty: frozenset[str]) -> None:
        """A read that failed part way: what it took is still to be read."""
        with self._lock:
            self._dirty |= dirty
            if full:
                self._all_dirty = True


def _deregister(conn: libvirt.virConnect, ids: list[int]) -> None:
    """Best effort: closing a connection must not fail on its callbacks. libvirt-python raises
    KeyError for an id libvirt still held but the binding had already dropped (deregistered
    while an event was being dispatched to it)."""
    for callback in ids:
        try:
            conn.domainEventDeregisterAny(callback)
        except (libvirt.libvirtError, KeyError):
            pass
