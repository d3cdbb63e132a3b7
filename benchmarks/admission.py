"""Admission benchmark: placing arriving guests with the interference model against topology only.

    python benchmarks/admission.py [--out benchmarks/results/admission.json] [--seeds 3] [--arrivals 200]
                                   [--hosts 10] [--weight W] [--matrix NAME ...]

For each pair matrix in tests/data/interference/*_pairs.csv (the simulator's hidden truth) and
each seed:

1. **A profiled fleet.** 20 simulated hosts (4 cores × 2 threads) each run 6 one-vCPU guests
   pinned to random distinct pCPUs, workloads drawn from the matrix, labelled
   `workload_class: <workload>`. Freeze'nSense profiles them (2 rounds, through the ports, 3 %
   noise) and the model learns from the samples keyed by *guest name*, as online learning does.
2. **Arrivals.** 200 new guests (names never profiled, so the model knows only their class):
   workload drawn uniformly from the matrix, 1 vCPU (70 %) or 2 vCPUs, dedicated pinning
   (thread policy prefer), label `workload_class: <workload>`; each stays for an exponentially
   distributed number of arrivals (mean 60), which keeps 10 hosts × 8 pCPUs nearly full.
3. **Two placers, same sequence.** Each arrival is placed by the placement engine on every host
   with room; the best score wins (ties: the emptier host, then host order). *topology*: the
   engine's default scorers. *model-aware*: the same plus the interference scorer
   (`placement.interference_weight`, default 1.0) with class → global shrinkage. A guest that
   fits nowhere is refused (counted).
4. **Measured after every arrival**, over the guests running then: mean *predicted* performance
   (the model's, with shrinkage) and mean *simulated* performance (the simulator's noise-free
   truth), each as a fraction of the guest running alone. The reported figures are the means
   over the 200 arrivals.

Target: the model-aware placer's mean predicted and mean simulated performance both beat the
topology-only placer's.
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

from vmplacer.lab.simulator import SimCluster  # noqa: E402
from vmplacer.lab.evaluate import ProfileSettings, profile_host  # noqa: E402
from vmplacer.lab.rebalance_eval import DISTANCE_PRIOR  # noqa: E402
from vmplacer.core.placement.allocate import NoFit, allocate  # noqa: E402
from vmplacer.core.model.class_priors import Identity, ShrunkBetas  # noqa: E402
from vmplacer.core.placement.guest import GuestSpec  # noqa: E402
from vmplacer.core.model.interference import InterferenceModel, ModelConfig  # noqa: E402
from vmplacer.core.placement.interference_scorer import (  # noqa: E402
    AdmissionSettings,
    GuestProfile,
    admission_scorer,
    predicted_performance,
    profile_of_spec,
)
from vmplacer.core.model.pairs import parse_pairs  # noqa: E402
from vmplacer.core.placement.guest_placement import Placement  # noqa: E402
from vmplacer.core.placement.scoring import default_scorer  # noqa: E402
from vmplacer.core.topology.host import uniform_topology  # noqa: E402

SHAPE = {"nodes": 1, "cores_per_node": 4, "threads_per_core": 2}
TRAIN_HOSTS = 20
TRAIN_GUESTS = 6
MEAN_STAY = 60  # arrivals
TWO_VCPU_SHARE = 0.3
PLACERS = ("topology", "model_aware")


def machine() -> str:
    return host_facts.summary()


def matrices() -> list[Path]:
    return sorted((ROOT / "tests" / "data" / "interference").glob("*_pairs.csv"))


def learned_model(table, seed: int) -> InterferenceModel:
    """The profiled fleet: Freeze'nSense samples keyed by guest name, classes from labels."""
    cluster = SimCluster(table, seed=seed)
    rng = random.Random(seed)
    observations = []
    pcpus = SHAPE["nodes"] * SHAPE["cores_per_node"] * SHAPE["threads_per_core"]
    for index in range(TRAIN_HOSTS):
        host = cluster.add_host(f"old{index}", uniform_topology(**SHAPE, name=f"old{index}"))
        for vm, cpu in enumerate(rng.sample(range(pcpus), TRAIN_GUESTS)):
            workload = rng.choice(table.workloads)
            host.define_domain(f"old{index}-{vm}", workload=workload, vcpupin=[cpu], workload_class=workload)
        observations += profile_host(host, cluster.sampler(host), cluster.clock, ProfileSettings(rounds=2),
                                     key_by_name=True)
    return InterferenceModel(ModelConfig(distance_prior=DISTANCE_PRIOR)).fit(observations)


def arrivals(table, seed: int, count: int) -> list[tuple[GuestSpec, str, int]]:
    """(spec, workload, departs after arrival number) for each arriving guest."""
    rng = random.Random(1000 + seed)
    result = []
    for index in range(count):
        workload = rng.choice(table.workloads)
        vcpus = 2 if rng.random() < TWO_VCPU_SHARE else 1
        spec = GuestSpec.from_mapping({"name": f"new{index:03d}", "vcpus": vcpus, "memory_mib": 1024,
                                       "cpu_policy": "dedicated", "labels": {"workload_class": workload}})
        result.append((spec, workload, index + 1 + int(rng.expovariate(1.0 / MEAN_STAY))))
    return result


