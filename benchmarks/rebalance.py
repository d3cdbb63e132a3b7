"""Rebalancing benchmark on simulated hosts: vmplacer against no action, the seed's relocation
policy, interference-blind spreading and the optimum; and planning time at scale.

    python benchmarks/rebalance.py [--out benchmarks/results/rebalance.json] [--seeds 3] [--quick]
                                   [--shape LABEL ...] [--matrix NAME ...] [--setting NAME=VALUE ...]

    # in parallel, one part per matrix, then merged (with a baseline run beside, optional):
    python benchmarks/rebalance.py --matrix NAME --rows-out part.json        # per matrix
    python benchmarks/rebalance.py --rows-from part1.json --rows-from ... [--baseline-from ...]

For each pair matrix in tests/data/interference/*_pairs.csv (the simulator's hidden truth), for
each host shape (SHAPES: free cores, two hosts, NUMA, full hosts, full hosts with cache-hungry and
compute-bound guests, overcommitted hosts) and starting point (the seed's worst case — VMs packed
on SMT sibling threads of the first host — and random pCPUs), for each seed: see vmplacer/lab/rebalance_eval.py for the
policies. vmplacer plans with the exact solver (CP-SAT) on hosts of at most 16 pCPUs.
Performance = mean fraction of isolated performance over all VMs, from the simulator's
noise-free truth. The optimum enumerates every distinct layout (hosts, nodes, cores and threads
are interchangeable; time sharing included: vmplacer/lab/optimum.py) — proven,
for every case here. Each row says each policy's share of it, and when vmplacer ends more than
0.5 % below a simple rule, why (vmplacer/lab/verdicts.py): threshold (in truth the
step to the rule's layout gains less than min_gain / min_migration_gain: a perfect model declines
it too), declined (the plan names the gain and what declined it), search, or model (the model
rates its own layout higher). Only search and model are real losses. Steps are valued as the
planner values them: its objective Σ p − φ·max(0, 1 − p)² (fairness φ), not the mean alone.

vmplacer maximizes that objective, not the mean, so each row also has `objective_optimum`: the
layout that maximizes it in truth (enumerated the same way), both values per VM, and whether the
step from vmplacer's layout to it clears its threshold — if it does, a perfect model with the
same objective and hysteresis would take it, and the shortfall is the model's.

vmplacer runs RUNS (10) times, the 10-minute timer over 100 minutes, before its layout is
scored; its performance after CHECKPOINT (5) runs is recorded beside (`vmplacer_by_run`, and
`by_run` in the summaries, with the moves done and undone by then; `--checkpoint` for others).
The simple rules are one-shot policies and do not gain from more runs.

Long-run stability: `--quick --runs 30 --checkpoint 5 --checkpoint 10 --checkpoint 20
--out benchmarks/results/rebalance_30_runs.json` (seed 0 of every case, five hours of the timer).

The model's other form: `--model-form multiplicative` (rows, planning run and the merged file
record which; parts of different forms are not merged) `--out
benchmarks/results/rebalance_multiplicative.json`, against this file as `--baseline-from`.

Experiments: `--setting NAME=VALUE` (a RebalanceSettings field); the rows and the merged file
record the overrides under `settings` (empty: the product's defaults), and parts run with
different ones are not merged.

Planning time: 100 hosts (2 nodes × 12 cores × 2 threads) × 40 one-vCPU VMs each, placed at
random, a model learned from Freeze'nSense samples, default settings (at most 8 actions).

Targets: no case more than 0.5 % below the seed policy or the blind spread, declined gains
and threshold steps counted apart; vmplacer ≥ 99 % of the optimum in every case; an optimum for every case with
≤ 16 pCPUs per host; mean gain over the blind spread ≥ 3 points on every matrix's full-host
cases; the 100×40 plan in < 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import host_facts  # noqa: E402

from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver  # noqa: E402
from vmplacer.lab.simulator import GroundTruth, SimCluster  # noqa: E402
from vmplacer.lab.optimum import case_optimum  # noqa: E402
from vmplacer.lab.evaluate import ProfileSettings, profile_host  # noqa: E402
from vmplacer.lab.rebalance_eval import DISTANCE_PRIOR, Case, HostShape, evaluate_case  # noqa: E402
from vmplacer.lab.verdicts import REAL_LOSSES, VERDICTS, perfect_model_moves  # noqa: E402
from vmplacer.core.model.interference import FORMS, InterferenceModel, ModelConfig  # noqa: E402
from vmplacer.core.model.pairs import parse_pairs  # noqa: E402
from vmplacer.core.placement.guest_placement import Placement  # noqa: E402
from vmplacer.core.rebalance.policy import plan_rebalance  # noqa: E402
from vmplacer.core.rebalance.state import (  # noqa: E402
    ClusterState,
    HostState,
    RebalanceInputError,
    RebalanceSettings,
    describe_guest,
)
from vmplacer.core.topology.host import uniform_topology  # noqa: E402

OPTIMUM_SHARE_TARGET = 0.99
LOSS_TOLERANCE = 0.005  # below a simple rule by more than this share counts
FULL_HOST_GAIN_TARGET = 0.03  # mean gain over the blind spread on full hosts
PLAN_TARGET_S = 5.0
EXACT_MAX_CPUS = 16
# vmplacer's layout is scored after RUNS rebalancing runs (100 minutes of the 10-minute timer),
# and recorded after CHECKPOINT runs too, to show how much of the gain comes how soon
RUNS = 10
CHECKPOINT = 5
FULL_HOST = "1 host, 4 cores x 2 threads, 8 VMs"
OVERCOMMITTED = "1 host, 4 cores x 2 threads, 9 VMs (overcommitted)"
# (label, hosts, VMs, host shape, workload mix)
SHAPES = (
    ("1 host, 4 cores x 2 threads, 4 VMs", 1, 4, HostShape(1, 4, 2), "any"),  # the seed's relocation experiment
    ("2 hosts, 2 cores x 2 threads, 4 VMs", 2, 4, HostShape(1, 2, 2), "any"),  # migrations count
    ("1 host, 2 nodes x 4 cores x 2 threads, 8 VMs", 1, 8, HostShape(2, 4, 2), "any"),  # NUMA
    (FULL_HOST, 1, 8, HostShape(1, 4, 2), "any"),  # every pCPU busy: which guests share a core decides
    # every pCPU busy, half the guests cache-hungry and half compute-bound: pairing decides most
    ("1 host, 4 cores x 2 threads, 8 VMs, hungry + compute", 1, 8, HostShape(1, 4, 2), "hungry-compute"),
    (OVERCOMMITTED, 1, 9, HostShape(1, 4, 2), "any"),  # more vCPUs than pCPUs: who time-shares decides
    (OVERCOMMITTED + ", hungry + compute", 1, 9, HostShape(1, 4, 2), "hungry-compute"),
)


def machine() -> str:
    return host_facts.summary()


def matrices() -> list[Path]:
    return sorted((ROOT / "tests" / "data" / "interference").glob("*_pairs.csv"))


def simulator(table, seed: int, noise: float) -> SimCluster:
    return SimCluster(table, seed=seed, noise=noise)


def best(table, case, start):
    return case_optimum(GroundTruth(table), start.workloads, hosts=case.hosts, nodes=case.shape.nodes,
                        cores=case.shape.cores_per_node, threads=case.shape.threads_per_core)


def best_by_objective(fairness: float):
    """The optimum of the rebalancer's own objective (its fairness φ), for `evaluate_case`."""
    def best_objective(table, case, start):
        return case_optimum(GroundTruth(table), start.workloads, hosts=case.hosts, nodes=case.shape.nodes,
                            cores=case.shape.cores_per_node, threads=case.shape.threads_per_core, fairness=fairness)
    return best_objective


