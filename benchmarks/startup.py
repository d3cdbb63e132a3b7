"""Start-up benchmark: wall time of the commands an operator types most, from exec to exit.

    python benchmarks/startup.py [--out benchmarks/results/startup.json] [--runs 5]

Each command runs `--runs` times in a fresh interpreter (after one untimed run
that writes the bytecode caches) and the median is reported, beside bare
Python (`python -c pass`) on the same machine at the same time. The commands
need no host and no database: `--help`, `version`, `topology --caps FILE` and
`plan --caps FILE --request FILE` (the bundled example host and request).

Target (this 2-core machine): every median <= 0.3 s. The machine is shared, so
its load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.3
HOST = "examples/hosts/xeon-2s-56c-smt2.xml"
COMMANDS = {
    "--help": ["--help"],
    "version": ["version"],
    "topology --caps": ["topology", "--caps", HOST],
    "plan --caps": ["plan", "--caps", HOST, "--request", "examples/requests/mixed.yaml", "--format", "json"],
}


def machine() -> dict[str, object]:
    model = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cpus": os.cpu_count(), "python": platform.python_version()}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VMPLACER_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def wall_times(argv: list[str], runs: int) -> list[float]:
    """Seconds from spawn to exit of `argv`, `runs` times after one untimed run."""
    env = _env()
    times = []
    for attempt in range(runs + 1):
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-500:]}")
        if attempt:
            times.append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "startup.json"))
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    load_before = load_average()
    bare = wall_times([sys.executable, "-c", "pass"], args.runs)
    results = []
    for name, argv in COMMANDS.items():
        times = wall_times([sys.executable, "-m", "vmplacer.cli.main", *argv], args.runs)
        median = statistics.median(times)
        results.append({"command": f"vmplacer {name}", "argv": argv, "median_s": round(median, 4),
                        "min_s": round(min(times), 4), "max_s": round(max(times), 4),
                        "target_met": median <= TARGET_S})
        print(f"vmplacer {name:<16} median {median * 1000:6.1f} ms  (min {min(times) * 1000:.1f}, "
              f"max {max(times) * 1000:.1f})")
    print(f"bare python             median {statistics.median(bare) * 1000:6.1f} ms")
    result = {
        "machine": {**machine(), "load_average": {"before": load_before, "after": load_average()}},
        "target": {"median_s": TARGET_S},
        "notes": f"median of {args.runs} runs per command in a fresh interpreter, after one untimed run; "
                 "`python -m vmplacer.cli.main` with this tree on PYTHONPATH and no VMPLACER_* variables. "
                 "Load averages are the machine's (other work shares it).",
        "bare_python_median_s": round(statistics.median(bare), 4),
        "commands": results,
        "all_targets_met": all(r["target_met"] for r in results),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
