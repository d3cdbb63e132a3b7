"""The profiler process `test_profiler_crash.py` kills: replay, then profile until killed.

    python tests/integration/test_profiler_crash_child.py CONFIG NAME,NAME,... [PHASE COUNT DELAY_US]

Prints one JSON line per event. With PHASE, it SIGKILLs its freeze guardian and
then itself (as a cgroup kill would) at the COUNT-th freezer phase starting
with PHASE, DELAY_US microseconds after it; PHASE
`replay-only` stops after the replay. No test in here; no pytest import.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str]) -> None:
    # The test's CLOCK_MONOTONIC reading when it spawned this process (shared system-wide).
    started = float(os.environ["CRASH_CHILD_SPAWNED"])
    config_path, names_arg = argv[0], argv[1]
    kill_phase, kill_count, delay_us = (argv[2], int(argv[3]), int(argv[4])) if len(argv) > 4 else (None, 0, 0)
    names = tuple(names_arg.split(","))

    from vmplacer.bootstrap import Container
    from vmplacer.bootstrap.profiler import replay_freeze_journal
    from vmplacer.config import load_settings

    imported = time.monotonic()
    container = Container(load_settings(config_path))
    replay = replay_freeze_journal(container, "host1")
    print(json.dumps({"event": "replayed", "since_start_s": time.monotonic() - started,
                      "imports_s": imported - started, "replay_s": time.monotonic() - imported,
                      "resumed": [d for _, d in replay.resumed], "errors": replay.errors}), flush=True)
    if kill_phase == "replay-only":
        return

    from vmplacer.app.observe.profiler import ProfilerConfig, SensitiveSelector
    from vmplacer.bootstrap.profiler import build_profiler

    seen = {"n": 0}
    guardian = {"pid": 0}

    def on_phase(phase: str) -> None:
        print(json.dumps({"event": "phase", "phase": phase}), flush=True)
        if kill_phase and phase.startswith(kill_phase):
            seen["n"] += 1
            if seen["n"] >= kill_count:
                if delay_us:
                    time.sleep(delay_us / 1e6)
                # What a cgroup kill does: the guardian dies with its parent.
                os.kill(guardian["pid"], signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)

    config = ProfilerConfig(t_m_s=0.3, t_sleep_s=0.05, max_freeze_s=60.0, duration_s=20.0, scope=names,
                            sensitive=SensitiveSelector(frozenset(names[:2])))
    profiler, freezer = build_profiler(container, "host1", config, store=False, on_phase=on_phase)
    guardian["pid"] = freezer.guard.pid  # type: ignore[union-attr]
    print(json.dumps({"event": "guardian", "pid": guardian["pid"]}), flush=True)
    try:
        profiler.run()
    finally:
        freezer.close()


if __name__ == "__main__":
    main(sys.argv[1:])
