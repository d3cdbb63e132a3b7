"""The freeze guardian: a tiny process that resumes frozen guests when the freezing process cannot.

A vmplacer process that freezes guests spawns one guardian, in a session of
its own (so a kill of the parent's process group spares it), before its
first suspend. The parent writes one JSON line per event to the guardian's
stdin:

    {"op": "config", "database_url": "..."}          once, first
    {"op": "host", "name": "h1", "uri": "qemu:///system"}   answered {"ok": true} or {"error": ...}
    {"op": "arm", "id": 7, "host": "h1", "domains": [["a", "uuid"], ...],
     "sent": <CLOCK_MONOTONIC>, "max_freeze_s": 0.5}  written before the first suspend
    {"op": "disarm", "id": 7}                         after every domain of row 7 runs again

An armed row is rescued by the guardian:
- at its deadline (`sent + max_freeze_s + DEADLINE_MARGIN_S`), if still armed
  (the parent hangs, or its resume failed): cause "deadline";
- at once when the pipe closes with rows armed (the parent died, whatever
  killed it) or the guardian is asked to stop (SIGTERM): cause "parent-died".
A rescue resumes only the row's domains that are paused with reason "user"
(what a suspend sets), looked up by UUID so a new domain under the same name
is never touched. Only after every resume is issued does it import the
database layer, delete the journal row and write an audit entry (cause, how
far past the cap the pause went).

Import-light on purpose: the standard library, libvirt and vmplacer's small
libvirt connection helpers only until a rescue is done, so it is ready in tens
of milliseconds. A write of an `arm` line that returned is in the pipe: if the
parent dies right after, the guardian still reads it. Its helper threads
(libvirt's event loop, a connection being opened) block every signal, so the
stop signals it blocks while resuming really wait until the resumes are done.

Run as `python -m vmplacer.adapters.freeze_guardian_process`; it prints
`{"ready": true, "pid": N}` once it reads its stdin.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import libvirt

from vmplacer.adapters.libvirt_open import OpenTimedOut, open_within

# After the freezer's own watchdog (which fires at max_freeze_s after the first suspend):
# the guardian acts only when that watchdog could not.
DEADLINE_MARGIN_S = 0.25
# An idle guardian (no rows armed) re-checks its parent this often; the pipe's EOF is the
# real signal, this only bounds a wait on a pipe some forked child still holds open.
IDLE_POLL_S = 5.0
# After rescuing a dead parent's rows: look again this long after, then this long after that
# (a suspend request the parent sent before dying is still carried out by libvirtd).
LATE_SUSPEND_CHECKS_S = (0.2, 0.5)


# A daemon that accepts and never answers must not hold up the rescue of other hosts' guests
# (what it cannot resume stays in the journal for the next replay).
OPEN_TIMEOUT_S = 10.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Stop(Exception):
    """SIGTERM/SIGINT/SIGHUP: rescue what is armed, then exit."""


def _raise_stop(_signum: int, _frame: object) -> None:
    raise _Stop()


@dataclass
class Armed:
    id: int
    host: str
    domains: list[tuple[str, str]]
    deadline: float  # CLOCK_MONOTONIC
    max_freeze_s: float
    sent: float


@dataclass
class Rescue:
    journal_id: int
    host: str
    cause: str
    resumed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    overrun_s: float = 0.0  # time paused beyond the cap, at worst (from the arm message)

    def to_dict(self) -> dict[str, Any]:
        return {"journal_id": self.journal_id, "host": self.host, "cause": self.cause,
                "resumed": self.resumed, "errors": self.errors, "overrun_s": round(self.overrun_s, 4)}


def _quiet(_ctx: object, _err: object) -> None:
    """libvirt prints every error to stderr by default; the guardian reports its own."""


class Guardian:
    def __init__(self, out: Any = None):
        self.out = out if out is not None else sys.stdout
        self.uris: dict[str, str] = {}
        self.conns: dict[str, libvirt.virConnect] = {}
        self.armed: dict[int, Armed] = {}
        self.database_url: str | None = None
        self.rescues: list[Rescue] = []

    # ----- messages ----------------------------------------------------------------------------
    def handle(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "config":
            self.database_url = message.get("database_url") or None
        elif op == "host":
            name, uri = str(message["name"]), str(message["uri"])
            try:
                self.uris[name] = uri
                self._connect(name)
                self._reply({"ok": True, "host": name})
            except (libvirt.libvirtError, OpenTimedOut) as exc:
                self._reply({"error": f"host {name}: cannot connect to {uri}: {_why(exc)}"})
        elif op == "arm":
            sent, cap = float(message["sent"]), float(message["max_freeze_s"])
            entry = Armed(int(message["id"]), str(message["host"]),
                          [(str(n), str(u)) for n, u in message["domains"]],
                          sent + cap + DEADLINE_MARGIN_S, cap, sent)
            self.armed[entry.id] = entry
        elif op == "disarm":
            self.armed.pop(int(message["id"]), None)

    def _reply(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    # ----- libvirt -------------------------------------------------------------------------------
    def _connect(self, host: str) -> libvirt.virConnect:
        conn = self.conns.get(host)
        if conn is None or not conn.isAlive():
            conn = open_within(self.uris[host], OPEN_TIMEOUT_S)
            self.conns[host] = conn
        return conn

    def _resume(self, host: str, name: str, uuid: str) -> str:
        """'resumed', or why not: 'gone', 'running', 'paused for another reason'."""
        for attempt in (0, 1):
            try:
                conn = self._connect(host)
                dom = conn.lookupByUUIDString(uuid) if uuid else conn.lookupByName(name)
                state, reason = dom.state()
                if state != libvirt.VIR_DOMAIN_PAUSED:
                    return "running"
                if reason != libvirt.VIR_DOMAIN_PAUSED_USER:
                    return "paused for another reason"
                dom.resume()
                return "resumed"
            except libvirt.libvirtError as exc:
                code = exc.get_error_code()
                if code == libvirt.VIR_ERR_NO_DOMAIN:
                    return "gone"
                if code == libvirt.VIR_ERR_OPERATION_INVALID:
                    return "running"  # resumed by someone else between our read and our resume
                if attempt:
                    raise
                self.conns.pop(host, None)  # the daemon restarted or the link broke: reconnect once
        raise AssertionError("unreachable")

    def rescue(self, entry: Armed, cause: str) -> Rescue:
        result = Rescue(entry.id, entry.host, cause)
        if entry.host not in self.uris:
            result.errors.append(f"host {entry.host} was never registered")
        else:
            for name, uuid in entry.domains:
                try:
                    if self._resume(entry.host, name, uuid) == "resumed":
                        result.resumed.append(name)
                except (libvirt.libvirtError, OpenTimedOut) as exc:
                    result.errors.append(f"{name}: {_why(exc)}")
        result.overrun_s = max(0.0, time.monotonic() - entry.sent - entry.max_freeze_s)
        self.armed.pop(entry.id, None)
        self.rescues.append(result)
        sys.stderr.write(f"vmplacer freeze guardian: {json.dumps(result.to_dict())}\n")
        sys.stderr.flush()
        return result

    # ----- bookkeeping (after the resumes) ----------------------------------------------------
    def record(self) -> None:
        """Close rescued rows and audit them; any failure leaves the row for a replay."""
        if not self.rescues or not self.database_url:
            return
        try:
            from vmplacer.adapters.db.freeze_rescues import record_rescues

            record_rescues(self.database_url, [r.to_dict() for r in self.rescues], actor="freeze-guardian")
        except Exception as exc:  # noqa: BLE001 - the journal row stays; a replay will close it
            sys.stderr.write(f"vmplacer freeze guardian: could not record rescues: {exc}\n")
        self.rescues.clear()

    # ----- the loop ----------------------------------------------------------------------------
    def run(self, fd: int = 0) -> None:
        buffer = b""
        try:
            while True:
                now = time.monotonic()
                due = [e for e in self.armed.values() if e.deadline <= now]
                if due:
                    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # finish these resumes first
                    try:
                        for entry in due:
                            self.rescue(entry, "deadline")
                    finally:
                        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
                if self.rescues:
                    self.record()
                timeout = min((e.deadline for e in self.armed.values()), default=now + IDLE_POLL_S) - now
                readable, _, _ = select.select([fd], [], [], max(0.0, timeout))
                if not readable:
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break  # the parent is gone
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        try:
                            self.handle(json.loads(line))
                        except (ValueError, KeyError, TypeError) as exc:
                            sys.stderr.write(f"vmplacer freeze guardian: bad message {line[:200]!r}: {exc}\n")
        except _Stop:
            pass
        for signum in _STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        # Parent died (or we were told to stop): nobody else is going to resume these.
        orphans = list(self.armed.values())
        for entry in orphans:
            self.rescue(entry, "parent-died")
        # A suspend the parent sent just before it died may still be carried out by libvirtd
        # after that first pass: look again before the rows are closed.
        for delay in LATE_SUSPEND_CHECKS_S:
            if not orphans:
                break
            time.sleep(delay)
            for entry in orphans:
                self.recheck(entry)
        self.record()

    def recheck(self, entry: Armed) -> None:
        """Resume what a late suspend paused after this row's rescue, into that rescue's record."""
        rescued = next((r for r in self.rescues if r.journal_id == entry.id), None)
        if rescued is None or entry.host not in self.uris:
            return
        for name, uuid in entry.domains:
            try:
                if self._resume(entry.host, name, uuid) == "resumed" and name not in rescued.resumed:
                    rescued.resumed.append(name)
            except (libvirt.libvirtError, OpenTimedOut) as exc:
                rescued.errors.append(f"{name}: {_why(exc)}")


def _why(exc: Exception) -> str:
    return str(exc.get_error_message()) if isinstance(exc, libvirt.libvirtError) else str(exc)


def main() -> None:
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _raise_stop)
    libvirt.registerErrorHandler(_quiet, None)
    guardian = Guardian()
    guardian._reply({"ready": True, "pid": os.getpid()})
    guardian.run()


if __name__ == "__main__":
    main()
