"""`vmplacer plan --all-hosts --request` through the command, over configured fleets.

    python benchmarks/fleet_plan_command.py [--out benchmarks/results/fleet_plan_command.json]
                                            [--sizes 1000,10000] [--repeat 2] [--guests 100]
                                            [--old-code DIR]

What an operator runs for a fleet-wide dry run: the command reads the config, reads every
configured host (libvirt's test driver, each host's topology from one of the shipped example
capabilities files in rotation), reads the placement records, plans the request's guests
and renders their XML. The request is examples/requests/mixed.yaml's guests copied up to
`--guests` (each copy's affinity and anti-affinity renamed within it). Each run is a fresh
process on a fresh SQLite database: wall seconds, the child's CPU seconds (user + system,
from getrusage) and its peak RSS. With --old-code DIR, the same runs with another
checkout's code (PYTHONPATH=DIR) in the same session, so both share the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ["xeon-2s-56c-smt2.xml", "numa16-256c.xml", "opteron6378-4node.xml", "xeon-e3-4c8t.xml"]


def request_of(guests: int) -> dict:
    """mixed.yaml's guests copied up to `guests`, each copy's peer names renamed within it."""
    base = yaml.safe_load((ROOT / "examples/requests/mixed.yaml").read_text())["guests"]
    result = []
    copy = 0
    while len(result) < guests:
        suffix = f"-{copy}"
        for guest in base:
            if len(result) == guests:
                break
            item = dict(guest, name=guest["name"] + suffix)
            for key in ("affinity", "anti_affinity"):
                if key in item:
                    item[key] = [peer + suffix for peer in item[key]]
            result.append(item)
        copy += 1
    names = {g["name"] for g in result}
    for item in result:  # a peer cut off by the count is dropped, not left dangling
        for key in ("affinity", "anti_affinity"):
            if key in item:
                item[key] = [p for p in item[key] if p in names]
    return {"guests": result}


def config_of(directory: Path, hosts: int) -> Path:
    for shape in SHAPES:
        shutil.copy(ROOT / "examples/hosts" / shape, directory / shape)
    lines = [f"database_url: sqlite:///{directory / 'vmplacer.db'}", f"data_dir: {directory}", "hosts:"]
    for index in range(hosts):
        shape = SHAPES[index % len(SHAPES)]
        lines.append(f"  - {{name: h{index:05d}, uri: 'test:///default', capabilities: {shape}, domain_type: kvm}}")
    path = directory / "vmplacer.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


# the command in a child that reports its own peak RSS last on stderr (getrusage of the
# children is the largest of every child so far, not this one's)
CHILD = ("import resource, sys\n"
         "from vmplacer.cli.main import main\n"
         "try:\n"
         "    code = main(sys.argv[1:])\n"
         "finally:\n"
         "    sys.stderr.write(f'\\nPEAK_RSS_KIB={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')\n"
         "sys.exit(code)\n")


def _peak_rss_mib(stderr: str) -> float | None:
    for line in reversed(stderr.splitlines()):
        if line.startswith("PEAK_RSS_KIB="):
            return round(int(line.split("=", 1)[1]) / 1024, 1)
    return None


def run_once(config: Path, request: Path, code: Path | None) -> dict:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if code is not None:
        env["PYTHONPATH"] = str(code)
    database = config.parent / "vmplacer.db"
    database.unlink(missing_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    argv = ["--config", str(config), "plan", "--all-hosts", "--request", str(request), "--format", "json"]
    done = subprocess.run([sys.executable, "-c", CHILD, *argv],
                          capture_output=True, text=True, env=env, timeout=1800, cwd=config.parent)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = {"wall_s": round(wall, 2), "cpu_s": round((after.ru_utime - before.ru_utime)
                                                      + (after.ru_stime - before.ru_stime), 2),
              "peak_rss_mib": _peak_rss_mib(done.stderr), "exit": done.returncode}
    if done.returncode in (0, 3):
        plan = json.loads(done.stdout)
        result["placed"] = sum(1 for p in plan.get("placements", []) if p.get("host"))
        result["refused_hosts"] = len(plan.get("refused_hosts", []))
    else:
        result["stderr"] = done.stderr[-500:]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/fleet_plan_command.json"))
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--guests", type=int, default=100)
    parser.add_argument("--old-code", default=None, help="another checkout's root, run the same way")
    args = parser.parse_args()
    cases = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        request = Path(scratch) / "request.yaml"
        request.write_text(yaml.safe_dump(request_of(args.guests), sort_keys=False))
        for size in [int(s) for s in args.sizes.split(",")]:
            directory = Path(scratch) / f"fleet{size}"
            directory.mkdir()
            config = config_of(directory, size)
            for label, code in [("new", ROOT)] + ([("old", Path(args.old_code))] if args.old_code else []):
                runs = [run_once(config, request, code) for _ in range(args.repeat)]
                ok = [r for r in runs if r["exit"] in (0, 3)]
                case = {"hosts": size, "code": label, "runs": runs}
                if ok:
                    case["median_wall_s"] = statistics.median(r["wall_s"] for r in ok)
                    case["median_cpu_s"] = statistics.median(r["cpu_s"] for r in ok)
                    case["max_peak_rss_mib"] = max(r["peak_rss_mib"] for r in ok)
                cases.append(case)
                print(json.dumps(case), flush=True)
    result = {
        "benchmark": "fleet_plan_command",
        "what": __doc__.splitlines()[0],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "processor": platform.processor() or platform.machine()},
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()],
                         "note": "1, 5 and 15 min load averages; the machine is shared with other work"},
        "settings": {"sizes": args.sizes, "repeat": args.repeat, "guests": args.guests, "shapes": SHAPES,
                     "old_code": args.old_code},
        "target": {"hosts": 10000, "max_wall_s": 10.0},
        "cases": cases,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
