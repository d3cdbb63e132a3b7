"""Ablation of the rebalancing policy: each stage and knob off in turn, on cases the tuning
looked at and on cases it never looked at, to decide which earn their place.

    python benchmarks/rebalance_ablation.py [--variant LABEL ...] [--part-out part.json]
    python benchmarks/rebalance_ablation.py --parts-from part1.json --parts-from ... \
        [--out benchmarks/results/rebalance_ablation.json]

Cases (benchmarks/rebalance.py's case runner, the shipped Profiler on the simulated hosts):
two pair matrices × four host shapes × both starts, RUNS rebalancing runs each. The "tuned"
split is seed 0 — the seed every earlier tuning of the policy was measured on (rebalance.json
holds seeds 0–2) — and the "held_out" split is seed 3, which no tuning ever ran.

A variant is the product's defaults with one override (VARIANTS: the stage or knob it turns
off, and how). For each split: mean performance (mean fraction of isolated performance over
all VMs, from the simulator's noise-free truth), the worst-off guest's performance averaged
over the cases, mean and worst share of the optimum, cases
at ≥ 99 % of it, actions and trials; and the change against the defaults in points of mean performance.
A stage or knob whose removal changes both the mean and the worst-off guest by less than
`NEGLIGIBLE_POINTS` on both splits is a candidate for removal (the full benchmark decides); one
whose removal costs more on either earns its place.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import rebalance as bench  # noqa: E402  (benchmarks/rebalance.py: the case runner)

RUNS = 5  # rebalancing runs before a case is scored (the benchmark's checkpoint)
NEGLIGIBLE_POINTS = 0.1  # below this change of mean performance (points) on both splits, a removal is free
MATRICES = ("e7600_2core_pairs.csv", "amdfx8120_sibling_pairs.csv")
SHAPE_LABELS = (
    "1 host, 4 cores x 2 threads, 4 VMs",
    "2 hosts, 2 cores x 2 threads, 4 VMs",
    bench.FULL_HOST,
    bench.FULL_HOST + ", hungry + compute",
)
SPLITS = {"tuned": 0, "held_out": 3}  # split -> its seed
# (label, the stage or knob it removes, overrides of the product's defaults)
VARIANTS: tuple[tuple[str, str, dict[str, float | bool]], ...] = (
    ("defaults", "nothing: the product as shipped", {}),
    ("no exact solver", "stage exact (exact.max_cpus 0)", {"exact_max_cpus": 0}),
    ("no pessimistic check", "stage pessimistic check (pessimistic.pessimism 0)", {"pessimism": 0.0}),
    ("no exploration", "stages explore and optimistic groups (trials.exploration 0)", {"exploration": 0.0}),
    ("no trials", "every trial stage (trials.enabled false)", {"trials": False}),
    ("no recheck", "knob trials.recheck (0)", {"trial_recheck": 0.0}),
    ("no refuted bar", "knob trials.refuted_bar (0)", {"trial_refuted_bar": 0.0}),
    ("no per-guest hysteresis", "knob hysteresis.min_gain_share (0)", {"min_gain_share": 0.0}),
    ("guesses count fully", "knob pessimistic.guess_weight (1: unidentified changes count in full)",
     {"guess_weight": 1.0}),
    ("no fairness", "knob objective.fairness (0)", {"fairness": 0.0}),
)


def _shapes() -> list:
    return [s for s in bench.SHAPES if s[0] in SHAPE_LABELS]


def run_variant(label: str, overrides: dict[str, float | bool]) -> dict[str, list[dict]]:
    """The variant's case rows per split."""
    rows: dict[str, list[dict]] = {}
    for split, seed in SPLITS.items():
        print(f"--- {label}: {split} (seed {seed})", flush=True)
        rows[split] = bench.run_cases(1, _shapes(), set(MATRICES), overrides, RUNS, (RUNS,), None, first_seed=seed)
    return rows


def split_summary(rows: list[dict]) -> dict:
    shares = [r["share_of_optimum"]["vmplacer"] for r in rows if r["share_of_optimum"] is not None]
    return {
        "cases": len(rows),
        "mean_performance": round(statistics.mean(r["vmplacer"] for r in rows), 5),
        # the worst-off guest of each case, averaged: what `fairness` and the floors are for
        "worst_guest_mean": round(statistics.mean(r["min_vm"]["vmplacer"] for r in rows), 5),
        "share_of_optimum_mean": round(statistics.mean(shares), 5) if shares else None,
        "share_of_optimum_min": round(min(shares), 5) if shares else None,
        "cases_ge_99pct_optimum": sum(1 for x in shares if x >= bench.OPTIMUM_SHARE_TARGET),
        "actions": sum(int(r["actions"]["vmplacer"]) for r in rows),
        "trials_kept": sum(int((r.get("trials") or {}).get("kept", 0)) for r in rows),
        "trials_undone": sum(int((r.get("trials") or {}).get("undone", 0)) for r in rows),
        "seconds": round(sum(r["seconds"] for r in rows), 1),
    }


