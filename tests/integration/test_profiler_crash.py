"""No VM is ever left paused by vmplacer: kill -9 the profiler and its guardian mid-freeze, again and again.

A child process runs the real profiler (the same wiring as `vmplacer profile`)
on real guests with a freeze cap far beyond the test. Each child is killed
together with its freeze guardian (what a cgroup kill or the OOM killer
taking the whole unit does), so only the journal replay can resume what it
froze: SIGKILL either from outside at a random moment of a freeze, or by
itself at a random exact point of the freeze protocol (after the journal
commit, between two parallel suspends, while sampling, between two
resumes...). `test_freeze_guardian.py` covers the kills the guardian survives. The next child is the
restart: it must find every domain the dead one froze and resume it first
thing, and it must leave alone a domain a user paused with `virsh suspend`.

The child is `test_profiler_crash_child.py` (kept free of test imports, so a
restart replays as soon as the interpreter has loaded what the replay needs).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("test_profiler_crash_child.py")
ITERATIONS = 24
# Exact points of the protocol a child may die at (phases the freezer reports).
KILL_PHASES = ("journaled", "guarded", "suspending", "suspend:", "suspended", "sampling", "resuming", "resume:", "resumed")


# ----- the test ----------------------------------------------------------------------------------


def states(conn, names):
    import libvirt

    result = {}
    for name in names:
        state, reason = conn.lookupByName(name).state()
        result[name] = ("paused" if state == libvirt.VIR_DOMAIN_PAUSED else
                        "running" if state == libvirt.VIR_DOMAIN_RUNNING else str(state),
                        reason)
    return result


def spawn(config: Path, names: list[str], *kill: str) -> subprocess.Popen:
    env = dict(os.environ, CRASH_CHILD_SPAWNED=repr(time.monotonic()))
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(config), ",".join(names), *kill],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1, env=env,
    )


def read_event(child: subprocess.Popen, deadline: float) -> dict | None:
    """The next JSON line of the child (None when it exited)."""
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            return None
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise AssertionError("child produced no event in time")


@pytest.mark.integration
def test_kill_9_mid_freeze_never_leaves_a_domain_paused(testbed, host1_conn, make_guest, tmp_path,
                                                       record_property):
    import libvirt

    from vmplacer.testbed.guests import wait_for_progress

    guests = [make_guest("a", pin="1", emulator_pin="0"), make_guest("b", pin="1", emulator_pin="0"),
              make_guest("c", pin="1", emulator_pin="0", workload="idle"),
              make_guest("held", pin="1", emulator_pin="0", workload="idle")]
    for guest in guests:
        wait_for_progress(guest.console, timeout_s=90)
    names = [g.name for g in guests]
    frozen_by_us, held = names[:3], names[3]
    # Paused by someone else before any freeze: must stay paused through everything.
    subprocess.run(["virsh", "-c", testbed.host1_uri, "suspend", held], check=True, capture_output=True)
    assert states(host1_conn, [held])[held] == ("paused", libvirt.VIR_DOMAIN_PAUSED_USER)

    config = tmp_path / "vmplacer.yaml"
    config.write_text(
        f"database_url: sqlite:///{tmp_path / 'crash.db'}\n"
        f"hosts:\n  - {{name: host1, uri: '{testbed.host1_uri}', domain_type: qemu}}\n"
        "profiler: {max_freeze_ms: 60000}\n"
    )
    from vmplacer.bootstrap import Container
    from vmplacer.config import load_settings

    Container(load_settings(config)).upgrade_database()

    rng = random.Random(20261121)
    left_paused_after_kill = 0
    replay_since_start, spawn_to_running = [], []
    kills: list[str] = []
    for iteration in range(ITERATIONS + 1):
        last = iteration == ITERATIONS
        if last:
            kill: tuple[str, ...] = ("replay-only", "0", "0")
        elif iteration % 2:
            phase = rng.choice(KILL_PHASES)
            kill = (phase, str(rng.randint(1, 3)), str(rng.choice([0, 0, 200, 2000])))
        else:
            kill = ()
        spawned = time.monotonic()
        child = spawn(config, names, *kill)
        try:
            first = read_event(child, spawned + 60)
            assert first is not None and first["event"] == "replayed", child.stderr.read()
            running_at = time.monotonic()
            now = states(host1_conn, names)
            # the restart has resumed everything the previous child froze ...
            assert all(now[n][0] == "running" for n in frozen_by_us), (iteration, now, first)
            # ... and nothing a user paused
            assert now[held] == ("paused", libvirt.VIR_DOMAIN_PAUSED_USER), (iteration, now)
            assert not first["errors"], first
            replay_since_start.append(first["since_start_s"])
            print(f"iteration {iteration} after {kills[-1] if kills else 'start'}: imports "
                  f"{first['imports_s']:.3f} s, replay {first['replay_s']:.3f} s, resumed {first['resumed']}")
            spawn_to_running.append(running_at - spawned)
            if last:
                child.wait(timeout=60)
                break
            if not kill:
                # kill -9 from outside (guardian first, as a cgroup kill may) at a random moment
                # after the first freeze began
                guardian = 0
                while True:
                    event = read_event(child, spawned + 60)
                    assert event is not None, child.stderr.read()
                    if event.get("event") == "guardian":
                        guardian = int(event["pid"])
                    if event.get("phase") == "journaled":
                        break
                time.sleep(rng.uniform(0.0, 0.45))
                os.kill(guardian, signal.SIGKILL)
                child.send_signal(signal.SIGKILL)
                kills.append("external")
            else:
                kills.append(f"{kill[0]}#{kill[1]}+{kill[2]}us")
            child.wait(timeout=60)
            assert child.returncode == -signal.SIGKILL, (child.returncode, child.stderr.read())
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
            child.stderr.close()
        after = states(host1_conn, names)
        if any(after[n][0] == "paused" for n in frozen_by_us):
            left_paused_after_kill += 1
        assert after[held][0] == "paused"

    final = states(host1_conn, names)
    record_property("kills", kills)
    record_property("kills_that_left_domains_paused", left_paused_after_kill)
    record_property("replay_since_spawn_s_max", round(max(replay_since_start), 3))
    record_property("spawn_to_all_running_s_max", round(max(spawn_to_running), 3))
    print(f"\n{len(kills)} kills ({left_paused_after_kill} left domains paused); restart resumed them "
          f"{max(replay_since_start):.3f} s after it was spawned at worst (median "
          f"{sorted(replay_since_start)[len(replay_since_start) // 2]:.3f} s); spawn to all running "
          f"at worst {max(spawn_to_running):.3f} s")
    assert all(final[n][0] == "running" for n in frozen_by_us), final
    assert final[held] == ("paused", libvirt.VIR_DOMAIN_PAUSED_USER)
    assert len(kills) >= 20
    assert left_paused_after_kill >= len(kills) // 4, "the kills must actually hit freezes"
    # How soon the restart resumes is not bounded here: it is interpreter start and imports
    # (0.4 s idle, 1.4 s seen under load), a property of the machine. What the product controls
    # is the order, checked above for every restart: it replays before anything else, so every
    # domain runs again before it freezes one. Promptness with nothing restarted is the
    # guardian's job (test_freeze_guardian.py).
    subprocess.run(["virsh", "-c", testbed.host1_uri, "resume", held], check=True, capture_output=True)
