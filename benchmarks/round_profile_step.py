"""A round's profile step with hosts one after another and at once.

    python benchmarks/round_profile_step.py [--out benchmarks/results/round_profile_step.json]
                                            [--hosts 20,40] [--guests 16] [--profile-s 0.5]
                                            [--parallel 1,16] [--repeat 3]

The lab's shared-round instance (vmplacer.lab.shared_rounds.run_instance: the real
Rebalancer, plan, lease and round stores on SQLite) over a simulated fleet whose profiling
step sleeps `--profile-s` per host (Freeze'nSense profiles for seconds, waiting on the host),
all hosts in one batch. Per run: the round's wall seconds, the profile steps' span (first
start to last end, from the report's `offset_s` and `seconds`) and their sum. With
`parallel_hosts` 1 the span is the sum; at once it follows the slowest host.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vmplacer.adapters.db import migrate  # noqa: E402
from vmplacer.lab.shared_rounds import run_instance  # noqa: E402


def one_run(url: str, hosts: int, guests: int, profile_s: float, parallel: int) -> dict:
    migrate.upgrade(url)
    report = run_instance(url, "bench", hosts=hosts, guests=guests, batch_hosts=hosts, lease_ttl_s=300.0,
                          profile_s=profile_s, parallel_hosts=parallel)
    steps = [s for s in report["steps"] if s["name"].startswith("profile ")]
    if len(steps) != hosts or any(s["status"] != "ok" for s in steps):
        raise SystemExit(f"profile steps: {len(steps)} of {hosts} hosts, statuses {[s['status'] for s in steps]}")
    starts = [s["offset_s"] for s in steps]
    ends = [s["offset_s"] + s["seconds"] for s in steps]
    return {"round_wall_s": round(report["wall_s"], 3), "profile_span_s": round(max(ends) - min(starts), 3),
            "profile_sum_s": round(sum(s["seconds"] for s in steps), 3), "status": report["status"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/round_profile_step.json"))
    parser.add_argument("--hosts", default="20,40")
    parser.add_argument("--guests", type=int, default=16)
    parser.add_argument("--profile-s", type=float, default=0.5)
    parser.add_argument("--parallel", default="1,16")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()
    cases = []
    with tempfile.TemporaryDirectory() as scratch:
        for hosts in [int(h) for h in args.hosts.split(",")]:
            for parallel in [int(p) for p in args.parallel.split(",")]:
                runs = []
                for repeat in range(args.repeat):
                    url = f"sqlite:///{Path(scratch) / f'{hosts}-{parallel}-{repeat}.db'}"
                    runs.append(one_run(url, hosts, args.guests, args.profile_s, parallel))
                case = {"hosts": hosts, "parallel_hosts": parallel, "runs": runs,
                        "median_round_wall_s": statistics.median(r["round_wall_s"] for r in runs),
                        "median_profile_span_s": statistics.median(r["profile_span_s"] for r in runs)}
                cases.append(case)
                print(json.dumps({k: v for k, v in case.items() if k != "runs"}), flush=True)
    result = {
        "benchmark": "round_profile_step",
        "what": __doc__.splitlines()[0],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
        "settings": {"hosts": args.hosts, "guests": args.guests, "profile_s_per_host": args.profile_s,
                     "parallel_hosts": args.parallel, "repeat": args.repeat},
        "cases": cases,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
