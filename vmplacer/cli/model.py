"""`vmplacer model show|learn`: the interference model learned from Freeze'nSense samples."""

from __future__ import annotations

import argparse

from vmplacer.cli.common import CliContext, UsageError, add_format_argument, emit, print_table

MODEL_COLUMNS = ("model key", "sensitivity (mean loss suffered)", "interference (mean loss caused)")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="the interference model learned from profiles")
    actions = parser.add_subparsers(dest="model_action", metavar="ACTION", required=True, help="show or learn")
    show = actions.add_parser("show", help="what the model knows: per-guest sensitivity and interference")
    add_format_argument(show, columns=MODEL_COLUMNS)
    show.set_defaults(func=run_show)
    learn = actions.add_parser("learn", help="learn from stored profile runs not learned yet, each guest under its "
                                             "`workload` label (else its name), as the rebalancer plans it")
    learn.add_argument("--run", type=int, action="append", metavar="ID",
                       help="only this profile run (repeatable; default: every run not yet learned)")
    add_format_argument(learn)
    learn.set_defaults(func=run_learn)


def run_show(args: argparse.Namespace, ctx: CliContext) -> int:
    container = ctx.container
    container.upgrade_database()
    model = container.load_model()
    info = container.model_repository.info() or {"name": "default", "observations": 0, "last_run_id": None}
    keys = model.known_keys() if model.observations else ()
    data = {
        **info,
        "guests": [
            {"guest": key, "sensitivity": round(model.sensitivity(key), 5),
             "interference": round(model.interference(key), 5)}
            for key in keys
        ],
    }

    def table(d: dict) -> None:
        print(f"model {d['name']}: {d['observations']} observations, last profile run {d['last_run_id']}")
        if not d["guests"]:
            print("no samples learned yet: predictions are the linear (time-sharing only) predictor")
            return
        print_table(None, MODEL_COLUMNS,
                    [(g["guest"], f"{g['sensitivity']:.3f}", f"{g['interference']:.3f}") for g in d["guests"]])

    emit(args, data, table)
    return 0


def run_learn(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.app.learn.online import learn_from_runs
    from vmplacer.bootstrap.learning import guest_identities

    container = ctx.container
    container.upgrade_database()
    store = container.profile_store
    runs = store.finished_run_ids()
    known = set(runs)
    if args.run:
        missing = sorted(set(args.run) - known)
        if missing:
            raise UsageError(f"--run: no finished profile run {', '.join(map(str, missing))}")
        runs = sorted(set(args.run))
    # sampled guests learned under the key and class the rebalancer plans them by (their labels)
    report = learn_from_runs(runs, store, container.model_repository, identify=guest_identities(container))
    emit(args, report.to_dict(), lambda d: print(
        f"learned {d['observations']} observations from runs {d['runs'] or 'none'}; "
        f"model holds {d['total_observations']}; skipped {d['skipped'] or 'nothing'}"))
    return 0
