"""A host whose daemon accepts connections and never answers (stopped, deadlocked, replies lost)
is a host failure within its `connect_timeout_s`, not a command that waits forever: the real
libvirt client against a listening socket that never replies."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest

from tests.support import run_vmplacer
from vmplacer.adapters.libvirt_open import OpenTimedOut, open_within


@pytest.fixture
def silent_daemon() -> Iterator[str]:
    """A qemu+tcp URI whose port accepts connections (the kernel's backlog) and answers nothing."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"qemu+tcp://127.0.0.1:{listener.getsockname()[1]}/system"


@pytest.fixture
def closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"qemu+tcp://127.0.0.1:{port}/system"


def test_an_open_that_gets_no_answer_ends_with_the_limit(silent_daemon):
    started = time.monotonic()
    with pytest.raises(OpenTimedOut, match="no answer within 0.5 s"):
        open_within(silent_daemon, 0.5)
    assert time.monotonic() - started >= 0.5  # it did wait the limit: a slow daemon gets its time


def test_libvirt_errors_of_an_open_pass_through_and_an_answering_daemon_connects(closed_port):
    with pytest.raises(libvirt.libvirtError):
        open_within(closed_port, 30)
    conn = open_within("test:///default", 30)
    try:
        assert conn.getType() == "TEST"
    finally:
        conn.close()


def test_vmplacer_hosts_reports_the_silent_host_and_still_lists_the_others(silent_daemon, tmp_path: Path):
    config = tmp_path / "vmplacer.yaml"
    config.write_text(
        f"database_url: sqlite:///{tmp_path / 'vmplacer.db'}\n"
        f"data_dir: {tmp_path}\n"
        "hosts:\n"
        f"  - {{name: stuck, uri: \"{silent_daemon}\", connect_timeout_s: 1}}\n"
        "  - {name: fine, uri: \"test:///default\"}\n")
    done = run_vmplacer("--config", str(config), "hosts", "--format", "json")
    listed = {h["name"]: h for h in json.loads(done.stdout)}
    assert done.returncode == 1, done.stderr  # a host is down: health scripts see it
    assert listed["stuck"]["reachable"] is False
    assert listed["stuck"]["error"] == f"host stuck: cannot connect to {silent_daemon}: no answer within 1 s"
    assert listed["fine"]["reachable"] is True, listed["fine"]