def model_config(form: str | None = None) -> ModelConfig:
    """The evaluation's model settings, in `form` (None: the product's default form)."""
    return ModelConfig(distance_prior=DISTANCE_PRIOR, **({"form": form} if form else {}))


def run_cases(seeds: int, shapes=SHAPES, names: set[str] | None = None,
              overrides: dict[str, float] | None = None, runs: int = RUNS,
              checkpoints: tuple[int, ...] = (CHECKPOINT,), form: str | None = None,
              first_seed: int = 0) -> list[dict]:
    rows = []
    config = model_config(form)
    solver = CpSatLayoutSolver()
    for path in matrices():
        if names and path.name not in names:
            continue
        table = parse_pairs(path.read_text(), path.name)
        for label, hosts, vms, shape, mix in shapes:
            for start in ("siblings", "random"):
                for seed in range(first_seed, first_seed + seeds):
                    began = time.perf_counter()
                    settings = RebalanceSettings(**{"max_actions": vms, **(overrides or {})})
                    row = evaluate_case(table, Case(start, hosts, vms, shape, seed, mix), matrix=path.name,
                                        rounds=runs, checkpoints=checkpoints, simulator=simulator,
                                        solver=solver, best=best, settings=settings, model_config=config,
                                        best_objective=best_by_objective(settings.fairness))
                    row["shape"] = label
                    row["mix"] = mix
                    row["seconds"] = round(time.perf_counter() - began, 2)
                    rows.append(row)
                    verdict = row["vmplacer_vs_simple"]["verdict"]
                    print(f"{path.name:34s} {start:8s} {label:45s} seed {seed}: none {row['none']:.3f} "
                          f"seed {row['seed_policy']:.3f} blind {row['blind_spread']:.3f} "
                          f"vmplacer {row['vmplacer']:.3f} optimum "
                          f"{'-' if row['optimum'] is None else format(row['optimum'], '.3f')} {verdict}",
                          flush=True)
    return rows


