"""A freezing process for `test_freeze_guardian.py` to kill: the real profiler, wired as
`vmplacer profile` wires it (guardian included), profiling until it is killed.

    python tests/integration/freeze_guardian_child.py CONFIG NAME,NAME,... T_M_S MAX_FREEZE_S

Prints one JSON line per event: {"event": "ready", "guardian": PID}, then
{"event": "phase", "phase": ...} for every freezer phase. No replay at start:
whatever a killed predecessor left must be resumed by its guardian or by a
replayer the test runs, never by this process. No test in here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str]) -> None:
    config_path, names_arg, t_m, max_freeze = argv[0], argv[1], float(argv[2]), float(argv[3])
    names = tuple(names_arg.split(","))

    from vmplacer.app.observe.profiler import ProfilerConfig, SensitiveSelector
    from vmplacer.bootstrap import Container
    from vmplacer.bootstrap.profiler import build_profiler
    from vmplacer.config import load_settings

    def on_phase(phase: str) -> None:
        print(json.dumps({"event": "phase", "phase": phase}), flush=True)

    container = Container(load_settings(config_path))
    config = ProfilerConfig(t_m_s=t_m, t_sleep_s=0.05, max_freeze_s=max_freeze,
                            duration_s=120.0, scope=names, sensitive=SensitiveSelector(frozenset(names[:2])))
    profiler, freezer = build_profiler(container, "host1", config, store=False, on_phase=on_phase)
    assert freezer.guard is not None
    print(json.dumps({"event": "ready", "guardian": freezer.guard.pid}), flush=True)  # type: ignore[attr-defined]
    try:
        profiler.run()
    finally:
        freezer.close()


if __name__ == "__main__":
    main(sys.argv[1:])
