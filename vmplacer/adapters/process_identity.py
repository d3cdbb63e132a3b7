"""Who froze a domain, and is that process still alive? (for the freeze journal).

A pid alone is not an identity: pids are reused. The owner record adds the
process start time, so a new process that happens to get a dead freezer's
pid is not mistaken for it.
"""

from __future__ import annotations

import os
import socket
import uuid

import psutil

_INSTANCE = uuid.uuid4().hex


def current_owner() -> dict[str, object]:
    pid = os.getpid()
    return {
        "hostname": socket.gethostname(),
        "pid": pid,
        "started": psutil.Process(pid).create_time(),
        "instance": _INSTANCE,
    }


def owner_alive(owner: dict[str, object]) -> bool | None:
    """True/False for an owner on this machine; None when it ran elsewhere (unknowable here)."""
    if owner.get("hostname") != socket.gethostname():
        return None
    try:
        pid = int(owner["pid"])  # type: ignore[call-overload]
        started = float(owner["started"])  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return False  # a record we cannot read belongs to nobody who can resume it
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - started) < 0.5 and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True  # it exists; its deadline still bounds how long we wait for it