def _share(rows: list[dict], policy: str) -> list[float]:
    return [r["share_of_optimum"][policy] for r in rows if r["share_of_optimum"] is not None]


def summarize(rows: list[dict]) -> dict:
    summary: dict[str, dict] = {}
    for matrix in sorted({r["matrix"] for r in rows}):
        mine = [r for r in rows if r["matrix"] == matrix]
        gains = {p: statistics.mean(r[p] - r["none"] for r in mine)
                 for p in ("seed_policy", "blind_spread", "vmplacer")}
        shares = _share(mine, "vmplacer")
        verdicts = [r["vmplacer_vs_simple"]["verdict"] for r in mine]
        full = [r for r in mine if r["shape"] == FULL_HOST]
        full_gain = statistics.mean(r["vmplacer"] - r["blind_spread"] for r in full) if full else None
        full_best = statistics.mean(r["optimum"] - r["blind_spread"] for r in full if r["optimum"]) if full else None
        groups = {"full_host_hungry_compute": [r for r in mine if r["shape"].startswith(FULL_HOST + ",")],
                  "overcommitted": [r for r in mine if r["shape"] == OVERCOMMITTED],
                  "overcommitted_hungry_compute": [r for r in mine if r["shape"].startswith(OVERCOMMITTED + ",")]}
        summary[matrix] = {
            "cases": len(mine),
            "mean_gain": {p: round(g, 4) for p, g in gains.items()},
            "mean_gain_over_blind_spread": round(statistics.mean(r["vmplacer"] - r["blind_spread"] for r in mine), 4),
            "share_of_optimum": {p: {"min": round(min(_share(mine, p)), 4), "mean": round(statistics.mean(_share(mine, p)), 4)}
                                 for p in ("seed_policy", "blind_spread", "vmplacer") if _share(mine, p)},
            "cases_ge_99pct_optimum": sum(1 for x in shares if x >= OPTIMUM_SHARE_TARGET),
            "cases_with_optimum": len(shares),
            "by_run": by_run(mine),
            "below_simple_rules": {v: verdicts.count(v) for v in VERDICTS},
            "cases_vmplacer_below_seed": sum(1 for r in mine if r["vmplacer"] < r["seed_policy"] - 1e-9),
            "full_host": None if not full else {
                "cases": len(full),
                "mean_gain_over_blind_spread": round(full_gain, 4),
                "optimum_gain_over_blind_spread": round(full_best, 4),
                # the target is out of reach when even the optimum is less than 3 points above spreading
                "target_reachable": full_best is not None and full_best >= FULL_HOST_GAIN_TARGET,
            },
            **{name: _group(rows) for name, rows in groups.items()},
            "targets": {
                "vmplacer_ge_99pct_optimum": all(x >= OPTIMUM_SHARE_TARGET for x in shares),
                "no_real_loss_to_simple_rules": not any(v in REAL_LOSSES for v in verdicts),
                "full_host_gain_over_blind_ge_3_points": None if full_gain is None else full_gain >= FULL_HOST_GAIN_TARGET,
            },
        }
    return summary


