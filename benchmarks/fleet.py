"""Fleet-scale host choice: `plan` of 100 mixed guests over 10 to 10,000 hosts.

    python benchmarks/fleet.py [--out benchmarks/results/fleet.json] [--sizes 10,100,1000,10000]
                               [--repeat 3] [--exhaustive-up-to 1000] [--old-code DIR --old-up-to 100]
                               [--api-hosts 1000 --api-requests 300]

The fleets are generated (seeded): five host shapes — one socket with SMT, two sockets with
SMT, two sockets without SMT on four NUMA nodes, an 8-node two-socket host (NPS4-like), a
small one-socket host — in rotation, and 40 % of the hosts partly full with 1 to 5 seeded
guests placed by the allocator (so they are all different). Hosts of one shape share their
topology object (as the same capabilities would parse). The request is 100 guests cycling
through the kinds of examples/requests/mixed.yaml: dedicated isolate with anti-affinity,
OpenStack extra specs, sibling pairs with affinity, mixed, shared batch, a 32-vCPU two-cell
guest.

Each measurement runs in a fresh process (its peak RSS is its own): the batch planner as
`vmplacer plan` runs it (`FleetPlanner().plan`), timed in CPU seconds and wall seconds,
building the fleet excluded. Modes: `bounded` (the product: filter on free room, allocate on
`hosts_to_score` per guest), `exhaustive` (the same code allocating on every host: the
reference for quality) and, with --old-code, the planner of another checkout (the code before
the fleet index). Quality: guests placed and total score of the bounded plan against the
exhaustive one of the same fleet.

The API case starts a real `vmplacer serve` (benchmarks/api_server.py, SQLite) with
`--api-hosts` configured hosts on libvirt's test driver, their capabilities the shipped
example hosts in rotation, and sends dry-run placements with no host named (host choice
among all of them), one at a time and 32 at a time, after a warm-up; p50/p99 and the
server's CPU per request as benchmarks/api.py measures them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUESTS = 100
PLAN_1000_TARGET_S = 1.0
PLAN_10000_TARGET_S = 10.0
MEMORY_TARGET_MIB = 2048
QUALITY_TARGET = 0.99
KINDS = [
    {"vcpus": 4, "memory_mib": 8192, "cpu_policy": "dedicated", "thread_policy": "isolate",
     "workload_class": "latency-critical", "anti_affinity_next": True},
    {"vcpus": 4, "memory_mib": 8192, "cpu_policy": "dedicated", "thread_policy": "isolate",
     "workload_class": "latency-critical"},
    {"vcpus": 2, "memory_mib": 2048, "extra_specs": {"hw:cpu_policy": "dedicated", "hw:numa_nodes": "1"},
     "affinity_next": True},
    {"vcpus": 2, "memory_mib": 4096, "cpu_policy": "dedicated", "thread_policy": "prefer"},
    {"vcpus": 4, "memory_mib": 4096, "cpu_policy": "mixed", "dedicated_vcpus": "1-3"},
    {"vcpus": 8, "memory_mib": 16384, "workload_class": "batch"},
    {"vcpus": 4, "memory_mib": 8192, "workload_class": "batch", "mem_mode": "preferred"},
    {"vcpus": 32, "memory_mib": 65536, "cpu_policy": "dedicated", "numa_nodes": 2},
]


def shapes():  # type: ignore[no-untyped-def]
    """(name, topology) of the five host shapes."""
    from vmplacer.core.topology.host import HugepagePool, uniform_topology

    def shape(name, nodes, cores, threads, memory_gib, sockets, huge=None):  # type: ignore[no-untyped-def]
        topology = uniform_topology(nodes=nodes, cores_per_node=cores, threads_per_core=threads,
                                    memory_mib_per_node=memory_gib * 1024, name=name)
        per_socket = max(1, nodes // sockets)
        cpus = {i: replace(c, package=c.node // per_socket, die=c.node // per_socket) for i, c in topology.cpus.items()}
        node_map = topology.nodes
        if huge:
            node_map = {n: replace(node, hugepages=(HugepagePool(huge[0], huge[1], huge[1]),))
                        for n, node in node_map.items()}
        return name, replace(topology, cpus=cpus, nodes=node_map)

    return [
        shape("1s-16c-smt2", 1, 16, 2, 128, 1, (2048, 8192)),
        shape("2s-28c-smt2", 2, 28, 2, 192, 2, (1048576, 16)),
        shape("2s-32c-4n", 4, 16, 1, 64, 2),
        shape("2s-64c-smt2-8n", 8, 16, 2, 64, 2, (2048, 4096)),
        shape("1s-8c-smt2", 1, 8, 2, 64, 1),
    ]


def request():  # type: ignore[no-untyped-def]
    """The 100 guests, as specs."""
    from vmplacer.core.placement.guest import GuestSpec

    specs = []
    for index in range(GUESTS):
        kind = dict(KINDS[index % len(KINDS)])
        fields = {k: v for k, v in kind.items() if not k.endswith("_next")}
        if kind.get("anti_affinity_next"):
            fields["anti_affinity"] = [f"g{index + 1}"]
        if kind.get("affinity_next"):
            fields["affinity"] = [f"g{index + 1}"]
        specs.append(GuestSpec.from_mapping({"name": f"g{index}", **fields}))
    return specs


def fleet(size: int, seed: int = 7):  # type: ignore[no-untyped-def]
    """`size` FleetHosts: shapes in rotation, 40 % partly full (seeded)."""
    from vmplacer.app.place.fleet_planner import FleetHost
    from vmplacer.core.placement.allocate import NoFit, allocate
    from vmplacer.core.placement.guest import GuestSpec

    rng = random.Random(seed)
    kinds = shapes()
    hosts = []
    for at in range(size):
        shape_name, base = kinds[at % len(kinds)]
        name = f"h{at:05d}"
        topology = replace(base, name=name)
        existing = []
        if rng.random() < 0.4:
            for k in range(rng.randint(1, 5)):
                spec = GuestSpec.from_mapping({
                    "name": f"{name}-e{k}", "vcpus": rng.choice([1, 2, 4, 8]),
                    "memory_mib": rng.choice([1024, 4096, 16384]),
                    "cpu_policy": rng.choice(["shared", "dedicated", "dedicated"])})
                try:
                    existing.append(allocate(topology, spec, existing))
                except NoFit:
                    break
        hosts.append(FleetHost(name, topology, existing, frozenset(p.guest for p in existing)))
    return hosts


def measure(size: int, mode: str) -> dict:
    """One plan in this process: times, peak RSS, guests placed, total score."""
    from vmplacer.app.place.fleet_planner import FleetPlanner

    hosts = fleet(size)
    specs = request()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        planner = FleetPlanner(hosts_to_score=0) if mode == "exhaustive" else FleetPlanner()
    except TypeError:  # code from before the fleet index: it allocates on every host
        planner = FleetPlanner()
    cpu, wall = time.process_time(), time.perf_counter()
    plan = planner.plan(specs, hosts)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    placed = [g for g in plan.guests if g.placement is not None]
    return {"hosts": size, "mode": mode, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "rss_growth_mib": round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024, 1),
            "placed": len(placed), "total_score": round(sum(g.placement.score for g in placed), 6),
            "hosts_used": len({g.host for g in placed}), "passes": plan.passes}


def run_measure(size: int, mode: str, code: Path | None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code or ROOT))
    args = [sys.executable, str(Path(__file__).resolve()), "--measure", str(size), "--mode", mode]
    if code is not None:
        args += ["--code", str(code)]
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def api_case(hosts: int, requests: int) -> dict:
    """Dry runs with host choice among `hosts` configured hosts through a real `vmplacer serve`."""
    import tempfile

    import yaml

    from benchmarks import api as api_bench

    caps = sorted(str(p) for p in (ROOT / "examples" / "hosts").glob("*.xml"))
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        server = api_bench.Serve(directory, f"sqlite:///{directory / 'vmplacer.db'}")
        server.config.write_text(yaml.safe_dump({
            "data_dir": str(directory), "database_url": f"sqlite:///{directory / 'vmplacer.db'}",
            "hosts": [{"name": f"h{at:05d}", "uri": "test:///default", "domain_type": "qemu",
                       "capabilities": caps[at % len(caps)]} for at in range(hosts)]}))
        with server:
            cases = {}
            for concurrency in (1, 32):
                api_bench.run_load(server.port, api_bench.dry_runs(server.token, 50, f"warm{concurrency}"),
                                   concurrency, 200)
                cases[str(concurrency)] = api_bench.run_load(
                    server.port, api_bench.dry_runs(server.token, requests, f"c{concurrency}"), concurrency, 200,
                    server.process.pid if server.process is not None else None)
            # every request a guest shape not asked before (its memory): nothing remembered applies
            distinct = api_bench.run_load(server.port, [api_bench._request("POST", "/v1/placements", server.token, {
                "name": f"dry-shape-{i}", "vcpus": 1, "memory_mib": 64 + i, "cpu_policy": "dedicated",
                "dry_run": True}) for i in range(requests)], 1, 200,
                server.process.pid if server.process is not None else None)
    return {"hosts": hosts, "requests": requests, "in_flight": cases, "every_request_a_new_shape": distinct,
            "note": "in_flight: one guest shape asked again and again (an orchestrator's flavors): after the first, "
                    "host choice ranks the remembered fleet and each shortlisted host's dry run is remembered; "
                    "every_request_a_new_shape: each request allocates on the shortlisted hosts anew"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fleet.json"))
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--exhaustive-up-to", type=int, default=1000)
    parser.add_argument("--old-code", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--old-up-to", type=int, default=100)
    parser.add_argument("--api-hosts", type=int, default=1000, help="configured hosts of the API case (0: none)")
    parser.add_argument("--api-requests", type=int, default=300)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="bounded", help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:
        sys.path.insert(0, str(args.code or ROOT))  # before anything imports vmplacer
        print(json.dumps(measure(args.measure, args.mode)))
        return
    sys.path.insert(0, str(ROOT))
    from benchmarks import host_facts

    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        runs = [run_measure(size, "bounded", None) for _ in range(args.repeat)]
        row = {"hosts": size, "bounded": _median(runs)}
        if size <= args.exhaustive_up_to:
            row["exhaustive"] = run_measure(size, "exhaustive", None)
            ref = row["exhaustive"]
            row["quality"] = {"placed_bounded": row["bounded"]["placed"], "placed_exhaustive": ref["placed"],
                              "score_share": round(row["bounded"]["total_score"] / ref["total_score"], 5)
                              if ref["total_score"] else None}
        if args.old_code is not None and size <= args.old_up_to:
            row["old_code"] = run_measure(size, "bounded", args.old_code)
        rows.append(row)
        print(json.dumps(row), flush=True)
    api = api_case(args.api_hosts, args.api_requests) if args.api_hosts else None
    if api is not None:
        print(json.dumps(api), flush=True)
    by_size = {r["hosts"]: r for r in rows}
    targets = {}
    if 1000 in by_size:
        targets["plan_1000_hosts_under_1s_cpu"] = by_size[1000]["bounded"]["cpu_s"] < PLAN_1000_TARGET_S
    if 10000 in by_size:
        targets["plan_10000_hosts_under_10s_cpu"] = by_size[10000]["bounded"]["cpu_s"] < PLAN_10000_TARGET_S
    targets["memory_under_2_gib"] = all(r["bounded"]["peak_rss_mib"] < MEMORY_TARGET_MIB for r in rows)
    quality = [r["quality"] for r in rows if "quality" in r]
    targets["placed_as_many_as_exhaustive"] = all(q["placed_bounded"] >= q["placed_exhaustive"] for q in quality)
    targets["score_at_least_99_percent_of_exhaustive"] = all(
        q["score_share"] is None or q["score_share"] >= QUALITY_TARGET for q in quality)
    if api is not None:
        targets["api_dry_run_p99_under_50ms_at_1_in_flight"] = (api["in_flight"]["1"]["p99_ms"] or 1e9) < 50.0
        targets["api_dry_runs_at_least_100_per_s_at_32_in_flight"] = api["in_flight"]["32"]["rps"] >= 100.0
    result = {"machine": host_facts.summary(), "load_average_after": host_facts.load_average(),
              "guests": GUESTS, "repeat": args.repeat, "rows": rows, "api": api, "targets": targets,
              "note": "cpu_s/wall_s: the batch plan only (fleet generation excluded), median of `repeat` "
                      "fresh processes; exhaustive and old_code: one run each"}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(targets))


def _median(runs: list[dict]) -> dict:
    middle = sorted(runs, key=lambda r: r["cpu_s"])[len(runs) // 2]
    return {**middle, "cpu_s_runs": [r["cpu_s"] for r in runs]}


if __name__ == "__main__":
    main()
