"""Client of the freeze guardian process (the `FreezeGuard` port).

One guardian per freezing process and database, spawned before the first
freeze in a session of its own, so that neither a SIGKILL of this process
nor one of its whole process group ends it. Every freeze is armed in the
guardian (one pipe write, no round trip) before its first suspend and
disarmed after its last resume; see `freeze_guardian_process` for what the
guardian does with them. A guardian found dead is spawned again (and its
hosts registered again) before the next freeze: no guardian, no freeze.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import IO, Any

import psutil

from vmplacer.ports import HypervisorError

# Spawning the guardian: interpreter start + `import libvirt`, ~50-100 ms on an idle machine.
# The bound is for a machine so loaded that the freeze should not start anyway.
READY_TIMEOUT_S = 30.0
MODULE = "vmplacer.adapters.freeze_guardian_process"


class GuardianUnavailable(HypervisorError):
    """The guardian could not be started or answered with an error: do not freeze."""


class FreezeGuardian:
    """Talks to the one guardian of this process (thread-safe)."""

    def __init__(self, database_url: str | None):
        self.database_url = database_url
        self._hosts: dict[str, str] = {}
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._identity: dict[str, object] = {}
        self._pending = b""

    # ----- the FreezeGuard port --------------------------------------------------------------------
    def watch(self, host: str, uri: str) -> None:
        """Register a host (the guardian opens its own libvirt connection now, not mid-freeze)."""
        with self._lock:
            self._hosts[host] = uri
            process = self._ensure()
            self._register(process, host, uri)

    def identity(self) -> dict[str, object]:
        """The live guardian's pid and start time (a journal row records it)."""
        with self._lock:
            self._ensure()
            return dict(self._identity)

    def arm(self, entry_id: int, host: str, domains: list[tuple[str, str]], max_freeze_s: float) -> None:
        with self._lock:
            if host not in self._hosts:
                raise GuardianUnavailable(f"host {host}: not registered with the freeze guardian", host=host)
            self._send(self._ensure(), {"op": "arm", "id": entry_id, "host": host,
                                        "domains": [list(d) for d in domains],
                                        "sent": time.monotonic(), "max_freeze_s": max_freeze_s})

    def disarm(self, entry_id: int) -> None:
        with self._lock:
            process = self._process
            if process is None or process.poll() is not None:
                return  # nothing armed survives a dead guardian
            try:
                self._send(process, {"op": "disarm", "id": entry_id})
            except GuardianUnavailable:
                pass

    def close(self) -> None:
        """End the guardian (it resumes whatever is still armed first)."""
        with self._lock:
            process, self._process = self._process, None
        if process is not None and process.stdin is not None:
            try:
                process.stdin.close()
            except OSError:
                pass
            try:
                process.wait(timeout=READY_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # ----- the process -------------------------------------------------------------------------------
    def _ensure(self) -> subprocess.Popen[bytes]:
        process = self._process
        if process is not None and process.poll() is None:
            return process
        process = self._spawn()
        for host, uri in self._hosts.items():
            self._register(process, host, uri)
        return process

    def _spawn(self) -> subprocess.Popen[bytes]:
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                start_new_session=True, close_fds=True, env=_child_env())
        except OSError as exc:
            raise GuardianUnavailable(f"freeze guardian: cannot start: {exc}") from None
        self._pending = b""
        ready = self._read_reply(process)
        if not ready.get("ready"):
            process.kill()
            raise GuardianUnavailable(f"freeze guardian: unexpected first answer {ready}")
        try:
            started = psutil.Process(process.pid).create_time()
        except psutil.Error as exc:
            raise GuardianUnavailable(f"freeze guardian: exited at start: {exc}") from None
        self._process = process
        self._identity = {"pid": process.pid, "started": started}
        self._send(process, {"op": "config", "database_url": self.database_url or ""})
        return process

    def _register(self, process: subprocess.Popen[bytes], host: str, uri: str) -> None:
        self._send(process, {"op": "host", "name": host, "uri": uri})
        answer = self._read_reply(process)
        if "error" in answer:
            raise GuardianUnavailable(f"freeze guardian: {answer['error']}", host=host)

    def _send(self, process: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
        stdin: IO[bytes] | None = process.stdin
        if stdin is None:
            raise GuardianUnavailable("freeze guardian: no pipe")
        try:
            stdin.write(json.dumps(message).encode() + b"\n")
            stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as exc:
            raise GuardianUnavailable(f"freeze guardian (pid {process.pid}) is gone: {exc}") from None

    def _read_reply(self, process: subprocess.Popen[bytes]) -> dict[str, Any]:
        assert process.stdout is not None
        fd = process.stdout.fileno()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select([fd], [], [], max(0.0, remaining))
            if not readable:
                process.kill()
                raise GuardianUnavailable(f"freeze guardian: no answer within {READY_TIMEOUT_S:.0f} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise GuardianUnavailable(f"freeze guardian exited (status {process.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        try:
            return dict(json.loads(line))
        except ValueError:
            return {"error": f"unreadable answer {line[:200]!r}"}


def _child_env() -> dict[str, str]:
    """The guardian imports vmplacer from wherever this process did (a checkout or an install)."""
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return env


_shared: dict[str, FreezeGuardian] = {}
_shared_lock = threading.Lock()


def shared_guardian(database_url: str | None) -> FreezeGuardian:
    """The process's guardian for a database (one process, one guardian, however many freezers)."""
    key = database_url or ""
    with _shared_lock:
        guardian = _shared.get(key)
        if guardian is None:
            guardian = _shared[key] = FreezeGuardian(database_url)
        return guardian