def by_run(rows: list[dict]) -> dict:
    """vmplacer after each recorded run count: mean performance, mean and min share of the optimum,
    cases at >= 99 % of it, and the moves done and undone so far over all cases."""
    marks = sorted({int(n) for r in rows for n in r.get("vmplacer_by_run", {})})
    result = {}
    for n in marks:
        at = [r["vmplacer_by_run"][str(n)] for r in rows if str(n) in r.get("vmplacer_by_run", {})]
        shares = [a["share_of_optimum"] for a in at if a["share_of_optimum"] is not None]
        result[str(n)] = {"cases": len(at), "mean": round(statistics.mean(a["mean"] for a in at), 4),
                          "share_of_optimum_mean": round(statistics.mean(shares), 4) if shares else None,
                          "share_of_optimum_min": round(min(shares), 4) if shares else None,
                          "cases_ge_99pct_optimum": sum(1 for x in shares if x >= OPTIMUM_SHARE_TARGET),
                          **({"moves": sum(a["moves"] for a in at), "undone": sum(a["undone"] for a in at)}
                             if all("moves" in a for a in at) else {})}
    return result


def _group(rows: list[dict]) -> dict | None:
    """Mean gains over the blind spread of a group of cases (vmplacer's and the optimum's)."""
    if not rows:
        return None
    return {
        "cases": len(rows),
        "mean_gain_over_blind_spread": round(statistics.mean(r["vmplacer"] - r["blind_spread"] for r in rows), 4),
        "optimum_gain_over_blind_spread": round(statistics.mean(r["optimum"] - r["blind_spread"] for r in rows
                                                                if r["optimum"] is not None), 4),
        "min_gain_over_blind_spread": round(min(r["vmplacer"] - r["blind_spread"] for r in rows), 4),
        "share_of_optimum_min": round(min(r["share_of_optimum"]["vmplacer"] for r in rows
                                          if r["share_of_optimum"] is not None), 4),
    }


def below_simple_rules(rows: list[dict]) -> list[dict]:
    """Every case more than 0.5 % below a simple rule: why, and for a declined gain, the gain and
    the threshold that declined it (those are counted apart from real losses)."""
    found = []
    for r in rows:
        v = r["vmplacer_vs_simple"]
        if v["verdict"] == "ok":
            continue
        entry = {"matrix": r["matrix"], "shape": r["shape"], "start": r["start"], "seed": r["seed"],
                 "verdict": v["verdict"], "versus": v["versus"], "deficit": v["deficit"],
                 "share_of_optimum": None if r["share_of_optimum"] is None else r["share_of_optimum"]["vmplacer"],
                 "why": v.get("why", "")}
        if v["verdict"] == "threshold":
            entry["threshold"] = {k: v[k] for k in ("true_gain", "threshold", "migrations")}
        if v["verdict"] == "declined" and v.get("declined"):
            top = max(v["declined"], key=lambda d: d.get("predicted_gain", 0.0))
            entry["declined"] = {k: top.get(k) for k in ("move", "predicted_gain", "sure_gain", "threshold",
                                                         "declined_by")}
        found.append(entry)
    return found


def _baseline(rows: list[dict], base: list[dict], label: str) -> dict:
    """The same cases run with other settings: means, shares and losses side by side."""
    def key(r):
        return (r["matrix"], r["shape"], r["start"], r["seed"])
    pairs = [(r, b) for b in base for r in rows if key(r) == key(b)]
    by_matrix = {}
    for matrix in sorted({r["matrix"] for r, _ in pairs}):
        mine = [(r, b) for r, b in pairs if r["matrix"] == matrix]
        by_matrix[matrix] = {
            "vmplacer_mean": round(statistics.mean(r["vmplacer"] for r, _ in mine), 4),
            "baseline_mean": round(statistics.mean(b["vmplacer"] for _, b in mine), 4),
            "cases_ge_99pct_optimum": sum(1 for r, _ in mine if r["share_of_optimum"]["vmplacer"] >= OPTIMUM_SHARE_TARGET),
            "baseline_cases_ge_99pct_optimum": sum(1 for _, b in mine
                                                   if b["share_of_optimum"]["vmplacer"] >= OPTIMUM_SHARE_TARGET),
        }
    verdicts = [b["vmplacer_vs_simple"]["verdict"] for _, b in pairs]
    return {
        "label": label, "cases": len(pairs), "by_matrix": by_matrix,
        "moves": sum(r["actions"]["vmplacer"] for r, _ in pairs),
        "baseline_moves": sum(b["actions"]["vmplacer"] for _, b in pairs),
        "baseline_by_run": by_run([b for _, b in pairs]),
        "vmplacer_mean": round(statistics.mean(r["vmplacer"] for r, _ in pairs), 4) if pairs else None,
        "baseline_mean": round(statistics.mean(b["vmplacer"] for _, b in pairs), 4) if pairs else None,
        "baseline_below_simple_rules": {v: verdicts.count(v) for v in VERDICTS},
        "baseline_cases_below_simple_rules": [{"matrix": b["matrix"], "shape": b["shape"], "start": b["start"],
                                               "seed": b["seed"], "verdict": b["vmplacer_vs_simple"]["verdict"],
                                               "deficit": b["vmplacer_vs_simple"]["deficit"]}
                                              for _, b in pairs if b["vmplacer_vs_simple"]["verdict"] != "ok"],
    }