def compact(row: dict) -> dict:
    """A case row reduced to what the table is made of (the full rows are rebalance.py's)."""
    return {"matrix": row["matrix"], "shape": row["shape"], "start": row["start"], "seed": row["seed"],
            "vmplacer": row["vmplacer"], "optimum": row["optimum"],
            "share_of_optimum": None if row["share_of_optimum"] is None else row["share_of_optimum"]["vmplacer"],
            "worst_guest": row["min_vm"]["vmplacer"], "actions": row["actions"]["vmplacer"],
            "trials": row.get("trials"), "seconds": row["seconds"]}


def table(parts: dict[str, dict]) -> list[dict]:
    """One row per variant: its summary per split and its change against the defaults in points."""
    base = parts["defaults"]["summary"]
    out = []
    for label, what, overrides in VARIANTS:
        if label not in parts:
            continue
        summary = parts[label]["summary"]
        delta = {split: round(100 * (summary[split]["mean_performance"] - base[split]["mean_performance"]), 3)
                 for split in SPLITS}
        worst = {split: round(100 * (summary[split]["worst_guest_mean"] - base[split]["worst_guest_mean"]), 3)
                 for split in SPLITS}
        out.append({"variant": label, "removes": what, "overrides": overrides, "splits": summary,
                    "change_points": delta, "worst_guest_change_points": worst,
                    "negligible": label != "defaults" and all(abs(d) < NEGLIGIBLE_POINTS
                                                              for d in [*delta.values(), *worst.values()])})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", help="only this variant (a label; repeatable)")
    parser.add_argument("--part-out", help="write this run's variants to this file (a part run in parallel)")
    parser.add_argument("--parts-from", action="append", help="merge these --part-out files instead of running")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rebalance_ablation.json"))
    args = parser.parse_args(argv)
    known = {label for label, _, _ in VARIANTS}
    unknown = sorted(set(args.variant or ()) - known)
    if unknown:
        parser.error(f"--variant: unknown {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    began = time.perf_counter()
    load_before = os.getloadavg()
    parts: dict[str, dict] = {}
    loads: list[dict] = []
    if args.parts_from:
        for path in args.parts_from:
            part_file = json.loads(Path(path).read_text())
            parts.update(part_file["variants"])
            loads.append({"variants": sorted(part_file["variants"]), "seconds": part_file.get("seconds"),
                          "load_average": part_file.get("load_average")})
        for part in parts.values():  # summaries from the rows, so a merge sees every current measure
            part["summary"] = {s: split_summary(r) for s, r in part["rows"].items()}
    else:
        for label, _, overrides in VARIANTS:
            if args.variant and label not in args.variant:
                continue
            rows = run_variant(label, overrides)
            parts[label] = {"rows": rows, "summary": {s: split_summary(r) for s, r in rows.items()}}
    load = {"start": [round(x, 2) for x in load_before], "end": [round(x, 2) for x in os.getloadavg()]}
    if args.part_out:
        Path(args.part_out).write_text(json.dumps({"variants": parts, "load_average": load,
                                                   "seconds": round(time.perf_counter() - began, 1)}) + "\n")
        return 0
    if "defaults" not in parts:
        raise SystemExit("the defaults' run is needed to compare against (variant 'defaults')")
    result = {
        "machine": bench.machine(),
        "what_was_run": (f"{len(MATRICES)} matrices × {len(SHAPE_LABELS)} shapes × 2 starts, {RUNS} runs each; "
                         f"splits {SPLITS} (split -> seed); the shipped Profiler on the simulated hosts"),
        "negligible_points": NEGLIGIBLE_POINTS,
        # parts run side by side (1, 5 and 15 min load averages at start and end; the machine is shared)
        "parts": loads or [{"variants": sorted(parts), "seconds": round(time.perf_counter() - began, 1),
                            "load_average": load}],
        "table": table(parts),
        "rows": {label: {split: [compact(r) for r in rows] for split, rows in part["rows"].items()}
                 for label, part in parts.items()},
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for row in result["table"]:
        print(f"{row['variant']:26s} tuned {row['splits']['tuned']['mean_performance']:.4f} "
              f"({row['change_points']['tuned']:+.3f}) held-out {row['splits']['held_out']['mean_performance']:.4f} "
              f"({row['change_points']['held_out']:+.3f}) worst guest {row['worst_guest_change_points']['tuned']:+.3f} "
              f"{row['worst_guest_change_points']['held_out']:+.3f} "
              f"≥99%: {row['splits']['tuned']['cases_ge_99pct_optimum']}+{row['splits']['held_out']['cases_ge_99pct_optimum']}"
              f"{'  negligible' if row['negligible'] else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
