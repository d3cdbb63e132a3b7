"""Several instances sharing a rebalance round: 1, 2 and 3 instances over the same fleet.

    python benchmarks/fleet_rounds.py [--out benchmarks/results/fleet_rounds.json] [--hosts 120]
                                      [--guests 16] [--batch 10] [--repeat 3] [--instances 1,2,3]
                                      [--databases sqlite,postgresql]

Each instance is its own OS process (vmplacer.lab.shared_rounds.run_instance: the real
Rebalancer with the real plan, lease and round stores on one database) with its own copy of
the same seeded simulated fleet; all start at one moment and each runs a shared
`rebalance --all` (batches of --batch hosts, a 0.05 s profiling step per host standing in for
Freeze'nSense). Per run: wall time of the round (first start to last finish), and per
instance the hosts it did, its planning CPU seconds (time.process_time around the planner)
and its whole CPU seconds. Every run is checked: the round finished, each host done exactly
once and covered by exactly one plan. PostgreSQL needs VMPLACER_TEST_POSTGRES_URL (an admin
URL: a scratch database is made per run, as the tests do).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import select  # noqa: E402

from vmplacer.adapters.db import migrate  # noqa: E402
from vmplacer.adapters.db.engine import make_engine, make_session_factory  # noqa: E402
from vmplacer.adapters.db.models import PlanRow, RebalanceRoundHostRow, RebalanceRoundRow  # noqa: E402
from vmplacer.lab.shared_rounds import run_instance  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")
PROFILE_S = 0.05


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine()}


def check(url: str, hosts: int) -> dict:
    """The round finished and each host was done exactly once, in exactly one plan."""
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            rounds = list(session.scalars(select(RebalanceRoundRow)))
            rows = list(session.scalars(select(RebalanceRoundHostRow)))
            plans = list(session.scalars(select(PlanRow)))
    finally:
        engine.dispose()
    planned = sorted(h for p in plans for h in p.hosts)
    fleet = sorted(f"h{i:03d}" for i in range(hosts))
    ok = (len(rounds) == 1 and rounds[0].finished_at is not None and sorted(r.host for r in rows) == fleet
          and all(r.done_at is not None for r in rows) and planned == fleet)
    if not ok:
        raise SystemExit(f"round check failed: rounds {len(rounds)}, hosts done "
                         f"{sum(r.done_at is not None for r in rows)}/{hosts}, planned {len(planned)}")
    return {"plans": len(plans), "succeeded": sum(p.state == "succeeded" for p in plans),
            "empty": sum(p.state == "empty" for p in plans)}


def one_run(url: str, instances: int, hosts: int, guests: int, batch: int, scratch: Path) -> dict:
    migrate.upgrade(url)
    start_at = time.time() + 3.0 + instances  # after every interpreter has imported everything
    outs = [scratch / f"{instances}-{i}-{time.time_ns()}.json" for i in range(instances)]
    processes = [SPAWN.Process(target=run_instance, args=(url, f"instance-{i}"),
                               kwargs={"hosts": hosts, "guests": guests, "batch_hosts": batch, "lease_ttl_s": 300.0,
                                       "profile_s": PROFILE_S, "start_at": start_at, "out": str(out)})
                 for i, out in enumerate(outs)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(1800)
        if process.exitcode != 0:
            raise SystemExit(f"an instance failed (exit {process.exitcode})")
    reports = [json.loads(out.read_text()) for out in outs]
    plans = check(url, hosts)
    per_instance = [{"holder": r["holder"], "hosts": len(r["round"]["done_here"]),
                     "batches": len(r["round"]["batches"]), "plan_cpu_s": round(r["plan_cpu_s"], 3),
                     "cpu_s": round(r["cpu_s"], 3), "wall_s": round(r["wall_s"], 3), "status": r["status"]}
                    for r in reports]
    return {
        "instances": instances,
        "round_wall_s": round(max(r["wall_s"] for r in reports), 3),
        "plan_cpu_s_total": round(sum(r["plan_cpu_s"] for r in reports), 3),
        "plan_cpu_s_max_instance": round(max(r["plan_cpu_s"] for r in reports), 3),
        "per_instance": per_instance,
        "plans": plans,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fleet_rounds.json")
    parser.add_argument("--hosts", type=int, default=120)
    parser.add_argument("--guests", type=int, default=16)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--instances", default="1,2,3")
    parser.add_argument("--databases", default="sqlite,postgresql")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.instances.split(",")]
    admin = os.environ.get("VMPLACER_TEST_POSTGRES_URL")
    results: dict = {"machine": machine(), "load_average_before": [round(x, 2) for x in os.getloadavg()],
                     "fleet": {"hosts": args.hosts, "guests_per_host": args.guests, "batch_hosts": args.batch,
                               "host_shape": "2 nodes x 6 cores x 2 threads (simulated)",
                               "profile_s_per_host": PROFILE_S},
                     "databases": {}}
    with tempfile.TemporaryDirectory(prefix="fleet-rounds-") as tmp:
        scratch = Path(tmp)
        for database in args.databases.split(","):
            if database == "postgresql" and not admin:
                print("postgresql: VMPLACER_TEST_POSTGRES_URL is not set; skipped", file=sys.stderr)
                continue
            table = []
            for instances in counts:
                runs = []
                for repeat in range(args.repeat):
                    with ExitStack() as stack:
                        if database == "postgresql":
                            from vmplacer.testbed.postgres import scratch_database

                            url = stack.enter_context(scratch_database(admin, "vmplacer_bench"))
                        else:
                            url = f"sqlite:///{scratch / f'{instances}-{repeat}.db'}"
                        runs.append(one_run(url, instances, args.hosts, args.guests, args.batch, scratch))
                    print(database, instances, runs[-1]["round_wall_s"], runs[-1]["plan_cpu_s_max_instance"],
                          file=sys.stderr)
                table.append({
                    "instances": instances,
                    "median_round_wall_s": round(statistics.median(r["round_wall_s"] for r in runs), 3),
                    "median_plan_cpu_s_per_instance": round(statistics.median(
                        statistics.mean(i["plan_cpu_s"] for i in r["per_instance"]) for r in runs), 3),
                    "median_plan_cpu_s_max_instance": round(statistics.median(
                        r["plan_cpu_s_max_instance"] for r in runs), 3),
                    "median_plan_cpu_s_total": round(statistics.median(r["plan_cpu_s_total"] for r in runs), 3),
                    "runs": runs,
                })
            one = table[0]["median_plan_cpu_s_per_instance"] if table and table[0]["instances"] == 1 else None
            for row in table:
                if one:
                    row["plan_cpu_per_instance_vs_one"] = round(row["median_plan_cpu_s_per_instance"] / one, 3)
            results["databases"][database] = table
    results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({db: [{k: v for k, v in row.items() if k != "runs"} for row in table]
                      for db, table in results["databases"].items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
