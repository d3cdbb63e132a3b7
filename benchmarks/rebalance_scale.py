"""Rebalance planning at fleet scale, stage by stage.

    python benchmarks/rebalance_scale.py [--out benchmarks/results/rebalance_scale.json]
                                         [--sizes 100,300,1000] [--guests 40] [--baseline CHECKOUT]

The fleet is the one `benchmarks/rebalance.py` plans at scale: uniform two-node hosts of 24
cores × 2 threads, each with `--guests` one-vCPU batch guests pinned to random pCPUs (seeded),
their workloads drawn from the trained model's keys; CP-SAT on small hosts as the product
runs it. Each size is planned once in a fresh process (its peak RSS is its own) with the
product's defaults; the planner's own stage timer (core/stage_times.py, the numbers
`vmplacer rebalance` logs) says where the time goes: setup (what-if state), climb (local
moves and migrations), exact, pessimistic, declined_layouts,
optimistic_groups, optimistic_layouts, actions (building the plan).
With `--baseline` (another checkout of vmplacer, e.g. the previous commit in a git worktree),
each size is planned by that checkout first, then by this one, in the same run (same load), and
its numbers are kept under "baseline".
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rebalance_benchmark():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("rebalance_benchmark", ROOT / "benchmarks" / "rebalance.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(hosts: int, guests: int) -> dict:
    from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
    from vmplacer.core.rebalance.policy import RebalanceSettings, plan_rebalance
    from vmplacer.core.stage_times import StageTimes

    bench = _rebalance_benchmark()
    model = bench.trained_model()
    state = bench.scale_fleet(model, hosts, guests, digits=4)
    times = StageTimes(time.perf_counter)
    cpu, wall = time.process_time(), time.perf_counter()
    plan = plan_rebalance(state, model, RebalanceSettings(), now=0.0, solver=CpSatLayoutSolver(), times=times)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    kinds: dict[str, int] = {}
    for action in plan.actions:
        kinds[action.kind] = kinds.get(action.kind, 0) + 1
    return {
        "hosts": hosts, "guests": hosts * guests,
        "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
        "stages_s": times.rounded(3),
        "per_host_ms": round(wall / hosts * 1e3, 2),
        "actions": kinds,
        "objective_before": round(plan.objective_before, 3), "objective_after": round(plan.objective_after, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rebalance_scale.json"))
    parser.add_argument("--sizes", default="100,300,1000")
    parser.add_argument("--guests", type=int, default=40)
    parser.add_argument("--baseline", help="another checkout of vmplacer, measured first at each size")
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.guests)))
        return
    baseline = Path(args.baseline).resolve() if args.baseline else None
    runs, baseline_runs = [], []
    for size in (int(s) for s in args.sizes.split(",")):
        if baseline is not None:
            baseline_runs.append(_measured(baseline / "benchmarks" / "rebalance_scale.py", size, args.guests))
            print("baseline", json.dumps(baseline_runs[-1]), flush=True)
        runs.append(_measured(Path(__file__), size, args.guests))
        print(json.dumps(runs[-1]), flush=True)
    machine = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "uname": " ".join(os.uname()),
               "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default (one per CPU)")}
    result: dict = {"machine": machine, "runs": runs}
    if baseline is not None:
        commit = subprocess.run(["git", "-C", str(baseline), "rev-parse", "HEAD"], capture_output=True, text=True)
        result["baseline"] = {"commit": commit.stdout.strip() or None, "runs": baseline_runs}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


def _measured(script: Path, size: int, guests: int) -> dict:
    """One size planned by `script` (this file or a baseline checkout's) in a fresh process."""
    done = subprocess.run([sys.executable, str(script), "--measure", str(size), "--guests", str(guests)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
