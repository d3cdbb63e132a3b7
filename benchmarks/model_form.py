"""Which form of the interference model can pick the optimum at all, given the true pair losses?

    python benchmarks/model_form.py [--out benchmarks/results/model_form.json]

A diagnosis, not a race: for every one-host case of `benchmarks/results/rebalance.json` (its
workloads, its host shape), every distinct layout is enumerated (as the optimum is:
vmplacer/lab/optimum.py) and scored four ways:

* **truth** — the simulator's arithmetic: each neighbour y leaves x the fraction 1 − L·g_y
  of its speed, so losses compound (a product, never below 0);
* **additive** — the model's form today, handed the exact pair losses (β = L):
  perf = s·max(0, 1 − Σ L·g_y), the seed's eq. 3.5;
* **multiplicative** — perf = s·exp(−Σ γ·g_y) with γ = −ln(1 − L): the same product as the
  truth for neighbours that do not time-share, and an approximation for those that do;
* **linearized** — what a pairwise solver (CP-SAT takes sums of pair terms) can optimize of the
  multiplicative form: each guest's terms weighted by its exp(−Σγg) at the layout before,
  re-solved from the layout it picks, at most four times, from the argmax of Σ s·(1 − Σγg).

Each form's best layout is then scored by the truth, as a share of the optimum. A form whose
best layout falls short of the optimum with the true coefficients will fall short with learned
ones too, whatever the data: the shortfall is the form's, not the fit's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import host_facts  # noqa: E402

from vmplacer.lab.simulator import GroundTruth  # noqa: E402
from vmplacer.lab.optimum import every_layout  # noqa: E402
from vmplacer.core.model.interference import distance_matrix  # noqa: E402
from vmplacer.core.model.pairs import parse_pairs  # noqa: E402
from vmplacer.core.topology.host import uniform_topology  # noqa: E402

DATA = ROOT / "tests" / "data" / "interference"
CASES = ROOT / "benchmarks" / "results" / "rebalance.json"
RESULT = ROOT / "benchmarks" / "results" / "model_form.json"
FORMS = ("additive", "multiplicative", "linearized")
LINEARIZATIONS = 4


def form_shares(truth: GroundTruth, workloads: list[str], nodes: int, cores: int, threads: int) -> dict:
    """Per form: the truth's share of the optimum at that form's best layout."""
    groups = every_layout(len(workloads), 1, nodes, cores, threads)
    topology = uniform_topology(nodes=nodes, cores_per_node=cores, threads_per_core=threads)
    n_cores = nodes * cores
    cpu_of = np.array([[[t * n_cores + n * cores + c for t in range(threads)] for c in range(cores)]
                       for n in range(nodes)])
    dist = distance_matrix(topology, np.array(sorted(topology.cpus)))
    kind = truth.indices(workloads)
    cpu = cpu_of[groups[:, :, 1], groups[:, :, 2], groups[:, :, 3]]  # [layout, vm]
    share = 1.0 / (cpu[:, :, None] == cpu[:, None, :]).sum(axis=2)  # one-vCPU guests, full load
    neighbour = cpu[:, :, None] != cpu[:, None, :]
    loss = truth.tensor[dist[cpu[:, :, None], cpu[:, None, :]], kind[None, None, :], kind[None, :, None]]
    exposed = np.where(neighbour, share[:, None, :], 0.0)  # [layout, x, y]: g_y where y is x's neighbour
    true = (share * np.where(neighbour, np.clip(1 - loss * share[:, None, :], 0, None), 1).prod(axis=2)).mean(1)
    gamma = -np.log(np.clip(1 - loss, 1e-3, None))
    log_loss = (gamma * exposed).sum(axis=2)  # [layout, x]: Σ γ·g
    scores = {
        "additive": (share * np.clip(1 - (loss * exposed).sum(axis=2), 0, None)).mean(1),
        "multiplicative": (share * np.exp(-log_loss)).mean(1),
    }
    optimum = float(true.max())
    result = {"optimum": round(optimum, 4), "layouts": int(len(groups))}
    for form, score in scores.items():
        result[form] = round(float(true[int(np.argmax(score))]) / optimum, 4)
    row = int(np.argmax((share * (1 - log_loss)).mean(1)))
    best = float(true[row])
    for _ in range(LINEARIZATIONS):
        weight = np.exp(-log_loss[row])  # each guest's remaining speed at the layout before
        row_next = int(np.argmax((share * weight[None, :] * (1 - (log_loss - log_loss[row][None, :]))).mean(1)))
        best = max(best, float(true[row_next]))
        if row_next == row:
            break
        row = row_next
    result["linearized"] = round(best / optimum, 4)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    committed = json.loads(CASES.read_text())["cases"]
    tables: dict[str, GroundTruth] = {}
    seen, rows = set(), []
    for case in committed:
        shape = case["host_shape"]
        key = (case["matrix"], case["shape"], case["seed"])
        if case["hosts"] != 1 or key in seen:
            continue  # the starts of one case share its workloads
        seen.add(key)
        if case["matrix"] not in tables:
            path = DATA / case["matrix"]
            tables[case["matrix"]] = GroundTruth(parse_pairs(path.read_text(), path.name))
        names = sorted(case["workloads"])
        shares = form_shares(tables[case["matrix"]], [case["workloads"][n] for n in names],
                             shape["nodes"], shape["cores_per_node"], shape["threads_per_core"])
        rows.append({"matrix": case["matrix"], "shape": case["shape"], "seed": case["seed"], **shares})
        print(f"{case['matrix'][:10]:10s} {case['shape'][:52]:52s} s{case['seed']} "
              + " ".join(f"{form} {shares[form]:.4f}" for form in FORMS), flush=True)
    summary = {form: {"mean_share": round(float(np.mean([r[form] for r in rows])), 4),
                      "min_share": min(r[form] for r in rows),
                      "below_99pct": sum(1 for r in rows if r[form] < 0.99),
                      "at_optimum": sum(1 for r in rows if r[form] >= 0.9995)} for form in FORMS}
    result = {"machine": host_facts.summary(), "cases": len(rows), "summary": summary, "rows": rows,
              "total_s": round(time.perf_counter() - started, 1)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
