"""Rebalance planning on big hosts: time and peak memory by host shape, guest mix and guest count.

    python benchmarks/host_shapes.py [--out benchmarks/results/host_shapes.json]
                                     [--shapes 48,112,256,512] [--mixes pinned,unpinned,node,dedicated,overcommit]
                                     [--guests 10,40,100,200] [--guests-112 60] [--fleet-hosts 1000]
                                     [--admission-mixes pinned,unpinned,node,dedicated,overcommit]
                                     [--repeats 1] [--timeout 300] [--memory-limit-gib 6] [--seed 1]
                                     [--baseline CHECKOUT]

    # a quick look (a minute or two):
    python benchmarks/host_shapes.py --shapes 48,112 --mixes pinned,unpinned --guests 10,20 \\
        --fleet-hosts 0 --admission-mixes '' --timeout 60 --out /tmp/hs.json

What is planned. One host per case, `plan_rebalance(state, model, RebalanceSettings(), now=0.0,
solver=CpSatLayoutSolver())`, the model trained as `benchmarks/rebalance.py`'s `trained_model`
does (Freeze'nSense samples of simulated hosts), every guest's workload drawn from its
`known_keys()`, labels {"workload": key, "workload_class": "batch"} unless said otherwise.
Host shapes (`uniform_topology` nodes × cores per node × threads per core), 8 GiB of memory per
pCPU, every guest 2 GiB per vCPU:

    48 pCPUs: 2 × 12 × 2    112: 2 × 28 × 2    256: 4 × 32 × 2    512: 16 × 16 × 2

Guest mixes (guest i = 0, 1, …; "every 4th guest" is i % 4 == 3; "pinned" is one vCPU pinned to a
pCPU drawn at random, repeats allowed, which the rebalancer repins freely):

- pinned: every guest pinned.
- unpinned: every 4th guest has 2 vCPUs floating over the whole host (each vCPU pinned to the
  empty set, which the rebalancer reads as all usable pCPUs); the others pinned.
- node: every 4th guest has 8 vCPUs floating over one NUMA node (each vCPU pinned to all pCPUs of
  a node drawn at random; no memory binding); the others pinned.
- dedicated: every 4th guest is dedicated: 4–16 vCPUs (drawn), labelled workload_class
  "latency-critical", one vCPU pinned to the first thread of each of as many whole cores,
  the Placement marked dedicated with both threads of its cores as exclusive pCPUs (as the
  rebalancer itself writes an isolate guest) — `describe_guest` makes it EXCLUSIVE with thread
  policy isolate. Its cores are taken on one node when one has enough free cores, else anywhere;
  dedicated guests together take at most half the host's cores (the rest stays for the shared
  guests); one that does not fit in what is left becomes a pinned guest. Pinned guests are drawn
  among the pCPUs of cores no dedicated guest owns.
- overcommit: the case's N guests are one-vCPU pinned guests, except y = min(N, max(0, 2P − N))
  of them (P: the host's pCPUs; drawn at random) which have 2 floating vCPUs over the whole host,
  so total vCPUs = N + y = 2P whenever P ≤ N ≤ 2P. The guest count stays N (the targets are per
  guest count): with N < P every guest floats and vCPUs are 2N (< 2P); with N > 2P none floats
  and vCPUs are N (> 2P). Each case records its vCPUs and vCPUs per pCPU.

Guest counts: `--guests` on every shape, plus `--guests-112` (default 60, the upper end of the
first target) on the 112-pCPU shape.

The fleet case ("fleet", `--fleet-hosts`, default 1,000; 0 skips it): that many hosts planned in
one `plan_rebalance` call; host i has shape `shapes[i % S]` and mix `mixes[(i // S) % M]` (S, M:
the selected shapes and mixes, so every combination recurs every S·M hosts), 40 guests, 100 on
512-pCPU hosts, each host built by the same rules as a single-host case of that shape, mix and
count (its own draws: the seed string names the host).

The admission case ("admission", `--admission-mixes`, default every mix; '' skips it): placing
one new guest (4 dedicated vCPUs, thread policy prefer, 8 GiB, a batch workload the model knows)
on a 512-pCPU host running 200 guests of that mix, through the placement engine's entry point,
`allocate(topology, spec, placements, scorer=admission_scorer(ShrunkBetas(model), spec,
profiles, AdmissionSettings()))`, the scorer the product builds for every placement
(vmplacer/app/place/admission.py). wall_s/cpu_s: the first such call in the process (after the
imports); warm_wall_s: the same call again; topology_only_s: the same call with the default,
topology-only scorer (after those two). It is the guest's time on one host; placing over a
fleet repeats it per candidate host.

Everything is seeded: each host's guests come from `random.Random(f"{seed}/{host}/{mix}/{N}")`, so a
case is the same host whichever others run beside it.

How it is measured. Each case (each repeat) runs in a fresh process (`--measure`, hidden) with
OPENBLAS/OMP/MKL_NUM_THREADS=1, an address-space limit (RLIMIT_AS, `--memory-limit-gib`, default 6)
and a planning time limit (`--timeout`, default 300 s: an interval timer raises in the planner; the
process is killed if it has not ended `--timeout` + 120 s after it started). wall_s/cpu_s (perf_counter,
process_time) cover planning only; peak_rss_mib is the process's peak RSS (ru_maxrss: Python,
numpy, OR-Tools, the model and the state included, which is what an operator sees),
rss_before_plan_mib the peak before planning began. Also recorded: the planner's stage times,
actions by kind, objective before/after and the predicted gain (after − before), and the hosts
the plan left out (over its memory budget) or searched only in part (past its time budget): such a
case misses its target, whatever its time. A failed case
(MemoryError, timeout, a crash) records "error": type and first line of the message, and the run
goes on. With `--repeats N` each figure is the median of N processes (a case that fails stops
repeating). With `--baseline` (another checkout of vmplacer, e.g. the previous commit in a git
worktree) each case is first measured by this script with that checkout's `vmplacer` first on
sys.path (and its benchmarks/rebalance.py for the model, when it has one), then by this checkout,
in the same run (same load); its numbers are kept under "baseline".

Targets (each case is marked met/missed where one applies; a failed case misses it):
112 pCPUs × ≤ 60 guests, any mix: ≤ 0.5 s and ≤ 300 MiB (the 40- and 60-guest cases are the ones
to judge); 512 pCPUs × ≤ 200 guests, any mix: ≤ 3 s and ≤ 1 GiB; a fleet of ≥ 1,000 hosts: ≤ 60 s
and ≤ 2 GiB (a smaller fleet is not judged). The admission case has no target.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import random
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# pCPUs -> uniform_topology(nodes, cores_per_node, threads_per_core)
SHAPES: dict[int, tuple[int, int, int]] = {48: (2, 12, 2), 112: (2, 28, 2), 256: (4, 32, 2), 512: (16, 16, 2)}
MIXES = ("pinned", "unpinned", "node", "dedicated", "overcommit")
MEMORY_MIB_PER_PCPU = 8192
GUEST_MIB_PER_VCPU = 2048
FLEET_GUESTS = 40
FLEET_GUESTS_512 = 100
ADMISSION_PCPUS, ADMISSION_GUESTS, ADMISSION_VCPUS = 512, 200, 4
SETUP_GRACE_S = 120.0  # model training and state building, on top of --timeout, before the process is killed
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

TARGETS: list[dict[str, Any]] = [
    {"name": "112_pcpus_le_60_guests", "applies_to": "one host of 112 pCPUs with at most 60 guests, any mix",
     "max_wall_s": 0.5, "max_peak_rss_mib": 300.0},
    {"name": "512_pcpus_le_200_guests", "applies_to": "one host of 512 pCPUs with at most 200 guests, any mix",
     "max_wall_s": 3.0, "max_peak_rss_mib": 1024.0},
    {"name": "fleet_1000_hosts", "applies_to": "the fleet case with at least 1,000 hosts",
     "max_wall_s": 60.0, "max_peak_rss_mib": 2048.0},
]


# ----------------------------------------------------------------------------- building hosts
def shape_label(pcpus: int) -> str:
    nodes, cores, threads = SHAPES[pcpus]
    return f"{nodes}x{cores}x{threads}"


def build_host(name: str, pcpus: int, mix: str, guests: int, workloads: Sequence[str],
               seed: int) -> tuple[Any, list[tuple[Any, dict[str, str]]]]:
    """One host of shape `pcpus` running `guests` guests of `mix`: (HostState, [(Placement, labels)])."""
    from vmplacer.core.placement.guest_placement import Placement
    from vmplacer.core.rebalance.state import HostState
    from vmplacer.core.topology.host import uniform_topology

    nodes, cores_per_node, threads = SHAPES[pcpus]
    topology = uniform_topology(nodes=nodes, cores_per_node=cores_per_node, threads_per_core=threads,
                                memory_mib_per_node=MEMORY_MIB_PER_PCPU * cores_per_node * threads, name=name)
    rng = random.Random(f"{seed}/{name}/{mix}/{guests}")
    cpus = sorted(topology.cpus)
    core_threads: dict[int, list[int]] = {}
    for cpu in cpus:
        core_threads.setdefault(topology.cpus[cpu].core, []).append(cpu)
    node_cores: dict[int, list[int]] = {}
    for core, members in sorted(core_threads.items()):
        node_cores.setdefault(topology.cpus[members[0]].node, []).append(core)
    node_cpus = {node: frozenset(c for core in cores for c in core_threads[core]) for node, cores in node_cores.items()}

    kinds = ["pinned"] * guests
    dedicated_cores: dict[int, list[int]] = {}
    if mix == "unpinned":
        kinds = ["host2" if i % 4 == 3 else "pinned" for i in range(guests)]
    elif mix == "node":
        kinds = ["node8" if i % 4 == 3 else "pinned" for i in range(guests)]
    elif mix == "overcommit":
        floating = min(guests, max(0, 2 * pcpus - guests))
        for i in rng.sample(range(guests), floating):
            kinds[i] = "host2"
    elif mix == "dedicated":
        free = {node: list(cores) for node, cores in node_cores.items()}
        budget = len(core_threads) // 2
        for i in range(3, guests, 4):
            size = rng.randint(4, 16)
            if size > budget:
                continue  # out of free cores: stays a pinned guest
            roomy = [node for node, cores in free.items() if len(cores) >= size]
            if roomy:
                node = rng.choice(roomy)
                chosen = sorted(rng.sample(free[node], size))
            else:
                chosen = sorted(rng.sample([c for cores in free.values() for c in cores], size))
            for node in free:
                free[node] = [c for c in free[node] if c not in chosen]
            budget -= size
            dedicated_cores[i] = chosen
            kinds[i] = "dedicated"
    elif mix != "pinned":
        raise ValueError(f"unknown mix {mix!r} (known: {', '.join(MIXES)})")
    owned = {c for cores in dedicated_cores.values() for core in cores for c in core_threads[core]}
    shared_pool = [c for c in cpus if c not in owned]

    result = []
    for i, kind in enumerate(kinds):
        guest = f"{name}-vm{i:03d}"
        labels = {"workload": rng.choice(list(workloads)), "workload_class": "batch"}
        extra: dict[str, Any] = {}
        if kind == "pinned":
            pins = {0: frozenset({rng.choice(shared_pool)})}
        elif kind == "host2":
            pins = {0: frozenset(), 1: frozenset()}
        elif kind == "node8":
            node = rng.choice(sorted(node_cpus))
            pins = {v: node_cpus[node] for v in range(8)}
        else:  # dedicated: first thread of each of its whole cores
            chosen = dedicated_cores[i]
            pins = {v: frozenset({core_threads[core][0]}) for v, core in enumerate(chosen)}
            labels["workload_class"] = "latency-critical"
            extra = {"dedicated": True,
                     "exclusive_cpus": frozenset(c for core in chosen for c in core_threads[core])}
        placement = Placement(guest=guest, host=name, vcpupin=pins,
                              memory_kib=GUEST_MIB_PER_VCPU * 1024 * len(pins), **extra)
        result.append((placement, labels))
    return HostState(name, topology), result


def host_cases(shapes: Sequence[int], mixes: Sequence[str], guests: Sequence[int],
               guests_112: Sequence[int]) -> list[dict[str, Any]]:
    cases = []
    for pcpus in shapes:
        counts = sorted(set(guests) | (set(guests_112) if pcpus == 112 else set()))
        for mix in mixes:
            for count in counts:
                cases.append({"kind": "host", "pcpus": pcpus, "mix": mix, "guests": count})
    return cases


def fleet_layout(hosts: int, shapes: Sequence[int], mixes: Sequence[str]) -> list[tuple[str, int, str, int]]:
    """(name, pcpus, mix, guests) of each fleet host."""
    digits = max(4, len(str(hosts - 1)))
    layout = []
    for i in range(hosts):
        pcpus = shapes[i % len(shapes)]
        mix = mixes[(i // len(shapes)) % len(mixes)]
        layout.append((f"h{i:0{digits}d}", pcpus, mix, FLEET_GUESTS_512 if pcpus == 512 else FLEET_GUESTS))
    return layout


# ----------------------------------------------------------------------------- one measurement (child)
def _limit_memory(gib: float) -> None:
    limit = int(gib * 1024 ** 3)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _error_text(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _load_rebalance_benchmark(root: Path):  # type: ignore[no-untyped-def]
    path = root / "benchmarks" / "rebalance.py"
    if not path.exists():
        path = ROOT / "benchmarks" / "rebalance.py"
    spec = importlib.util.spec_from_file_location("rebalance_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class PlanningTimeout(Exception):
    pass


def _timed(call: Callable[[], Any], timeout: float) -> tuple[Any, float, float]:
    """call() with an interval timer that raises PlanningTimeout after `timeout` s: (result, wall, cpu)."""
    def expire(signum: int, frame: Any) -> None:
        raise PlanningTimeout(f"planning took more than {timeout:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        result = call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def measure(case: Mapping[str, Any], seed: int, timeout: float, root: Path) -> dict[str, Any]:
    import vmplacer
    from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
    from vmplacer.core.rebalance.policy import RebalanceSettings, plan_rebalance
    from vmplacer.core.rebalance.state import ClusterState, describe_guest

    row: dict[str, Any] = dict(case)
    row["vmplacer"] = str(Path(vmplacer.__file__).resolve().parents[1])
    model = _load_rebalance_benchmark(root).trained_model()
    workloads = sorted(model.known_keys())

    if case["kind"] == "fleet":
        layout = fleet_layout(case["hosts"], case["shapes"], case["mixes"])
    elif case["kind"] == "admission":
        layout = [("h0", ADMISSION_PCPUS, case["mix"], ADMISSION_GUESTS)]
    else:
        layout = [("h0", case["pcpus"], case["mix"], case["guests"])]
    hosts, placed = {}, []
    for name, pcpus, mix, count in layout:
        host, guests = build_host(name, pcpus, mix, count, workloads, seed)
        hosts[name] = host
        placed += guests
    vcpus = sum(p.vcpus for p, _ in placed)
    pcpus_total = sum(len(h.topology.cpus) for h in hosts.values())
    row.update({"total_guests": len(placed), "total_pcpus": pcpus_total, "vcpus": vcpus,
                "vcpus_per_pcpu": round(vcpus / pcpus_total, 2)})
    if case["kind"] != "fleet":
        row["shape"] = shape_label(layout[0][1])
        row["pcpus"] = layout[0][1]
    if case["kind"] == "host" and case["mix"] == "dedicated":
        row["dedicated_guests"] = sum(1 for p, _ in placed if p.dedicated)
    if case["kind"] == "fleet":
        combos: dict[str, int] = {}
        for _, pcpus, mix, _ in layout:
            combos[f"{pcpus}/{mix}"] = combos.get(f"{pcpus}/{mix}", 0) + 1
        row["hosts_by_shape_and_mix"] = combos

    if case["kind"] == "admission":
        return _measure_admission(row, model, hosts["h0"].topology, placed, workloads, seed, timeout)

    state = ClusterState(hosts, {p.guest: describe_guest(p, labels=labels) for p, labels in placed})
    kwargs: dict[str, Any] = {}
    try:
        from vmplacer.core.stage_times import StageTimes
        kwargs["times"] = StageTimes(time.perf_counter)
    except ImportError:  # a baseline without the stage timer
        pass
    row["rss_before_plan_mib"] = _peak_rss_mib()
    try:
        plan, wall, cpu = _timed(lambda: plan_rebalance(state, model, RebalanceSettings(), now=0.0,
                                                        solver=CpSatLayoutSolver(), **kwargs), timeout)
    except (Exception, MemoryError) as exc:  # noqa: BLE001 - every failure is a result here
        row["error"] = _error_text(exc)
        row["peak_rss_mib"] = _peak_rss_mib()
        return row
    kinds: dict[str, int] = {}
    for action in plan.actions:
        kinds[action.kind] = kinds.get(action.kind, 0) + 1
    row.update({
        "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "peak_rss_mib": _peak_rss_mib(),
        "actions": dict(sorted(kinds.items())),
        "objective_before": round(plan.objective_before, 3), "objective_after": round(plan.objective_after, 3),
        "predicted_gain": round(plan.objective_after - plan.objective_before, 3),
    })
    notes = plan.settings.get("notes", {}) if isinstance(plan.settings, Mapping) else {}
    for key in ("left_out", "cut_short"):  # hosts the plan did not search (fully): not planned, not met
        if notes.get(key):
            row[key] = [entry["host"] for entry in notes[key]]
    if "times" in kwargs:
        row["stages_s"] = kwargs["times"].rounded(3)
    return row


def _measure_admission(row: dict[str, Any], model: Any, topology: Any, placed: list[tuple[Any, dict[str, str]]],
                       workloads: Sequence[str], seed: int, timeout: float) -> dict[str, Any]:
    from vmplacer.core.model.class_priors import ShrunkBetas
    from vmplacer.core.placement.allocate import allocate
    from vmplacer.core.placement.guest import GuestSpec
    from vmplacer.core.placement.interference_scorer import AdmissionSettings, admission_scorer, profile_from_labels
    from vmplacer.core.placement.scoring import default_scorer

    settings = AdmissionSettings()
    betas = ShrunkBetas(model, settings.shrinkage)
    workload = random.Random(f"{seed}/arrival").choice(list(workloads))
    spec = GuestSpec.from_mapping({"name": "arrival", "vcpus": ADMISSION_VCPUS, "memory_mib": 8192,
                                   "cpu_policy": "dedicated",
                                   "labels": {"workload": workload, "workload_class": "batch"}})
    placements = [p for p, _ in placed]
    profiles = {p.guest: profile_from_labels(p.guest, labels) for p, labels in placed}
    row["new_guest"] = {"vcpus": ADMISSION_VCPUS, "cpu_policy": "dedicated", "workload": workload}
    row["rss_before_plan_mib"] = _peak_rss_mib()
    try:
        def place() -> Any:
            return allocate(topology, spec, placements, scorer=admission_scorer(betas, spec, profiles, settings))

        placement, wall, cpu = _timed(place, timeout)
        _, warm_wall, _ = _timed(place, timeout)
        _, blind_wall, _ = _timed(lambda: allocate(topology, spec, placements, scorer=default_scorer()), timeout)
    except (Exception, MemoryError) as exc:  # noqa: BLE001 - NoFit, MemoryError, timeout: all results here
        row["error"] = _error_text(exc)
        row["peak_rss_mib"] = _peak_rss_mib()
        return row
    row.update({"wall_s": round(wall, 4), "cpu_s": round(cpu, 4), "warm_wall_s": round(warm_wall, 4),
                "topology_only_s": round(blind_wall, 4),
                "peak_rss_mib": _peak_rss_mib(), "pcpus_chosen": sorted(placement.pcpus),
                "score": round(placement.score, 4)})
    return row


# ----------------------------------------------------------------------------- the run (parent)
def run_case(case: Mapping[str, Any], args: argparse.Namespace, root: Path | None) -> dict[str, Any]:
    """`case` measured `args.repeats` times, each in a fresh process; medians of the timings."""
    runs: list[dict[str, Any]] = []
    for _ in range(args.repeats):
        runs.append(_one_process(case, args, root))
        if "error" in runs[-1]:
            break
    ok = [r for r in runs if "error" not in r]
    row = dict(ok[-1] if ok else runs[-1])
    for key in ("wall_s", "cpu_s", "peak_rss_mib", "rss_before_plan_mib", "warm_wall_s", "topology_only_s"):
        values = [r[key] for r in ok if key in r]
        if values:
            row[key] = round(statistics.median(values), 4)
    if len(runs) > 1:
        row["runs"] = [{k: r.get(k) for k in ("wall_s", "cpu_s", "peak_rss_mib", "error") if k in r} for r in runs]
    failed = [r for r in runs if "error" in r]
    if failed:
        row["error"] = failed[0]["error"]
    row["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return row


def _one_process(case: Mapping[str, Any], args: argparse.Namespace, root: Path | None) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", json.dumps(dict(case)),
               "--seed", str(args.seed), "--timeout", str(args.timeout),
               "--memory-limit-gib", str(args.memory_limit_gib)]
    if root is not None:
        command += ["--root", str(root)]
    env = dict(os.environ, **{name: "1" for name in THREAD_VARIABLES})
    row: dict[str, Any] = dict(case)
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env,
                              timeout=args.timeout + SETUP_GRACE_S)
    except subprocess.TimeoutExpired:
        row["error"] = f"timeout: the process was killed after {args.timeout + SETUP_GRACE_S:g} s"
        return row
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    if done.returncode < 0:
        row["error"] = f"killed by signal {signal.Signals(-done.returncode).name}"
    else:
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()]
        row["error"] = tail[-1].strip() if tail else f"exit status {done.returncode}, no output"
    return row


def judge(row: dict[str, Any]) -> None:
    """Mark `row` with the target that applies to it, if any, and whether it met it."""
    if row["kind"] == "host" and row["pcpus"] == 112 and row["guests"] <= 60:
        target = TARGETS[0]
    elif row["kind"] == "host" and row["pcpus"] == 512 and row["guests"] <= 200:
        target = TARGETS[1]
    elif row["kind"] == "fleet" and row["hosts"] >= 1000:
        target = TARGETS[2]
    else:
        return
    row["target"] = target["name"]
    row["target_met"] = ("error" not in row and not row.get("left_out") and not row.get("cut_short")
                         and row.get("wall_s", float("inf")) <= target["max_wall_s"]
                         and row.get("peak_rss_mib", float("inf")) <= target["max_peak_rss_mib"])


def case_id(row: Mapping[str, Any]) -> str:
    if row["kind"] == "fleet":
        return f"fleet/{row['hosts']}"
    if row["kind"] == "admission":
        return f"admission/{ADMISSION_PCPUS}/{row['mix']}/{ADMISSION_GUESTS}"
    return f"{row['pcpus']}/{row['mix']}/{row['guests']}"


def target_summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    summary = []
    for target in TARGETS:
        judged = [r for r in rows if r.get("target") == target["name"]]
        missed = [case_id(r) for r in judged if not r["target_met"]]
        summary.append(dict(target, judged=len(judged), met=len(judged) - len(missed), missed=missed,
                            all_met=(not missed) if judged else None))
    return summary


def _numbers(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def _names(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in MIXES]
    if unknown:
        raise SystemExit(f"unknown mix(es) {', '.join(unknown)} (known: {', '.join(MIXES)})")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "host_shapes.json"))
    parser.add_argument("--shapes", default="48,112,256,512", help=f"host pCPUs, of {sorted(SHAPES)}")
    parser.add_argument("--mixes", default=",".join(MIXES))
    parser.add_argument("--guests", default="10,40,100,200", help="guest counts on every shape")
    parser.add_argument("--guests-112", default="60", help="extra guest counts on the 112-pCPU shape only ('': none)")
    parser.add_argument("--fleet-hosts", type=int, default=1000, help="hosts of the fleet case (0: no fleet case)")
    parser.add_argument("--admission-mixes", default=",".join(MIXES),
                        help="mixes of the 512-pCPU × 200-guest host one new guest is placed on ('': none)")
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per case; medians reported")
    parser.add_argument("--timeout", type=float, default=300.0, help="planning time limit per case, s")
    parser.add_argument("--memory-limit-gib", type=float, default=6.0, help="address-space limit per case")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline", help="another checkout of vmplacer, measured first in each case")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.measure is not None:
        _limit_memory(args.memory_limit_gib)
        root = Path(args.root).resolve() if args.root else ROOT
        sys.path.insert(0, str(root))
        print(json.dumps(measure(json.loads(args.measure), args.seed, args.timeout, root)), flush=True)
        return

    sys.path.insert(0, str(ROOT))
    from benchmarks import host_facts

    shapes = _numbers(args.shapes)
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown} (known: {sorted(SHAPES)})")
    mixes = _names(args.mixes)
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    cases = host_cases(shapes, mixes, _numbers(args.guests), _numbers(args.guests_112))
    if args.fleet_hosts > 0:
        cases.append({"kind": "fleet", "hosts": args.fleet_hosts, "shapes": shapes, "mixes": mixes})
    cases += [{"kind": "admission", "mix": mix} for mix in _names(args.admission_mixes)]

    baseline = Path(args.baseline).resolve() if args.baseline else None
    load_before = host_facts.load_average()
    began = time.perf_counter()
    rows, baseline_rows = [], []
    for case in cases:
        if baseline is not None:
            baseline_rows.append(run_case(case, args, baseline))
            judge(baseline_rows[-1])
            print("baseline", json.dumps(baseline_rows[-1]), flush=True)
        rows.append(run_case(case, args, None))
        judge(rows[-1])
        print(json.dumps(rows[-1]), flush=True)

    machine = {"platform": platform.platform(), "cpu": host_facts.cpu_model(), "cpus": os.cpu_count(),
               "python": platform.python_version(), "uname": " ".join(os.uname()),
               "blas_threads": "1 (OPENBLAS/OMP/MKL_NUM_THREADS in each measured process)"}
    result: dict[str, Any] = {
        "benchmark": "host_shapes",
        "what": __doc__.split("\n\n")[0].strip(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "load_average": {"before": load_before, "after": host_facts.load_average(),
                         "note": "1, 5 and 15 min load averages; the machine is shared with other work"},
        "settings": {"shapes": {str(s): shape_label(s) for s in shapes}, "mixes": mixes,
                     "guests": _numbers(args.guests), "guests_112": _numbers(args.guests_112),
                     "fleet_hosts": args.fleet_hosts, "admission_mixes": _names(args.admission_mixes),
                     "repeats": args.repeats, "timeout_s": args.timeout,
                     "memory_limit_gib": args.memory_limit_gib, "seed": args.seed},
        "targets": target_summary(rows),
        "cases": rows,
        "total_s": round(time.perf_counter() - began, 1),
    }
    if baseline is not None:
        commit = subprocess.run(["git", "-C", str(baseline), "rev-parse", "HEAD"], capture_output=True, text=True)
        result["baseline"] = {"path": str(baseline), "commit": commit.stdout.strip() or None,
                              "targets": target_summary(baseline_rows), "cases": baseline_rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
