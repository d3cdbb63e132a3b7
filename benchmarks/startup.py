"""Start-up benchmark: wall time of the commands an operator types most, from exec to exit.

    python benchmarks/startup.py [--out benchmarks/results/startup.json] [--runs 5]

Each command runs `--runs` times in a fresh interpreter (after one untimed run
that writes the bytecode caches) and the median is reported, beside bare
Python (`python -c pass`) on the same machine at the same time. The commands
need no host and no database: `--help`, `version`, `topology --caps FILE` and
`plan --caps FILE --request FILE` (the bundled example host and request).

Target (this 2-core machine): every median <= 0.3 s. The machine is shared, so
its load average is recorded before and after, and each command's CPU time
(user + system of the child) beside its wall time: under load the wall time
grows, the CPU time hardly.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import host_facts  # noqa: E402

TARGET_S = 0.3
HOST = "examples/hosts/xeon-2s-56c-smt2.xml"
COMMANDS = {
    "--help": ["--help"],
    "version": ["version"],
    "topology --caps": ["topology", "--caps", HOST],
    "plan --caps": ["plan", "--caps", HOST, "--request", "examples/requests/mixed.yaml", "--format", "json"],
}


def machine() -> dict[str, object]:
    return {"cpu": host_facts.cpu_model(platform.machine()), "cpus": os.cpu_count(),
            "python": platform.python_version()}


load_average = host_facts.load_average


def _env() -> dict[str, str]:
    """No VMPLACER_* settings, this tree first on the path, and bytecode caches written (an
    installed wheel has them; with PYTHONDONTWRITEBYTECODE every run would compile every module)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VMPLACER_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_runs(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds) from spawn to exit of `argv`, `runs` times after one
    untimed run. CPU time barely moves with the machine's load; wall time is what users wait."""
    env = _env()
    walls, cpus = [], []
    for attempt in range(runs + 1):
        cpu_before = _children_cpu_s()
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-500:]}")
        if attempt:
            walls.append(elapsed)
            cpus.append(_children_cpu_s() - cpu_before)
    return walls, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "startup.json"))
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    load_before = load_average()
    bare, bare_cpu = timed_runs([sys.executable, "-c", "pass"], args.runs)
    results = []
    for name, argv in COMMANDS.items():
        times, cpu = timed_runs([sys.executable, "-m", "vmplacer.cli.main", *argv], args.runs)
        median = statistics.median(times)
        results.append({"command": f"vmplacer {name}", "argv": argv, "median_s": round(median, 4),
                        "min_s": round(min(times), 4), "max_s": round(max(times), 4),
                        "cpu_median_s": round(statistics.median(cpu), 4), "target_met": median <= TARGET_S})
        print(f"vmplacer {name:<16} median {median * 1000:6.1f} ms  (min {min(times) * 1000:.1f}, "
              f"max {max(times) * 1000:.1f}; CPU {statistics.median(cpu) * 1000:.1f} ms)")
    print(f"bare python             median {statistics.median(bare) * 1000:6.1f} ms "
          f"(CPU {statistics.median(bare_cpu) * 1000:.1f} ms)")
    result = {
        "machine": {**machine(), "load_average": {"before": load_before, "after": load_average()}},
        "target": {"median_s": TARGET_S},
        "notes": f"median of {args.runs} runs per command in a fresh interpreter, after one untimed run; "
                 "`python -m vmplacer.cli.main` with this tree on PYTHONPATH and no VMPLACER_* variables. "
                 "Load averages are the machine's (other work shares it).",
        "bare_python_median_s": round(statistics.median(bare), 4),
        "bare_python_cpu_median_s": round(statistics.median(bare_cpu), 4),
        "commands": results,
        "all_targets_met": all(r["target_met"] for r in results),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
