"""Benchmark of the freeze guardian -> benchmarks/results/guardian.json.

What the guardian adds to a freezing process:
1. start: spawn -> ready (interpreter + `import libvirt`), once per process,
   before its first freeze; target: well under 100 ms of work on an idle machine
   (CPU time of the child, which load does not inflate the way wall time is);
2. host registration (its own libvirt connection), once per host;
3. per freeze: one `arm` and one `disarm` pipe write (no round trip).
How fast it resumes guests after a kill is measured on real guests by
tests/integration/test_freeze_guardian.py (see docs/profiler.md).

Run: .venv/bin/python benchmarks/guardian.py [--uri URI]   (default test:///default)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vmplacer.adapters.freeze_guardian import FreezeGuardian  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "guardian.json"


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", default="test:///default")
    parser.add_argument("--starts", type=int, default=15)
    parser.add_argument("--arms", type=int, default=2000)
    args = parser.parse_args()

    spawn_wall, spawn_cpu, register = [], [], []
    for _ in range(args.starts):
        guardian = FreezeGuardian(None)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        guardian.identity()  # spawns and waits for "ready"
        spawned = time.perf_counter()
        guardian.watch("h", args.uri)
        registered = time.perf_counter()
        guardian.close()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spawn_wall.append(spawned - started)
        register.append(registered - spawned)
        # CPU of the whole child life (start, connect, exit): an upper bound of its start-up work.
        spawn_cpu.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))

    guardian = FreezeGuardian(None)
    guardian.watch("h", args.uri)
    arm, disarm = [], []
    for entry in range(args.arms):
        t0 = time.perf_counter()
        guardian.arm(entry, "h", [("a", ""), ("b", ""), ("c", "")], 60.0)
        t1 = time.perf_counter()
        guardian.disarm(entry)
        arm.append(t1 - t0)
        disarm.append(time.perf_counter() - t1)
    guardian.close()

    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)},
        "uri": args.uri,
        "start_wall_ms_median": _median_ms(spawn_wall),
        "start_wall_ms_max": round(max(spawn_wall) * 1e3, 3),
        "child_cpu_ms_median": _median_ms(spawn_cpu),
        "register_host_ms_median": _median_ms(register),
        "arm_us_median": round(statistics.median(arm) * 1e6, 2),
        "disarm_us_median": round(statistics.median(disarm) * 1e6, 2),
        "arm_us_p99": round(sorted(arm)[int(0.99 * len(arm))] * 1e6, 2),
        "targets": {"child_cpu_under_100ms": statistics.median(spawn_cpu) < 0.1},
    }
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
