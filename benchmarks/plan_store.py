"""Benchmark of the plan store's reads on a month of stored plans -> benchmarks/results/plan_store.json.

    python benchmarks/plan_store.py [--hosts 100] [--days 30] [--runs-per-day 96] [--postgres URL]
                                    [--out benchmarks/results/plan_store.json]

Every rebalance run reads the trials of the last day (`trial_outcomes`: the trials' memory) and
when each guest last moved (`last_moved`: the cool-down); every `/metrics` scrape counts the
last day's trials (`trial_counts`) and all actions by state (`action_counts`). The plans table
grows with every run until `vmplacer db prune` drops plans older than the retention (30 days by
default), so these reads must not cost in proportion to a month of plans.

The database is filled with a month of a fleet's plans: `--hosts` hosts rebalanced `--runs-per-day`
times a day (a 15-minute timer by default); in each run a tenth of the hosts repin two guests and
measure them (a confirm trial), a twentieth also try a layout (an explore trial), the rest are
only profiled. Each read is timed (median of `--repeat`) at the head schema and, for comparison,
at `--compare` (the schema before the plan-action index), on SQLite and, with `--postgres` (an
admin URL; by default VMPLACER_TEST_POSTGRES_URL, as `make test` sets it), on PostgreSQL. Numbers are measured, never asserted here: the JSON says what held.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import host_facts  # noqa: E402
from sqlalchemy import insert, text  # noqa: E402

from vmplacer.adapters.db.engine import make_engine, make_session_factory  # noqa: E402
from vmplacer.adapters.db.migrate import downgrade, head_revision, upgrade  # noqa: E402
from vmplacer.adapters.db.models import PlanActionRow, PlanRow  # noqa: E402
from vmplacer.adapters.db.plans import SqlPlanStore  # noqa: E402
from vmplacer.testbed.postgres import scratch_database  # noqa: E402

COMPARE_REVISION = "0011"  # the schema before ix_plan_actions_state_kind_finished_at
TARGET_S = 0.05  # a read per run or per scrape, well under a scrape interval on a month of plans
GUESTS_PER_HOST = 8
POSTGRES_ENV = "VMPLACER_TEST_POSTGRES_URL"  # what `make test` sets: an admin URL of the test server
COOLDOWN_S = 600.0  # RebalanceSettings.cooldown_s: the window of moves a run reads
# not a read the product makes: how last_moved read before it took the cool-down's window
COMPARISON = "last_moved without the window (every move of the guests, as before)"


def fill(url: str, hosts: int, days: int, runs_per_day: int, seed: int = 0) -> dict[str, int]:
    """A month of plans, oldest first, ending now; returns the row counts."""
    rng = random.Random(seed)
    engine = make_engine(url)
    now = datetime.now(timezone.utc)
    runs = days * runs_per_day
    step = timedelta(days=1) / runs_per_day
    plans = actions = 0
    plan_id = 0
    with engine.begin() as connection:
        for run in range(runs):
            at = now - (runs - run) * step
            plan_id += 1
            rows = []
            for h in range(hosts):
                roll = rng.random()
                if roll >= 0.1:
                    continue
                host = f"host{h:03d}"
                guests = rng.sample(range(GUESTS_PER_HOST), 4)
                kinds = [("repin", guests[0]), ("repin", guests[1]), ("probe", None)]
                trial_kinds = ["confirm"]
                if roll < 0.05:
                    kinds += [("repin", guests[2]), ("repin", guests[3]), ("probe", None)]
                    trial_kinds.append("explore")
                for kind, guest in kinds:
                    state = "succeeded" if rng.random() < 0.7 else "rolled_back"
                    parameters: dict = {}
                    if kind == "probe":
                        parameters = {"seconds": 3.0, "trial": {
                            "kind": trial_kinds.pop(0), "from_key": f"{rng.getrandbits(64):016x}",
                            "to_key": f"{rng.getrandbits(64):016x}", "min_gain": 0.005, "tolerance": 0.0,
                            "weights": {f"{host}-vm{g}": 1.0 for g in range(GUESTS_PER_HOST)}}}
                    rows.append({"plan_id": plan_id, "seq": len(rows), "kind": kind, "host": host,
                                 "guest": None if guest is None else f"{host}-vm{guest}",
                                 "before": None, "after": None, "reason": "benchmark", "predicted_gain": 0.0,
                                 "cost": {}, "confidence": 1.0, "depends_on": [], "parameters": parameters,
                                 "state": state, "message": "", "started_at": at, "finished_at": at})
            connection.execute(insert(PlanRow), [{
                "id": plan_id, "state": "succeeded" if rows else "empty", "hosts": [], "objective_before": 0.0,
                "objective_after": 0.0, "predicted": {}, "settings": {}, "summary": "", "message": "",
                "created_by": "benchmark", "created_at": at, "updated_at": at}])
            if rows:
                connection.execute(insert(PlanActionRow), rows)
            plans += 1
            actions += len(rows)
    engine.dispose()
    return {"plans": plans, "plan_actions": actions}


def time_reads(url: str, hosts: int, repeat: int) -> dict[str, dict[str, float]]:
    """Median and worst seconds of each read over `repeat` calls (after one untimed call)."""
    engine = make_engine(url)
    if engine.dialect.name == "postgresql":
        with engine.begin() as connection:
            connection.execute(text("ANALYZE"))
    store = SqlPlanStore(make_session_factory(engine))
    since = time.time() - 86400.0
    guests = [f"host{h:03d}-vm{g}" for h in range(hosts) for g in range(GUESTS_PER_HOST)]
    reads = {
        "trial_counts (each /metrics scrape)": lambda: store.trial_counts(since),
        "trial_outcomes (each rebalance run)": lambda: store.trial_outcomes(since),
        "last_moved (each rebalance run)": lambda: store.last_moved(guests, since=time.time() - COOLDOWN_S),
        COMPARISON: lambda: store.last_moved(guests),
        "action_counts (each /metrics scrape)": store.action_counts,
    }
    result = {}
    for name, read in reads.items():
        read()
        seconds = []
        for _ in range(repeat):
            start = time.perf_counter()
            read()
            seconds.append(time.perf_counter() - start)
        result[name] = {"median_s": round(statistics.median(seconds), 5), "max_s": round(max(seconds), 5)}
    engine.dispose()
    return result


def measure(url: str, args: argparse.Namespace) -> dict:
    upgrade(url)
    counts = fill(url, args.hosts, args.days, args.runs_per_day)
    head = head_revision()
    schemas = {head: time_reads(url, args.hosts, args.repeat)}
    if args.compare and args.compare != head:
        downgrade(url, args.compare)
        schemas[args.compare] = time_reads(url, args.hosts, args.repeat)
        upgrade(url)
    return {"rows": counts, "schemas": schemas,
            "within_target_at_head": all(r["median_s"] <= TARGET_S for name, r in schemas[head].items()
                                         if name != COMPARISON)}


def _on_own_postgres_database(admin_url: str, args: argparse.Namespace) -> dict:
    """`measure` on a database created for the run on the server of `admin_url`, dropped after."""
    with scratch_database(admin_url, "vmplacer_bench") as url:
        return measure(url, args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--runs-per-day", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--compare", default=COMPARE_REVISION, help="also time the reads at this schema revision")
    parser.add_argument("--postgres", metavar="URL", default=os.environ.get(POSTGRES_ENV),
                        help="also measure on this PostgreSQL server (a database of its own is created and dropped; "
                             f"default: ${POSTGRES_ENV} when set)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "plan_store.json")
    args = parser.parse_args()
    load_start = host_facts.load_average()
    databases = {}
    with tempfile.TemporaryDirectory() as tmp:
        databases["sqlite"] = measure(f"sqlite:///{tmp}/plans.db", args)
    if args.postgres:
        databases["postgresql"] = _on_own_postgres_database(args.postgres, args)
    result = {
        "machine": {"cpu": host_facts.cpu_model(platform.machine()), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "fleet": {"hosts": args.hosts, "days": args.days, "runs_per_day": args.runs_per_day},
        "target_s": TARGET_S,
        "databases": databases,
        "load_average": {"start": load_start, "end": host_facts.load_average()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
