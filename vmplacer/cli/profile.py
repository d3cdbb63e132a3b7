"""`vmplacer profile`: Freeze'nSense on one host, and the stored results.

    vmplacer profile run [VM ...] [--host H] [--tm 10ms] [--tsleep 1s] [--samples N]
                         [--metric ipc|cpu|probe] [--duration 60s] [--max-freeze 500ms]
    vmplacer profile show VM [VM ...] [--run ID] [--format json] [--plot FILE.png]
    vmplacer profile replay [--host H]

`run` may still be left out (`vmplacer profile VM ...`) this release, with a deprecation line on
stderr; a VM named like an action is
profiled with `run` in front (`vmplacer profile run show`).

Profiling first replays the freeze journal (resuming whatever a killed
profiler left paused), then samples until every sensitive VM has N ζ and N ζb
samples (or --duration passes), with a live progress bar on stderr, and
stores the run. `show` recomputes the distributions from the stored samples.

Durations take a unit (500us, 10ms, 2.5s, 10m, 1h); a bare number is seconds for --tsleep and
--duration and refused for the freeze lengths --tm and --max-freeze (it meant ms there once).
An option the chosen mode does not read (`show --tm`, `replay --samples`) exits 2.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from vmplacer.cli.common import (
    CliContext,
    DatabaseError,
    OperationalError,
    UsageError,
    add_format_argument,
    add_host_selection,
    count,
    duration,
    emit,
    print_table,
    refuse_options,
    resolve_host,
    select_columns,
)
from vmplacer.cli.verbs import no_more_words, split_verb, words_anywhere

_PLOT_SUFFIXES = (".png", ".svg", ".pdf")
DEFAULT_SAMPLES = 20  # when neither --samples nor --duration says when to stop
VERBS = ("run", "show", "replay")
# the main table of each action (--columns selects from it); `replay` prints no table to choose from
RESULT_COLUMNS = ("VM", "sensitive", "ζ p50", "ζb p50", "degradation [95% CI]", "n ζ/ζb", "dropped")
SHOW_COLUMNS = ("VM", "series", "p10", "p25", "p50", "p75", "p90", "mean ± 95% CI", "n")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="measure interference with Freeze'nSense (run), print stored results (show VM...)",
        description=(
            "`run`: profile VMs on one host: for each sensitive VM, suspend every other running domain "
            "for t_m, sample the VM alone (ζb), resume; sample every VM without freezing (ζ); "
            "sleep t_sleep. `show VM...` prints the stored distributions, "
            "`replay` resumes domains a killed profiler left paused. `run` may still be left out "
            "(`vmplacer profile VM...`, deprecated); a VM named `run`, `show` or `replay` is profiled with "
            "`vmplacer profile run NAME`."
        ),
        usage=(
            "vmplacer profile run [VM ...] [--host H] [--tm 10ms]\n"
            "                            [--tsleep 1s] [--samples N]\n"
            "                            [--metric ipc|cpu|probe] [options]\n"
            "       vmplacer profile show VM [VM ...] [--run ID] [--format json]\n"
            "                             [--plot FILE.png]\n"
            "       vmplacer profile replay [--host H]"
        ),
    )
    parser.add_argument("vms", nargs="*", metavar="[run|show|replay] VM",
                        help="the action (default run), then its VMs: run: the VMs to profile (default: every "
                             "running VM in scope); show: the VMs whose stored results to print; replay: none")
    add_host_selection(parser, default="first", verb="profile on",
                       repeatable=False, all_hosts=False, default_note="`profile replay`: every configured host")
    parser.add_argument("--tm", type=duration(unit=None), metavar="DURATION",
                        help="freeze/sample length t_m with its unit, e.g. 10ms (a bare number is refused; "
                             "default: profiler.t_m_ms)")
    parser.add_argument("--tsleep", type=duration(zero="no pause"), metavar="DURATION",
                        help="time between rounds t_sleep, e.g. 1s (default: profiler.t_sleep_s)")
    parser.add_argument("--max-freeze", dest="max_freeze", type=duration(unit=None), metavar="DURATION",
                        help="hard cap on one freeze with its unit, e.g. 500ms (a bare number is refused; "
                             "default: profiler.max_freeze_ms)")
    parser.add_argument("--samples", type=count(1), metavar="N",
                        help=f"stop after N valid ζ and ζb samples per sensitive VM (default {DEFAULT_SAMPLES} "
                             "unless --duration is given)")
    parser.add_argument("--duration", type=duration(), metavar="DURATION", help="stop after this long, e.g. 60s")
    parser.add_argument("--metric", choices=("ipc", "cpu", "probe"),
                        help="sampler (default: the host's `sampler` setting; auto = ipc with counters, else cpu)")
    parser.add_argument("--sensitive",
                        help="which VMs get ζb: all, label:KEY=VALUE or class:NAME (default: profiler.sensitive, all)")
    parser.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                        help="never freeze domains matching this glob (repeatable; adds to profiler.excluded_domains)")
    parser.add_argument("--scope", action="append", default=[], metavar="PATTERN",
                        help="consider only domains matching this glob (repeatable; default: profiler.scope, all)")
    parser.add_argument("--pair-probes", dest="pair_probes", type=count(0), metavar="N",
                        help="pair probes per round: all but a VM and one neighbour frozen, both sampled "
                             "(default: profiler.pair_probes; 0: none)")
    parser.add_argument("--adaptive", action="store_true",
                        help="shorter, more frequent freezes for stable VMs, longer ones for noisy VMs")
    parser.add_argument("--probe", action="append", default=[], metavar="VM=SOURCE",
                        help="probe metric source: VM=cmd:COMMAND ARGS, VM=http://URL or VM=console:FILE")
    parser.add_argument("--probe-kind", choices=("counter", "gauge"), default="counter",
                        help="probe values are a growing counter (rate over the window) or a gauge")
    parser.add_argument("--no-progress", action="store_true", help="no live progress bar")
    parser.add_argument("--run", type=count(1), metavar="ID",
                        help="show: this run id (default: the newest run with the VMs)")
    parser.add_argument("--plot", metavar="FILE", help="show: draw ζ vs ζb box plots per VM into FILE.png")
    add_format_argument(parser, tables={"run": RESULT_COLUMNS, "show": SHOW_COLUMNS}, command="profile")
    parser.set_defaults(func=run)
    words_anywhere(parser, "vms", VERBS)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    verb, args.vms = split_verb("profile", args.vms, VERBS, bare="run", other="run")
    select_columns(args, verb)
    if verb == "show":
        return run_show(args, ctx, args.vms)
    if verb == "replay":
        return run_replay(args, ctx)
    return run_profile(args, ctx)


# ----- options ------------------------------------------------------------------------------


def _only_for(args: argparse.Namespace, mode: str, names: tuple[str, ...]) -> None:
    refuse_options(args, names, f"not used by `vmplacer profile{' ' + mode if mode else ''}`")


def _probes(specs: list[str]) -> dict[str, Any]:
    from vmplacer.adapters.samplers import CommandProbe, ConsoleCounterProbe, HttpProbe

    probes: dict[str, Any] = {}
    for spec in specs:
        vm, sep, source = spec.partition("=")
        if not sep or not vm or not source:
            raise UsageError(f"--probe: {spec!r} must be VM=cmd:COMMAND, VM=http://URL or VM=console:FILE")
        if source.startswith("cmd:"):
            argv = shlex.split(source[4:])
            if not argv:
                raise UsageError(f"--probe: VM {vm}: empty command")
            probes[vm] = CommandProbe(tuple(argv))
        elif source.startswith(("http://", "https://")):
            probes[vm] = HttpProbe(source)
        elif source.startswith("console:"):
            probes[vm] = ConsoleCounterProbe(Path(source[8:]))
        else:
            raise UsageError(f"--probe: VM {vm}: source {source!r} must start with cmd:, http(s):// or console:")
    return probes


def build_config(args: argparse.Namespace, settings: Any) -> Any:
    """ProfilerConfig from options and settings; bad values exit 2 naming the option."""
    from vmplacer.bootstrap.profiler_config import SensitiveSpecError, profiler_config

    defaults = settings.profiler
    # durations and counts arrive parsed and in range (their argparse types): seconds here
    t_m = args.tm if args.tm is not None else defaults.t_m_ms / 1e3
    t_sleep = args.tsleep if args.tsleep is not None else defaults.t_sleep_s
    max_freeze = args.max_freeze if args.max_freeze is not None else defaults.max_freeze_ms / 1e3
    duration = args.duration
    if t_m >= max_freeze:
        raise UsageError(f"--tm: {t_m * 1e3:g} ms must be shorter than the freeze cap of {max_freeze * 1e3:g} ms "
                         "(--max-freeze / profiler.max_freeze_ms)")
    samples = args.samples if args.samples is not None or duration is not None else DEFAULT_SAMPLES
    try:
        return profiler_config(
            defaults, t_m_s=t_m, t_sleep_s=t_sleep, max_freeze_s=max_freeze, sensitive=args.sensitive,
            vms=args.vms, exclude=args.exclude, scope=args.scope, samples=samples, duration_s=duration,
            adaptive=args.adaptive, pair_probes=args.pair_probes,
        )
    except SensitiveSpecError as exc:
        raise UsageError(f"--sensitive: {exc}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# ----- profile ---------------------------------------------------------------------------------


def _replay(ctx: CliContext, host: str | None) -> Any:
    """Replay the journal, creating the schema on a fresh database first."""
    from sqlalchemy.exc import SQLAlchemyError

    from vmplacer.bootstrap.profiler import replay_freeze_journal

    report = replay_freeze_journal(ctx.container, host)
    if report.errors and any("freeze journal unreadable" in e for e in report.errors):
        try:
            ctx.container.upgrade_database()
        except SQLAlchemyError as exc:
            raise DatabaseError(exc, "cannot create the schema") from None
        report = replay_freeze_journal(ctx.container, host)
        unreadable = [e for e in report.errors if "freeze journal unreadable" in e]
        if unreadable:
            raise OperationalError(unreadable[0])
    return report


def run_profile(args: argparse.Namespace, ctx: CliContext) -> int:
    _only_for(args, "", ("run", "plot"))
    config = build_config(args, ctx.settings)
    probes = _probes(args.probe)
    metric = args.metric
    if probes and metric not in (None, "probe"):
        raise UsageError(f"--probe: given with --metric {metric}; probes are the `probe` metric")
    if probes:
        metric = "probe"
    else:
        refuse_options(args, ("probe_kind",), "only with --probe (it says how probe values are read)")
    host_name = resolve_host(ctx, args.host)

    from vmplacer.app.observe.profiler import ProfilerError
    from vmplacer.bootstrap.profiler import build_profiler
    from vmplacer.ports import HypervisorError

    replay = _replay(ctx, host_name)
    for host, domain in replay.resumed:
        sys.stderr.write(f"vmplacer: resumed {domain} on {host}, left paused by an interrupted freeze\n")
    progress = _ProgressBar(config.samples, enabled=not args.no_progress)
    try:
        profiler, freezer = build_profiler(ctx.container, host_name, config, metric=metric, probes=probes,
                                           probe_kind=args.probe_kind, on_progress=progress.update)
    except HypervisorError as exc:
        raise OperationalError(str(exc)) from None
    try:
        with progress:
            result = profiler.run()
    except ProfilerError as exc:
        if exc.bad_input:
            raise UsageError(str(exc)) from None
        raise OperationalError(str(exc)) from None
    except HypervisorError as exc:
        raise OperationalError(str(exc)) from None
    finally:
        freezer.close()
    emit(args, result.to_dict(), print_result)
    return 0


class _ProgressBar:
    """A rich progress bar per sensitive VM on stderr (nothing when not a terminal)."""

    def __init__(self, target: int | None, enabled: bool):
        self.target = target
        self.enabled = enabled and sys.stderr.isatty()
        self.tasks: dict[str, Any] = {}
        self.progress: Any = None

    def __enter__(self) -> _ProgressBar:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("ζ {task.fields[zeta]}"), TimeElapsedColumn(),
                console=Console(stderr=True), transient=False,
            )
            self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def update(self, event: Any) -> None:
        if self.progress is None:
            return
        if event.vm not in self.tasks and event.kind != "zeta_b":
            return  # a bar per sensitive VM, created by its first frozen sample
        task = self.tasks.get(event.vm)
        if task is None:
            task = self.tasks[event.vm] = self.progress.add_task(
                f"ζb {event.vm}", total=self.target, zeta=0)
        self.progress.update(task, completed=event.zeta_b, zeta=event.zeta)


def _fmt(value: Any, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def print_result(data: dict[str, Any]) -> None:
    rows = []
    for name, vm in data["vms"].items():
        zeta, zeta_b, loss = vm["zeta"], vm["zeta_b"], vm["degradation"]
        rows.append((
            name,
            bool(vm["sensitive"]),
            _fmt(zeta and zeta["p50"]),
            _fmt(zeta_b and zeta_b["p50"]),
            f"{loss['estimate'] * 100:.1f}% [{loss['ci95_low'] * 100:.1f}, {loss['ci95_high'] * 100:.1f}]"
            if loss else "",
            f"{zeta['n'] if zeta else 0}/{zeta_b['n'] if zeta_b else 0}",
            ", ".join(f"{k} {v}" for k, v in vm["dropped"].items()),
        ))
    print_table(f"Freeze'nSense on {data['host']} ({data['metric']}, run {data['run_id']})",
                RESULT_COLUMNS, rows)
    overhead = data["overhead"]
    print(f"overhead: measured {overhead['measured'] * 100:.2f}% of the time frozen; "
          f"formula K_s·t_m/(K_s·t_m+t_sleep) = {overhead['formula'] * 100:.2f}% "
          f"({overhead['formula_with_latency'] * 100:.2f}% with the measured "
          f"{overhead['freeze_latency_ms']:.1f} ms freeze latency); K_s = {overhead['k_s']}, "
          f"{data['freezes']} freezes, stopped: {data['stopped_because']}")
    from vmplacer.bootstrap.rebalance import spared_text

    spared = spared_text(data.get("frozen_share"))
    if spared:
        print(spared)


# ----- show ----------------------------------------------------------------------------------------


def show_data(store: Any, vms: list[str], run_id: int | None) -> dict[str, Any]:
    """Distributions of the stored samples of `vms` in one run (newest holding them all by default)."""
    from vmplacer.core.model.profile_stats import stored_summary

    run_row = store.run(run_id) if run_id is not None else store.latest_run_with(vms)
    if run_row is None:
        what = f"run {run_id}" if run_id is not None else f"a profiling run with {', '.join(vms)}"
        raise UsageError(f"no {what} in the database")
    result: dict[str, Any] = {
        "run": {"id": run_row.id, "host": run_row.host, "metric": run_row.metric, "status": run_row.status,
                "started_at": run_row.started_at, "finished_at": run_row.finished_at,
                "parameters": run_row.parameters},
        "vms": {},
    }
    for vm in vms:
        samples = store.samples(run_row.id, vm)
        if not samples:
            raise UsageError(f"VM {vm}: no samples in run {run_row.id}")
        result["vms"][vm] = stored_summary(samples)
    return result


def run_show(args: argparse.Namespace, ctx: CliContext, vms: list[str]) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from vmplacer.bootstrap.profiler import profile_store

    _only_for(args, "show", ("host", "tm", "tsleep", "max_freeze", "samples", "duration", "metric", "sensitive",
                             "exclude", "scope", "pair_probes", "adaptive", "probe", "probe_kind", "no_progress"))
    if not vms:
        raise UsageError("profile show: name at least one VM (a VM named `show` is profiled with "
                         "`vmplacer profile run show`)")
    plot = Path(args.plot) if args.plot else None
    if plot is not None and plot.suffix.lower() not in _PLOT_SUFFIXES:
        raise UsageError(f"--plot: {plot} must end in {', '.join(_PLOT_SUFFIXES)}")
    try:
        data = show_data(profile_store(ctx.container), vms, args.run)
    except SQLAlchemyError as exc:
        raise DatabaseError(exc) from None
    if plot is not None:
        draw_boxplots(data, plot)
    emit(args, data, lambda shown: _print_show(shown, plot))
    return 0


def _print_show(data: dict[str, Any], plot: Path | None = None) -> None:
    run = data["run"]
    rows = []
    for name, vm in data["vms"].items():
        for kind, label in (("zeta", "ζ (shared)"), ("zeta_b", "ζb (frozen)")):
            dist = vm[kind]
            if dist is None:
                rows.append((name, label, "", "", "", "", "", "", "0"))
                continue
            rows.append((name, label, _fmt(dist["p10"]), _fmt(dist["p25"]), _fmt(dist["p50"]),
                         _fmt(dist["p75"]), _fmt(dist["p90"]),
                         f"{_fmt(dist['mean'])} ± {_fmt(dist['ci95_high'] - dist['mean'])}", str(dist["n"])))
        loss = vm["degradation"]
        if loss:
            rows.append((name, "degradation", "", "", f"{loss['estimate'] * 100:.1f}%", "", "",
                         f"95% CI {loss['ci95_low'] * 100:.1f}–{loss['ci95_high'] * 100:.1f}%", ""))
    print_table(f"run {run['id']} on {run['host']} ({run['metric']}, {run['status']})",
                SHOW_COLUMNS, rows)
    for name, vm in data["vms"].items():
        if vm["neighbours"]:
            near = ", ".join(f"{n['name']} ({n['distance']}{'' if n['frozen'] else ', not frozen'})"
                             for n in vm["neighbours"])
            print(f"{name}: neighbours at the last ζb sample: {near}")
        for pair in vm.get("pairs", []):
            loss = pair["degradation"]
            print(f"{name}: with only {pair['neighbour']} running ({pair['distance']}, {pair['n']} pair probes): "
                  f"loses {loss['estimate'] * 100:.1f}% (95% CI {loss['ci95_low'] * 100:.1f}–"
                  f"{loss['ci95_high'] * 100:.1f}%)")
    if plot is not None:
        print(f"plot written to {plot}")


def draw_boxplots(data: dict[str, Any], path: Path) -> None:
    """ζ next to ζb per VM, like the seed's Fig. 5.3: quartile boxes, 10th/90th percentile
    whiskers, medians, means as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(data["vms"])
    series, labels, colours = [], [], []
    for name in names:
        for kind, label, colour in (("zeta", "ζ", "#d95f02"), ("zeta_b", "ζb", "#1b9e77")):
            series.append(data["vms"][name]["values"][kind] or [float("nan")])
            labels.append(f"{name}\n{label}")
            colours.append(colour)
    figure, axes = plt.subplots(figsize=(max(4.0, 1.4 * len(series)), 4.5))
    boxes = axes.boxplot(series, whis=(10, 90), showmeans=True, patch_artist=True, widths=0.6,
                         meanprops={"marker": "o", "markerfacecolor": "red", "markeredgecolor": "red"})
    for patch, colour in zip(boxes["boxes"], colours):
        patch.set_facecolor(colour)
        patch.set_alpha(0.6)
    axes.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    axes.set_ylabel(f"{data['run']['metric']} (per window)")
    axes.set_title(f"Freeze'nSense run {data['run']['id']} on {data['run']['host']}: "
                   "ζ shared vs ζb neighbours frozen", fontsize=9)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=120)
    except OSError as exc:
        raise OperationalError(f"--plot: cannot write {path}: {exc}") from None
    finally:
        plt.close(figure)


# ----- replay ------------------------------------------------------------------------------------


def run_replay(args: argparse.Namespace, ctx: CliContext) -> int:
    _only_for(args, "replay", ("tm", "tsleep", "max_freeze", "samples", "duration", "metric", "sensitive",
                               "exclude", "scope", "pair_probes", "adaptive", "probe", "probe_kind", "no_progress",
                               "run", "plot"))
    no_more_words("profile", "replay", args.vms,
                  " (VMs named so are profiled with `vmplacer profile run replay ...`)")
    if args.host:
        resolve_host(ctx, args.host)
    report = _replay(ctx, args.host)
    from vmplacer.cli.guard import print_replay

    emit(args, report.to_dict(), print_replay)
    return 1 if report.errors else 0
