"""`vmplacer eval model|rank`: how good is the interference model, on data we have.

`eval model` profiles random placements on simulated hosts with Freeze'nSense,
fits the model and scores it on held-out placements against the linear
predictor (relative RMSE, seed eq. 3.6). `eval rank` predicts each workload's
sensitivity and interference from isolated counter profiles, leaving that
workload out, and reports Spearman's correlation.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vmplacer.cli.common import CliContext, UsageError, add_format_argument, emit, print_table
from vmplacer.core.model.pairs import PairFileError, PairTable, parse_distance, parse_pairs
from vmplacer.core.model.counter_profiles import Profiles, parse_profiles
from vmplacer.core.model.ranking import rank_workloads
from vmplacer.core.text import plural

# each action's one table, which --columns selects from (`eval rebalance`'s verdict line stays)
MODEL_EVAL_COLUMNS = ("measure", "value")
RANK_COLUMNS = ("score", "Spearman", "counters chosen (folds)")
REBALANCE_EVAL_COLUMNS = ("policy", "mean perf", "worst VM", "actions")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="evaluate the interference model on measured pair data")
    commands = parser.add_subparsers(dest="eval_command", metavar="WHAT", help="model, rebalance or rank")
    parser.set_defaults(func=_missing_subcommand(parser))

    model = commands.add_parser("model", help="fit on profiled random placements, score held-out ones")
    model.add_argument("--pairs", required=True, metavar="FILE", help="pair matrix or long pair list (CSV)")
    model.add_argument("--cores", type=int, default=8, help="simulated host size: 2, 8 or 16 cores (default 8)")
    model.add_argument("--vms-per-core", default="1-3", metavar="N|A-B",
                       help="one-vCPU VMs per core, drawn per placement from A..B (default 1-3)")
    model.add_argument("--trials", type=int, default=50,
                       help="random placements profiled for training, and as many held out (default 50)")
    model.add_argument("--rounds", type=int, default=3,
                       help="Freeze'nSense rounds per training host (default 3)")
    model.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    model.add_argument("--noise", type=float, default=0.03,
                       help="multiplicative noise of each simulated sample, σ (default 0.03)")
    model.add_argument("--distance-factor", action="append", default=[], metavar="CLASS=F",
                       help="simulator's loss scale at a distance class, e.g. remote-node=0.3 (repeatable)")
    add_format_argument(model, columns=MODEL_EVAL_COLUMNS)
    model.set_defaults(func=run_model)

    rebalance = commands.add_parser(
        "rebalance", help="one rebalancing case on simulated hosts: vmplacer vs no action, the seed's "
                          "relocation, blind spreading and the optimum")
    rebalance.add_argument("--pairs", required=True, metavar="FILE", help="pair matrix or long pair list (CSV)")
    rebalance.add_argument("--seed", type=int, default=0, help="random seed: workloads and placement (default 0)")
    rebalance.add_argument("--start", choices=("siblings", "random"), default="siblings",
                           help="VMs packed on SMT siblings of the first host (the seed's worst case), or random")
    rebalance.add_argument("--hosts", type=int, default=1, help="simulated hosts (default 1)")
    rebalance.add_argument("--vms", type=int, default=4, help="one-vCPU VMs (default 4)")
    rebalance.add_argument("--shape", default="1x4x2", metavar="NODESxCORESxTHREADS",
                           help="each host: NUMA nodes x cores per node x threads per core (default 1x4x2)")
    rebalance.add_argument("--rounds", type=int, default=5,
                           help="rebalancing runs (profile, learn, plan, apply) for vmplacer (default 5)")
    rebalance.add_argument("--noise", type=float, default=0.03, help="σ of each simulated sample (default 0.03)")
    rebalance.add_argument("--mix", choices=("any", "hungry-compute"), default="any",
                           help="workloads drawn from the whole matrix, or alternately from its most and least "
                                "interfering halves (default any)")
    add_format_argument(rebalance, columns=REBALANCE_EVAL_COLUMNS)
    rebalance.set_defaults(func=run_rebalance)

    rank = commands.add_parser("rank", help="predict sensitivity/interference ranks from counter profiles")
    rank.add_argument("--pairs", required=True, metavar="FILE", help="pair matrix or long pair list (CSV)")
    rank.add_argument("--profiles", required=True, metavar="FILE", help="workload,event,value counts (CSV)")
    rank.add_argument("--top-k", type=int, default=2, help="counters used per prediction (default 2)")
    add_format_argument(rank, columns=RANK_COLUMNS)
    rank.set_defaults(func=run_rank)


def _missing_subcommand(parser: argparse.ArgumentParser):
    def run(args: argparse.Namespace, ctx: CliContext) -> int:
        parser.print_help()
        return 2

    return run


def _read(path: str, option: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{option} {path}: not a text file") from None


def load_pairs(path: str) -> PairTable:
    try:
        return parse_pairs(_read(path, "--pairs"), source=path)
    except PairFileError as exc:
        raise UsageError(f"--pairs {exc}") from None


def load_profiles(path: str) -> Profiles:
    try:
        return parse_profiles(_read(path, "--profiles"), source=path)
    except PairFileError as exc:
        raise UsageError(f"--profiles {exc}") from None


def run_model(args: argparse.Namespace, ctx: CliContext) -> int:
    # the simulator is this command's only host: built here, like a composition root would
    from vmplacer.lab.simulator import GroundTruth, SimCluster
    from vmplacer.lab.evaluate import ProfileSettings, evaluate_model, parse_range

    if args.cores < 2:
        raise UsageError(f"--cores must be >= 2, got {args.cores}")
    if args.trials < 1:
        raise UsageError(f"--trials must be >= 1, got {args.trials}")
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    if not args.noise >= 0:
        raise UsageError(f"--noise must be >= 0, got {args.noise}")
    try:
        vms_per_core = parse_range(args.vms_per_core, "--vms-per-core")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    factors = {}
    for item in args.distance_factor:
        name, sep, value = item.partition("=")
        try:
            distance = parse_distance(name) if sep else None
            factor = float(value)
        except ValueError as exc:
            raise UsageError(f"--distance-factor {item!r}: {exc}") from None
        if distance is None or not factor >= 0:
            raise UsageError(f"--distance-factor {item!r}: expected CLASS=FACTOR with a distance class "
                             "and a factor >= 0")
        factors[distance] = factor
    table = load_pairs(args.pairs)
    try:
        truth = GroundTruth(table, factors)
    except ValueError as exc:
        raise UsageError(f"--distance-factor: {exc}") from None
    cluster = SimCluster(truth, seed=args.seed, noise=args.noise)
    evaluation = evaluate_model(
        cluster, table, cores=args.cores, vms_per_core=vms_per_core, trials=args.trials, seed=args.seed,
        settings=ProfileSettings(rounds=args.rounds),
    )
    data = evaluation.to_dict()
    data["matrix"] = Path(table.source).name
    data.update({
        "seed": args.seed,
        "rounds": args.rounds,
        "noise": args.noise,
        "distance_factors": {cls.value: value for cls, value in truth.factors.items()},
        "truth": "noise-free simulator performance",
    })
    emit(args, data, _render_model)
    return 0


def _render_model(data: dict) -> None:
    rows = [
        ("matrix", data["matrix"]),
        ("host", f"{data['cores']} cores, {data['vms_per_core']} VMs per core"),
        ("trials", f"{data['trials']} profiled + {data['trials']} held out"),
        ("observations", data["observations"]),
        ("predictions", data["predictions"]),
        ("model R_rmse", data["model_rrmse"]),
        ("linear R_rmse", data["linear_rrmse"]),
        ("mean confidence", data["mean_confidence"]),
    ]
    print_table("interference model on held-out placements", MODEL_EVAL_COLUMNS, rows)


def run_rank(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.top_k < 1:
        raise UsageError(f"--top-k must be >= 1, got {args.top_k}")
    table = load_pairs(args.pairs)
    profiles = load_profiles(args.profiles)
    try:
        result = rank_workloads(table, profiles, top_k=args.top_k)
    except ValueError as exc:
        raise UsageError(f"--profiles {exc}") from None
    data = {"matrix": Path(table.source).name, "profiles": Path(profiles.source).name, **result.to_dict()}
    emit(args, data, _render_rank)
    return 0


def _render_rank(data: dict) -> None:
    rows = []
    for target in ("sensitivity", "interference"):
        part = data[target]
        counters = ", ".join(f"{c['event']} ({c['chosen_in']}/{len(data['workloads'])})" for c in part["counters"])
        rows.append((target, part["spearman"], counters))
    print_table(f"leave-one-workload-out ranking: {data['matrix']} with {data['profiles']}",
                RANK_COLUMNS, rows)


def run_rebalance(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.lab.rebalance_eval import Case, HostShape, evaluate_case

    try:
        nodes, cores, threads = (int(part) for part in args.shape.lower().split("x"))
        shape = HostShape(nodes, cores, threads)
    except ValueError:
        raise UsageError(f"--shape: expected NODESxCORESxTHREADS like 1x4x2, got {args.shape!r}") from None
    if min(nodes, cores, threads) < 1:
        raise UsageError(f"--shape: every part must be >= 1, got {args.shape!r}")
    for option, value, low in (("--hosts", args.hosts, 1), ("--vms", args.vms, 1), ("--rounds", args.rounds, 1)):
        if value < low:
            raise UsageError(f"{option} must be >= {low}, got {value}")
    if not args.noise >= 0:
        raise UsageError(f"--noise must be >= 0, got {args.noise}")
    if args.start == "siblings" and args.vms > shape.pcpus:
        raise UsageError(f"--vms {args.vms}: the siblings start packs every VM on the first host, "
                         f"which has {shape.pcpus} pCPUs")
    from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver
    from vmplacer.lab.simulator import GroundTruth, SimCluster  # this command's only hosts
    from vmplacer.lab.optimum import case_optimum
    from vmplacer.core.rebalance.state import RebalanceSettings

    table = load_pairs(args.pairs)
    row = evaluate_case(table, Case(args.start, args.hosts, args.vms, shape, args.seed, args.mix),
                        simulator=lambda truth, seed, noise: SimCluster(truth, seed=seed, noise=noise),
                        matrix=Path(table.source).name, rounds=args.rounds, noise=args.noise,
                        solver=CpSatLayoutSolver(),
                        best=lambda truth, case, start: case_optimum(
                            GroundTruth(truth), start.workloads, hosts=case.hosts, nodes=case.shape.nodes,
                            cores=case.shape.cores_per_node, threads=case.shape.threads_per_core),
                        best_objective=lambda truth, case, start: case_optimum(
                            GroundTruth(truth), start.workloads, hosts=case.hosts, nodes=case.shape.nodes,
                            cores=case.shape.cores_per_node, threads=case.shape.threads_per_core,
                            fairness=RebalanceSettings().fairness))
    emit(args, row, _render_rebalance)
    return 0


def _render_rebalance(row: dict) -> None:
    policies = ("none", "seed_policy", "blind_spread", "vmplacer", "optimum")
    print_table(
        f"{row['matrix']}: {plural(row['vms'], 'VM')} on {plural(row['hosts'], 'host')}, "
        f"start {row['start']}, seed {row['seed']}",
        REBALANCE_EVAL_COLUMNS,
        [(p, "-" if row[p] is None else f"{row[p]:.4f}",
          "-" if row["min_vm"][p] is None else f"{row['min_vm'][p]:.4f}", row["actions"].get(p, "-"))
         for p in policies])
    best = row.get("objective_optimum")
    if best:
        from vmplacer.lab.verdicts import perfect_model_moves

        step = best["step"]
        verdict = ("vmplacer is there" if step["true_gain"] <= 1e-9 else
                   f"threshold {step['threshold']:g}: "
                   + ("worth taking, the model missed it" if perfect_model_moves(step) else "a perfect model stops too"))
        print(f"vmplacer's own objective (fairness {best['fairness']:g}) per VM: {best['vmplacer_objective_per_vm']:.4f}, "
              f"its optimum {best['objective_per_vm']:.4f}; the step there gains {step['true_gain']:+.4f} ({verdict})")
