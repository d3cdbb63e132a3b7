"""Commands that undo or delete operator state ask first: `db downgrade`, `token revoke` and a
real `rebalance --drain HOST`. Without a terminal they need `--yes` (exit 2 naming it, nothing
changed); on a terminal (a pty here) a y/N question decides, and No changes nothing."""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import VMPLACER, clean_env, require, run_vmplacer

HANG_GUARD_S = 120  # only to end a hung test; the command answers at once


def on_tty(env: dict[str, str], *args: str, answer: str) -> tuple[int, str]:
    """`vmplacer ARGS` with stdin, stdout and stderr on a pseudo-terminal, typing `answer` at the
    y/N question. (exit code, everything the terminal showed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([VMPLACER, *args], stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    shown, answered = b"", False
    deadline = time.monotonic() + HANG_GUARD_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the command exited and the terminal closed
                break
            if not chunk:
                break
            shown += chunk
            if not answered and b"[y/N]" in shown:
                os.write(master, answer.encode() + b"\n")
                answered = True
        else:
            proc.kill()
            pytest.fail(f"vmplacer {' '.join(args)} hung on a terminal; it showed: {shown.decode(errors='replace')}")
        code = proc.wait(timeout=HANG_GUARD_S)
    finally:
        os.close(master)
    text = shown.decode(errors="replace")
    assert answered, f"no y/N question on a terminal: {text}"
    return code, text


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return clean_env({"VMPLACER_DATA_DIR": str(tmp_path)})


def vmplacer(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer(*args, env=env)


def _tokens(env: dict[str, str]) -> list[str]:
    listed = vmplacer(env, "token", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    return [t["name"] for t in json.loads(listed.stdout)]


def test_token_revoke_needs_yes_without_a_terminal(env):
    assert vmplacer(env, "token", "create", "ci", "--scope", "read").returncode == 0
    refused = vmplacer(env, "token", "revoke", "ci")
    assert refused.returncode == 2 and "--yes" in refused.stderr and "nothing changed" in refused.stderr, refused
    assert _tokens(env) == ["ci"]
    done = vmplacer(env, "token", "revoke", "ci", "--yes")
    assert done.returncode == 0 and "token ci revoked" in done.stdout, done.stderr
    assert _tokens(env) == []
    unknown = vmplacer(env, "token", "revoke", "ci")  # bad input is said first, not a question
    assert unknown.returncode == 2 and "no token named 'ci'" in unknown.stderr and "--yes" not in unknown.stderr


def test_token_revoke_on_a_terminal_asks_and_no_keeps_the_token(env):
    assert vmplacer(env, "token", "create", "ci", "--scope", "read").returncode == 0
    code, shown = on_tty(env, "token", "revoke", "ci", answer="n")
    assert code == 2 and "not confirmed, nothing changed" in shown, shown
    assert _tokens(env) == ["ci"]
    code, shown = on_tty(env, "token", "revoke", "ci", answer="")  # Enter: the default, No
    assert code == 2 and _tokens(env) == ["ci"], shown
    code, shown = on_tty(env, "token", "revoke", "ci", answer="y")
    assert code == 0 and "token ci revoked" in shown, shown
    assert _tokens(env) == []


def _revision(env: dict[str, str]) -> str | None:
    current = vmplacer(env, "db", "current", "--format", "json")
    assert current.returncode == 0, current.stderr
    return json.loads(current.stdout)["current"]


def test_db_downgrade_needs_yes_without_a_terminal_and_asks_on_one(env):
    assert vmplacer(env, "db", "upgrade").returncode == 0
    head = _revision(env)
    refused = vmplacer(env, "db", "downgrade", "-1")
    assert refused.returncode == 2 and "--yes" in refused.stderr, refused.stderr
    assert _revision(env) == head
    typo = vmplacer(env, "db", "downgrade", "nonsense")
    assert typo.returncode == 2 and "not a known schema revision" in typo.stderr and "--yes" not in typo.stderr
    code, shown = on_tty(env, "db", "downgrade", "-1", answer="n")
    assert code == 2 and "not confirmed" in shown and _revision(env) == head, shown
    code, shown = on_tty(env, "db", "downgrade", "-1", answer="y")
    assert code == 0, shown
    once_back = _revision(env)
    assert once_back not in (None, head)
    assert vmplacer(env, "db", "upgrade").returncode == 0
    done = vmplacer(env, "db", "downgrade", "-1", "--yes")
    assert done.returncode == 0 and f"at revision {once_back}" in done.stdout, done.stderr
    assert _revision(env) == once_back


@pytest.fixture
def two_hosts(tmp_path) -> Path:
    require(importlib.util.find_spec("libvirt") is not None, "libvirt-python is not installed")
    path = tmp_path / "vmplacer.yaml"
    path.write_text(f"database_url: sqlite:///{tmp_path / 'vmplacer.db'}\ndata_dir: {tmp_path}\n"
                    "hosts:\n  - {name: t1, uri: \"test:///default\", domain_type: qemu}\n"
                    "  - {name: t2, uri: \"test:///default\", domain_type: qemu}\n")
    return path


def _maintenance(config: Path) -> dict[str, str | None]:
    listed = run_vmplacer("--config", str(config), "hosts", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    return {h["name"]: (h["maintenance"] or {}).get("reason") for h in json.loads(listed.stdout)}


def test_a_real_drain_needs_yes_without_a_terminal_and_asks_on_one(two_hosts):
    drain = ("--config", str(two_hosts), "rebalance", "--drain", "t1", "--reason", "bios", "--profile-seconds", "0")
    refused = run_vmplacer(*drain)
    assert refused.returncode == 2 and "--yes" in refused.stderr, refused.stderr
    assert _maintenance(two_hosts) == {"t1": None, "t2": None}, "nothing changed"
    dry = run_vmplacer(*drain, "--dry-run", "--format", "json")  # a dry run changes nothing: no question
    assert dry.returncode in (0, 1) and "--yes" not in dry.stderr, dry.stderr
    assert _maintenance(two_hosts) == {"t1": None, "t2": None}
    not_for_dry = run_vmplacer(*drain, "--dry-run", "--yes")
    assert not_for_dry.returncode == 2 and "--yes: only for a real drain" in not_for_dry.stderr
    env = clean_env()
    code, shown = on_tty(env, *drain, answer="n")
    assert code == 2 and "not confirmed" in shown, shown
    assert _maintenance(two_hosts) == {"t1": None, "t2": None}
    code, shown = on_tty(env, *drain, answer="y")
    # the test driver's one domain shows on both hosts, so it stays and the drain exits 1 naming it
    assert code == 1 and "stays on t1" in shown, shown
    assert _maintenance(two_hosts) == {"t1": "bios", "t2": None}


def test_prune_does_not_ask(env):
    """Retention is routine (a daily timer): it deletes only finished records past their age."""
    done = vmplacer(env, "db", "prune", "--format", "json")
    assert done.returncode == 0 and "--yes" not in done.stderr, done.stderr
    assert "counts" in json.loads(done.stdout)