def objective_optimum_summary(rows: list[dict]) -> dict | None:
    """vmplacer against the optimum of its own objective (fairness included): how far per VM, and
    the cases where a perfect model with that objective and the same hysteresis would still move
    (the step to that optimum clears its threshold in truth) — the model's misses."""
    known = [r for r in rows if r.get("objective_optimum")]
    if not known:
        return None
    gaps = [r["objective_optimum"]["objective_per_vm"] - r["objective_optimum"]["vmplacer_objective_per_vm"]
            for r in known]
    moves = [r for r in known if perfect_model_moves(r["objective_optimum"]["step"])]
    return {
        "cases": len(known),
        "fairness": known[0]["objective_optimum"]["fairness"],
        "gap_per_vm_mean": round(statistics.mean(gaps), 4),
        "gap_per_vm_max": round(max(gaps), 4),
        "cases_a_perfect_model_would_move": len(moves),
        "list": [{"matrix": r["matrix"], "shape": r["shape"], "start": r["start"], "seed": r["seed"],
                  "gap_per_vm": round(r["objective_optimum"]["objective_per_vm"]
                                      - r["objective_optimum"]["vmplacer_objective_per_vm"], 4),
                  "step": r["objective_optimum"]["step"]} for r in moves],
    }


def trial_totals(rows: list[dict]) -> dict[str, int]:
    """Each trial count summed over the rows that have it."""
    totals: dict[str, int] = {}
    for row in rows:
        for name, count in (row.get("trials") or {}).items():
            totals[name] = totals.get(name, 0) + int(count)
    return dict(sorted(totals.items()))


def optimum_known(rows: list[dict]) -> bool:
    """Every case whose hosts have at most EXACT_MAX_CPUS pCPUs has its optimum."""
    def pcpus(r):
        shape = r["host_shape"]
        return shape["nodes"] * shape["cores_per_node"] * shape["threads_per_core"]
    return all(r["optimum"] is not None for r in rows if pcpus(r) <= EXACT_MAX_CPUS)


def trained_model(seed: int = 1, form: str | None = None) -> InterferenceModel:
    """A model learned the production way: Freeze'nSense samples of random simulated hosts."""
    path = matrices()[0]
    table = parse_pairs(path.read_text(), path.name)
    cluster = SimCluster(table, seed=seed)
    rng = random.Random(seed)
    observations = []
    for index in range(20):
        topology = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2, name=f"t{index}")
        host = cluster.add_host(f"t{index}", topology)
        for vm in range(8):
            host.define_domain(f"t{index}-{vm}", workload=rng.choice(table.workloads),
                               vcpupin=[rng.randrange(16)], workload_class="batch")
        observations += profile_host(host, cluster.sampler(host), cluster.clock, ProfileSettings(rounds=2))
    return InterferenceModel(model_config(form)).fit(observations)


def scale_fleet(model: InterferenceModel, hosts: int, vms: int, digits: int = 3) -> ClusterState:
    """The fleet planning is timed on (seeded): uniform two-node hosts of 24 cores x 2 threads,
    each with `vms` one-vCPU batch guests pinned to random pCPUs, workloads the model knows."""
    workloads = list(model.known_keys())
    rng = random.Random(2)
    host_states, guests = {}, {}
    for h in range(hosts):
        name = f"h{h:0{digits}d}"
        topology = uniform_topology(nodes=2, cores_per_node=12, threads_per_core=2, name=name)
        host_states[name] = HostState(name, topology)
        for v in range(vms):
            guest = f"{name}-vm{v:02d}"
            placement = Placement(guest=guest, host=name, vcpupin={0: frozenset({rng.randrange(48)})},
                                  memory_kib=2 * 1024 * 1024)
            guests[guest] = describe_guest(placement, labels={"workload": rng.choice(workloads),
                                                              "workload_class": "batch"})
    return ClusterState(host_states, guests)


