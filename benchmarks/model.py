"""Benchmark of the interference model on simulated hosts -> benchmarks/results/model.json.

For every shipped pair matrix and 2-, 8- and 16-core simulated hosts with
1–3 one-vCPU VMs per core: profile random placements with Freeze'nSense, fit,
predict held-out placements, and compare the model's relative RMSE with the
linear predictor's (targets: model ≤ ¼ linear on every case). Then the speed
targets: fitting 10,000 observations < 1 s, predicting one placement of 64 VMs
< 5 ms. Numbers are measured, never asserted here: the JSON says what held.

Run: .venv/bin/python benchmarks/model.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import host_facts  # noqa: E402

from vmplacer.lab.simulator import GroundTruth, SimCluster  # noqa: E402
from vmplacer.lab.evaluate import (  # noqa: E402
    ProfileSettings,
    _populate,
    profile_training_hosts,
    random_placement,
    score_held_out,
    simulated_topology,
    tenants_of,
)
from vmplacer.core.model.interference import InterferenceModel  # noqa: E402
from vmplacer.core.model.pairs import parse_pairs  # noqa: E402

DATA = ROOT / "tests" / "data" / "interference"
RESULT = ROOT / "benchmarks" / "results" / "model.json"
CORES = (2, 8, 16)
VMS_PER_CORE = (1, 3)
SEED = 1


def machine() -> str:
    model = host_facts.cpu_model(platform.processor() or "unknown CPU")
    ram = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f", {int(line.split()[1]) / 1024 / 1024:.0f} GiB RAM"
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs{ram}, Python {platform.python_version()}"


def run_case(path: Path, cores: int, trials: int, rounds: int, seed: int = SEED) -> dict:
    table = parse_pairs(path.read_text(), path.name)
    cluster = SimCluster(GroundTruth(table), seed=seed)
    rng = random.Random(seed)
    observations = profile_training_hosts(cluster, table, cores=cores, vms_per_core=VMS_PER_CORE,
                                          trials=trials, rng=rng, settings=ProfileSettings(rounds=rounds))
    started = time.perf_counter()
    model = InterferenceModel().fit(observations)
    fit_s = time.perf_counter() - started
    started = time.perf_counter()
    evaluation = score_held_out(cluster, table, model, cores=cores, vms_per_core=VMS_PER_CORE, trials=trials,
                                rng=rng, observations=len(observations))
    score_s = time.perf_counter() - started
    data = evaluation.to_dict()
    # prediction alone, on the biggest placement of this case (3 VMs per core)
    topology = simulated_topology(cores)
    host = cluster.add_host("timing", topology)
    _populate(host, random_placement(rng, topology, table.workloads, VMS_PER_CORE[1]))
    tenants = tenants_of(host.domains())
    times = []
    for _ in range(50):
        started = time.perf_counter()
        model.predict(topology, tenants)
        times.append(time.perf_counter() - started)
    return {
        "matrix": path.name,
        "cores": cores,
        "vms_per_core": data["vms_per_core"],
        "model_rrmse": data["model_rrmse"],
        "linear_rrmse": data["linear_rrmse"],
        "ratio": round(data["model_rrmse"] / data["linear_rrmse"], 3),
        "target_met": data["model_rrmse"] <= data["linear_rrmse"] / 4,
        "observations": len(observations),
        "predictions": data["predictions"],
        "mean_confidence": data["mean_confidence"],
        "by_vms_per_core": data["by_vms_per_core"],
        "fit_s": round(fit_s, 4),
        "predict_ms": round(statistics.median(times) * 1000, 3),
        "predict_vms": len(tenants),
        # scoring = simulate the host + predict with both models; the prediction alone is timed below
        "score_held_out_s": round(score_s, 3),
    }


def speed(path: Path) -> tuple[float, float, int]:
    """Fit time for 10,000 observations and predict time for one 64-VM placement."""
    table = parse_pairs(path.read_text(), path.name)
    cluster = SimCluster(GroundTruth(table), seed=SEED)
    rng = random.Random(SEED)
    observations: list = []
    batch = 0
    while len(observations) < 10_000:
        observations += profile_training_hosts(cluster, table, cores=16, vms_per_core=(3, 3), trials=10,
                                               rng=rng, settings=ProfileSettings(rounds=3),
                                               prefix=f"speed{batch}")
        batch += 1
    observations = observations[:10_000]
    fits = []
    for _ in range(3):
        started = time.perf_counter()
        model = InterferenceModel().fit(observations)
        fits.append(time.perf_counter() - started)
    topology = simulated_topology(16)
    host = cluster.add_host("predict-64", topology)
    _populate(host, random_placement(rng, topology, table.workloads, 4))
    tenants = tenants_of(host.domains())
    assert len(tenants) == 64
    model.predict(topology, tenants)  # warm the solved state
    times = []
    for _ in range(200):
        started = time.perf_counter()
        model.predict(topology, tenants)
        times.append(time.perf_counter() - started)
    return statistics.median(fits), statistics.median(times) * 1000, len(observations)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small budget, for a smoke run")
    parser.add_argument("--output", type=Path, default=RESULT)
    args = parser.parse_args(argv)
    trials, rounds = (10, 2) if args.quick else (100, 5)
    matrices = sorted(DATA.glob("*_pairs.csv"))
    cases = []
    for path in matrices:
        for cores in CORES:
            case = run_case(path, cores, trials, rounds)
            cases.append(case)
            print(f"{case['matrix']:32} {cores:3d} cores  model {case['model_rrmse']:.4f}  "
                  f"linear {case['linear_rrmse']:.4f}  ratio {case['ratio']:.3f}  "
                  f"fit {case['fit_s']:.3f}s  ({case['observations']} observations)", flush=True)
    # how close is the tightest case to its target? other seeds, and a longer profiling budget
    worst = max(cases, key=lambda c: c["ratio"])
    worst_path = DATA / worst["matrix"]
    spread = {
        "matrix": worst["matrix"],
        "cores": worst["cores"],
        "ratio_by_seed": {str(seed): run_case(worst_path, worst["cores"], trials, rounds, seed)["ratio"]
                          for seed in range(SEED, SEED + 5)},
        "ratio_with_4x_rounds": run_case(worst_path, worst["cores"], trials, 4 * rounds)["ratio"],
    }
    print(f"tightest case {worst['matrix']} {worst['cores']} cores: {spread}")
    fit_10k, predict_64, n = speed(matrices[0])
    print(f"fit {n} observations: {fit_10k:.3f} s   predict 64 VMs: {predict_64:.3f} ms")
    result = {
        "machine": machine(),
        "budget": {"trials_train": trials, "trials_held_out": trials, "rounds": rounds,
                   "vms_per_core": f"{VMS_PER_CORE[0]}-{VMS_PER_CORE[1]}", "seed": SEED,
                   "noise": 0.03, "distance_factors": "simulator defaults", "t_m_s": 0.01, "window_s": 1.0},
        "cases": cases,
        "tightest_case": spread,
        "fit_10k_s": round(fit_10k, 4),
        "predict_64_ms": round(predict_64, 3),
        "targets": {
            "model_le_quarter_linear_all_cases": all(c["target_met"] for c in cases),
            "fit_10k_under_1s": fit_10k < 1.0,
            "predict_64_under_5ms": predict_64 < 5.0,
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