def run_placer(name: str, table, sequence, betas: ShrunkBetas, hosts: int, seed: int,
               settings: AdmissionSettings) -> dict:
    cluster = SimCluster(table, seed=seed, noise=0.0)
    sims = {f"h{i}": cluster.add_host(f"h{i}", uniform_topology(**SHAPE, name=f"h{i}")) for i in range(hosts)}
    placed: dict[str, list[Placement]] = {h: [] for h in sims}
    profiles: dict[str, GuestProfile] = {}
    where: dict[str, str] = {}
    leaving: list[tuple[int, str]] = []
    predicted, simulated, running, refused, seconds = [], [], [], 0, 0.0
    for number, (spec, workload, departs) in enumerate(sequence):
        for _, guest in [x for x in leaving if x[0] <= number]:
            host = where.pop(guest)
            placed[host] = [p for p in placed[host] if p.guest != guest]
            sims[host].undefine(guest)
        leaving = [x for x in leaving if x[0] > number]
        began = time.perf_counter()
        best = None
        for host, sim in sims.items():
            scorer = (admission_scorer(betas, spec, profiles, settings) if name == "model_aware"
                      else default_scorer())
            try:
                placement = allocate(sim.topology(), spec, placed[host], scorer=scorer)
            except NoFit:
                continue
            used = sum(len(p.vcpupin) for p in placed[host])
            key = (placement.score, -used)
            if best is None or key > best[0]:
                best = (key, host, placement)
        seconds += time.perf_counter() - began
        if best is None:
            refused += 1
        else:
            _, host, placement = best
            placed[host].append(placement)
            profiles[spec.name] = profile_of_spec(spec)
            where[spec.name] = host
            leaving.append((departs, spec.name))
            sims[host].define_domain(spec.name, workload=workload,
                                     vcpupin={v: c for v, c in placement.vcpupin.items()},
                                     workload_class=workload)
        pred, true = [], []
        for host, sim in sims.items():
            if not placed[host]:
                continue
            perf = predicted_performance(betas, sim.topology(), placed[host], profiles)
            for p in placed[host]:
                pred.append(perf[p.guest])
                true.append(sim.true_performance(p.guest))
        running.append(len(pred))
        predicted.append(statistics.mean(pred))
        simulated.append(statistics.mean(true))
    return {"mean_predicted": round(statistics.mean(predicted), 4),
            "mean_simulated": round(statistics.mean(simulated), 4),
            "final_predicted": round(predicted[-1], 4), "final_simulated": round(simulated[-1], 4),
            "refused": refused, "placing_seconds": round(seconds, 2),
            "mean_guests_running": round(statistics.mean(running), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "admission.json"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--arrivals", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--weight", type=float, default=AdmissionSettings().weight)
    parser.add_argument("--matrix", action="append", help="only this pair file (repeatable)")
    args = parser.parse_args(argv)
    settings = AdmissionSettings(weight=args.weight)
    load_before = os.getloadavg()
    began = time.perf_counter()
    rows = []
    for path in matrices():
        if args.matrix and path.name not in args.matrix:
            continue
        table = parse_pairs(path.read_text(), path.name)
        for seed in range(args.seeds):
            model = learned_model(table, seed)
            betas = ShrunkBetas(model)
            sequence = arrivals(table, seed, args.arrivals)
            row = {"matrix": path.name, "seed": seed, "model_observations": model.observations,
                   "class_level_weight_min": round(min(betas.weights(Identity("unseen", w))["class"]
                                                       for w in table.workloads), 4)}
            for placer in PLACERS:
                row[placer] = run_placer(placer, table, sequence, betas, args.hosts, seed, settings)
            row["gain_predicted"] = round(row["model_aware"]["mean_predicted"] - row["topology"]["mean_predicted"], 4)
            row["gain_simulated"] = round(row["model_aware"]["mean_simulated"] - row["topology"]["mean_simulated"], 4)
            rows.append(row)
            print(f"{path.name:32s} seed {seed}: predicted {row['topology']['mean_predicted']:.4f} → "
                  f"{row['model_aware']['mean_predicted']:.4f}, simulated {row['topology']['mean_simulated']:.4f} → "
                  f"{row['model_aware']['mean_simulated']:.4f}, refused {row['topology']['refused']}/"
                  f"{row['model_aware']['refused']}", flush=True)
    summary = {}
    for matrix in sorted({r["matrix"] for r in rows}):
        mine = [r for r in rows if r["matrix"] == matrix]
        summary[matrix] = {
            placer: {"mean_predicted": round(statistics.mean(r[placer]["mean_predicted"] for r in mine), 4),
                     "mean_simulated": round(statistics.mean(r[placer]["mean_simulated"] for r in mine), 4)}
            for placer in PLACERS
        } | {"gain_predicted": round(statistics.mean(r["gain_predicted"] for r in mine), 4),
             "gain_simulated": round(statistics.mean(r["gain_simulated"] for r in mine), 4),
             "seeds_where_model_aware_wins_both": sum(1 for r in mine
                                                      if r["gain_predicted"] > 0 and r["gain_simulated"] > 0)}
    overall = {placer: {"mean_predicted": round(statistics.mean(r[placer]["mean_predicted"] for r in rows), 4),
                        "mean_simulated": round(statistics.mean(r[placer]["mean_simulated"] for r in rows), 4)}
               for placer in PLACERS}
    result = {
        "benchmark": "admission",
        "machine": machine(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.perf_counter() - began, 1),
        "settings": {"arrivals": args.arrivals, "hosts": args.hosts, "host_shape": SHAPE,
                     "seeds": list(range(args.seeds)), "interference_weight": settings.weight,
                     "interference_candidates": settings.candidates, "mean_stay_arrivals": MEAN_STAY,
                     "two_vcpu_share": TWO_VCPU_SHARE, "training": {"hosts": TRAIN_HOSTS, "guests_per_host": TRAIN_GUESTS,
                                                                    "rounds": 2, "noise": 0.03}},
        "overall": overall,
        "by_matrix": summary,
        "target_met": all(overall["model_aware"][k] > overall["topology"][k] for k in ("mean_predicted", "mean_simulated")),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"overall": overall, "target_met": result["target_met"], "seconds": result["seconds"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