def plan_at_scale(hosts: int = 100, vms: int = 40, repeats: int = 3, form: str | None = None) -> dict:
    model = trained_model(form=form)
    state = scale_fleet(model, hosts, vms)
    times, plan = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        plan = plan_rebalance(state, model, RebalanceSettings(), now=0.0, solver=CpSatLayoutSolver())
        times.append(time.perf_counter() - began)
    assert plan is not None
    return {
        "seconds": [round(t, 3) for t in times],
        "median_s": round(statistics.median(times), 3),
        "actions": len(plan.actions),
        "objective_before": round(plan.objective_before, 3),
        "objective_after": round(plan.objective_after, 3),
        "model_observations": model.observations,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def setting_overrides(pairs: list[str]) -> dict[str, float | bool]:
    """NAME=VALUE pairs of --setting as RebalanceSettings fields; an unknown name or a value that is
    not a number stops the run before any case, naming it."""
    fields = RebalanceSettings.__dataclass_fields__
    overrides: dict[str, float | bool] = {}
    for pair in pairs:
        name, _, text = pair.partition("=")
        if name not in fields:
            raise SystemExit(f"--setting {pair!r}: no rebalance setting is called {name!r}")
        try:
            value = float(text)
        except ValueError:
            raise SystemExit(f"--setting {pair!r}: the value must be a number") from None
        kind = fields[name].type
        overrides[name] = int(value) if kind in (int, "int") else bool(value) if kind in (bool, "bool") else value
    try:
        RebalanceSettings(**overrides)  # the product's own checks of each field
    except RebalanceInputError as error:
        raise SystemExit(f"--setting: {error}") from None
    return overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rebalance.json"))
    parser.add_argument("--seeds", type=int, default=3, help="seeds per matrix, shape and start (default 3)")
    parser.add_argument("--quick", action="store_true", help="one seed, no planning-time run")
    parser.add_argument("--shape", action="append", help="only this shape (a label; repeatable)")
    parser.add_argument("--matrix", action="append", help="only this pair file (a file name; repeatable)")
    parser.add_argument("--runs", type=int, default=RUNS,
                        help=f"rebalancing runs before vmplacer's layout is scored (default {RUNS})")
    parser.add_argument("--checkpoint", action="append", type=int, metavar="N",
                        help=f"also record vmplacer after N runs (repeatable; default {CHECKPOINT})")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a rebalance setting other than the product's default, e.g. pessimism=0 or "
                             "min_migration_gain=0.05 (repeatable; for experiments against a baseline)")
    parser.add_argument("--model-form", choices=FORMS,
                        help="how the model combines neighbours' losses (default: the product's)")
    parser.add_argument("--baseline-from", action="append",
                        help="case rows of a run with other settings (--rows-out files), summarized beside")
    parser.add_argument("--baseline-label", default="", help="what the baseline run changed")
    parser.add_argument("--rows-out", help="write only the case rows to this file (a part run in parallel)")
    parser.add_argument("--rows-from", action="append",
                        help="take the case rows from this file of --rows-out (repeatable) instead of running them")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    load_before = os.getloadavg()
    shapes = [s for s in SHAPES if not args.shape or s[0] in args.shape]
    form = args.model_form or ModelConfig().form
    overrides = setting_overrides(args.setting)
    if args.rows_from:
        parts = [json.loads(Path(f).read_text()) for f in args.rows_from]
        forms = {part.get("model_form", form) for part in parts}
        if len(forms) != 1:
            raise SystemExit(f"--rows-from: the parts were run with different model forms ({', '.join(sorted(forms))})")
        form = forms.pop()
        settings = {json.dumps(part.get("settings", {}), sort_keys=True) for part in parts}
        if len(settings) != 1:
            raise SystemExit(f"--rows-from: the parts were run with different --setting overrides ({'; '.join(sorted(settings))})")
        overrides = json.loads(settings.pop())
        rows = [r for part in parts for r in part["cases"]]
        load_before = tuple(min(part["load_average"]["start"][i] for part in parts) for i in range(3))
    else:
        rows = run_cases(1 if args.quick else args.seeds, shapes, set(args.matrix or ()),
                         overrides, args.runs, tuple(args.checkpoint or (CHECKPOINT,)),
                         args.model_form)
    if args.rows_out:
        Path(args.rows_out).write_text(json.dumps({
            "cases": rows, "seconds": round(time.perf_counter() - began, 1),
            "model_form": form, "settings": overrides,
            "load_average": {"start": [round(x, 2) for x in load_before],
                             "end": [round(x, 2) for x in os.getloadavg()]}}, indent=1) + "\n")
        return 0
    scale = None if args.quick else plan_at_scale(form=form)
    summary = summarize(rows)
    verdicts = [r["vmplacer_vs_simple"]["verdict"] for r in rows]
    short = [r for r in rows if r["share_of_optimum"] is not None
             and r["share_of_optimum"]["vmplacer"] < OPTIMUM_SHARE_TARGET]
    result = {
        "machine": machine(),
        "load_average": {"start": [round(x, 2) for x in load_before],
                         "end": [round(x, 2) for x in os.getloadavg()],
                         "note": "1, 5 and 15 min load averages; the machine is shared with other work"},
        "model_form": form,
        # --setting overrides of the product's defaults the cases ran with (empty: the defaults)
        "settings": overrides,
        "cases": rows,
        "plan_100x40_s": None if scale is None else scale["median_s"],
        "plan_100x40": scale,
        "summary": summary,
        "below_simple_rules": {
            "cases": len(rows),
            **{v: verdicts.count(v) for v in VERDICTS},
            "real_losses": sum(1 for v in verdicts if v in REAL_LOSSES),
            "list": below_simple_rules(rows),
        },
        "share_of_optimum": {
            "cases_with_optimum": sum(1 for r in rows if r["optimum"] is not None),
            "cases_ge_99pct": sum(1 for r in rows if r["share_of_optimum"] is not None
                                  and r["share_of_optimum"]["vmplacer"] >= OPTIMUM_SHARE_TARGET),
            "by_run": by_run(rows),
            "below_99pct": [{"matrix": r["matrix"], "shape": r["shape"], "start": r["start"], "seed": r["seed"],
                             "vmplacer": r["share_of_optimum"]["vmplacer"],
                             "to_optimum": r.get("vmplacer_vs_optimum")} for r in short],
            # of those, the ones where the step to the optimum's layout gains less in truth than the
            # threshold it must clear: a perfect model with the same hysteresis stops there too
            "below_99pct_within_threshold": sum(1 for r in short
                                                if (r.get("vmplacer_vs_optimum") or {}).get("within_threshold")),
        },
        "objective_optimum": objective_optimum_summary(rows),
        # vmplacer's measured trials over every case and run (rows' `trials`, summed)
        "trials": trial_totals(rows),
        "targets": {
            "no_real_loss_to_simple_rules": not any(v in REAL_LOSSES for v in verdicts),
            "vmplacer_ge_99pct_optimum": all(s["targets"]["vmplacer_ge_99pct_optimum"] for s in summary.values()),
            "optimum_known_for_every_case_up_to_16_pcpus": optimum_known(rows),
            "full_host_gain_over_blind_ge_3_points_every_matrix": all(
                s["targets"]["full_host_gain_over_blind_ge_3_points"] is not False for s in summary.values()),
            # where 3 points are out of reach (the optimum itself is closer to spreading), within 1 point of it
            "full_host_gain_over_blind_ge_3_points_where_reachable": all(
                s["full_host"] is None or s["targets"]["full_host_gain_over_blind_ge_3_points"]
                or (not s["full_host"]["target_reachable"]
                    and s["full_host"]["optimum_gain_over_blind_spread"] - s["full_host"]["mean_gain_over_blind_spread"]
                    <= 0.01)
                for s in summary.values()),
            "plan_100x40_under_5s": None if scale is None else scale["median_s"] < PLAN_TARGET_S,
        },
        "total_s": round(time.perf_counter() - began, 1),
    }
    if args.baseline_from:
        base = [r for f in args.baseline_from for r in json.loads(Path(f).read_text())["cases"]]
        result["baseline"] = _baseline(rows, base, args.baseline_label)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"summary": summary, "below_simple_rules": result["below_simple_rules"],
                      "plan_100x40": scale, "targets": result["targets"]}, indent=2))
    ok = all(v is not False for v in result["targets"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
