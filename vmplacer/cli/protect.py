"""`vmplacer protect`: hold protected guests above their ζ/ζb floor by throttling their neighbours.

    vmplacer protect run --host H [--once | --rounds N] [--interval 2s] [--scope GLOB ...]
                     [--samples N] [--tm 10ms] [--format table|json]
    vmplacer protect status [--host H] [--format table|json] [--plot FILE.png] [--since DURATION]

`run` may still be left out (`vmplacer protect --host H`) this release, with a deprecation line. Runs in the foreground (systemd/vmplacer-protect@.service runs it per host). Each round profiles
the protected guests with short Freeze'nSense rounds, asks the interference model who costs them
their performance, and throttles or releases throttleable neighbours one step through a stored
plan (shown by `vmplacer plans show ID`). `status` shows each protected guest as its loop last saw it
(smoothed ζ/ζb, floor, throttles applied, time below the floor, the freeze budget) and the throttles
in force that vmplacer set (the throttle ledger) with the share libvirt shows now; `--plot` draws
ζ/ζb and throttle levels over time from the loop's recorded rounds. Policy and limits: docs/protect.md. Exit codes: 0 done
(or stopped by a signal); 1 the host or the database failed; 2 bad input, or an option the chosen
mode does not read (`status --once`, `--host H --plot F`). `--tm` takes a unit (a bare number is
refused); the older `--t-m-ms N` still works, N in ms, with a deprecation warning.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from vmplacer.cli.common import (
    EXIT_OK,
    CliContext,
    DatabaseError,
    OperationalError,
    UsageError,
    add_format_argument,
    add_host_selection,
    count,
    duration,
    emit,
    refuse_options,
    select_columns,
)
from vmplacer.core.durations import format_seconds
from vmplacer.core.text import plural

T_M_RANGE = {"low": 1e-4, "high": 1.0}  # a Freeze'nSense window: 100 us to 1 s
# What only the loop reads (`protect status` reads --host, --plot, --since, --format, --columns).
LOOP_OPTIONS = ("once", "rounds", "interval", "scope", "samples", "tm", "t_m_ms")
# `protect status`'s main table (--columns selects from it; the freeze budget and throttles stay whole)
PROTECTED_COLUMNS = ("host", "guest", "ζ/ζb", "floor", "state", "throttles applied", "below floor", "round age")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "protect",
        help="hold protected guests above their ζ/ζb floor by throttling the neighbours that hurt them",
        description="Each round: measure every protected guest's ζ/ζb (Freeze'nSense), attribute its loss to "
        "neighbours with the interference model, throttle the neighbour that costs it most one step (never "
        "below its vmplacer.min_cpu_share, never a guest without one), release step by step when it has "
        "headroom, release at once when it stops. A floor throttling cannot hold is reported with a "
        "proposed rebalance plan. See docs/protect.md.",
        usage="vmplacer protect run --host NAME [--once | --rounds N]\n"
              "                            [--interval DURATION] [options]\n"
              "       vmplacer protect status [--host NAME] [--plot FILE.png]\n"
              "                               [--since DURATION] [--format F]",
    )
    parser.add_argument("what", nargs="?", choices=("run", "status"), metavar="{run,status}",
                        help="run: the protection loop on one host (also taken when left out, deprecated); "
                             "status: the throttles in force and each protected guest as its loop last saw it, "
                             "no loop")
    add_host_selection(parser, default="required", verb="protect guests on", repeatable=False,
                       all_hosts=False, default_note="`protect status`: every configured host")
    runs = parser.add_mutually_exclusive_group()
    runs.add_argument("--once", action="store_true", help="one round, then exit")
    runs.add_argument("--rounds", type=count(1), metavar="N",
                      help="this many rounds, then exit (default: until stopped)")
    parser.add_argument("--interval", type=duration(low=0.2, high=3600.0), metavar="DURATION",
                        help="time between round starts while acting or near a "
                        "floor (default: the config's protect.interval_s); the loop backs off to "
                        "protect.slow_interval_s while every floor holds with margin")
    parser.add_argument("--scope", action="append", metavar="GLOB",
                        help="only guests whose names match (repeatable; default every guest): read, frozen and "
                        "throttled only within it")
    parser.add_argument("--samples", type=count(1, 100), default=5, metavar="N",
                        help="ζ and ζb samples per protected guest per round (default 5)")
    parser.add_argument("--tm", type=duration(unit=None, **T_M_RANGE), metavar="DURATION",
                        help="Freeze'nSense window t_m with its unit, e.g. 10ms, as `profile --tm` (a bare number "
                        "is refused; default: the config's profiler.t_m_ms)")
    # Deprecated spelling of --tm, kept for scripts: a bare number is still milliseconds there.
    parser.add_argument("--t-m-ms", type=duration(unit="ms", **T_M_RANGE), help=argparse.SUPPRESS)
    parser.add_argument("--plot", metavar="FILE.png", help="status: draw ζ/ζb and throttle shares over time into "
                        "this PNG (from the rounds the loop recorded)")
    parser.add_argument("--since", type=duration(), metavar="DURATION",
                        help="status --plot: only the last DURATION (e.g. 30m; "
                        "default all that is recorded)")
    add_format_argument(parser, tables={"status": PROTECTED_COLUMNS}, command="protect")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from vmplacer.ports import HypervisorError

    if args.what is None:
        from vmplacer.cli.verbs import deprecated

        deprecated("protect", [], "run")
        args.what = "run"
    select_columns(args, args.what)
    if args.what == "status":
        refuse_options(args, LOOP_OPTIONS, "applies to the protection loop, not to `protect status`")
        return _status(args, ctx)
    refuse_options(args, ("plot", "since"), "applies to `protect status`, not to the protection loop")
    t_m_s = _t_m(args)
    if args.host is None:
        raise UsageError("--host: required (the loop protects one host; `vmplacer protect status` lists all)")
    if args.host not in [h.name for h in ctx.settings.hosts]:
        known = ", ".join(h.name for h in ctx.settings.hosts)
        raise UsageError(f"--host {args.host!r}: not a configured host (configured: {known})")
    for pattern in args.scope or ():
        if not pattern.strip():
            raise UsageError("--scope: a glob must not be empty")
    interval = args.interval if args.interval is not None else ctx.settings.protect.interval_s
    rounds = 1 if args.once else args.rounds

    from vmplacer.bootstrap.protect import build_protect_loop

    stopping = {"now": False}

    def stop(_signum: int, _frame: Any) -> None:
        stopping["now"] = True  # finish the round in progress: never stop in the middle of an action

    signal.signal(signal.SIGTERM, stop)
    try:
        ctx.container.upgrade_database()
        loop = build_protect_loop(ctx.container, args.host, scope=tuple(args.scope or ("*",)),
                                  samples=args.samples, t_m_s=t_m_s,
                                  interval_s=interval)
        loop.run(rounds=rounds, stop=lambda: stopping["now"],
                 on_round=lambda report: _print(args, report.to_dict()))
    except KeyboardInterrupt:
        return EXIT_OK
    except HypervisorError as exc:
        raise OperationalError(str(exc)) from None
    except SQLAlchemyError as exc:
        raise DatabaseError(exc) from None
    return EXIT_OK


def _t_m(args: argparse.Namespace) -> float | None:
    """The window --tm asks for (seconds), or the deprecated --t-m-ms's, with a warning; None: the config's."""
    if args.t_m_ms is None:
        return args.tm
    if args.tm is not None:
        raise UsageError("--t-m-ms: the deprecated spelling of --tm; give --tm only")
    sys.stderr.write(f"vmplacer: warning: --t-m-ms is deprecated: write --tm {args.t_m_ms * 1e3:g}ms\n")
    return args.t_m_ms


def _status(args: argparse.Namespace, ctx: CliContext) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from vmplacer.cli.common import print_table
    from vmplacer.ports import HypervisorError

    known = [h.name for h in ctx.settings.hosts]
    if args.host is not None and args.host not in known:
        raise UsageError(f"--host {args.host!r}: not a configured host (configured: {', '.join(known)})")
    since_s = args.since
    if args.plot is None:
        refuse_options(args, ("since",), "only with `protect status --plot` (it limits the rounds plotted)")
    else:
        refuse_options(args, ("columns",), "applies to the tables of `protect status`, not to --plot (it draws a PNG)")
    if args.plot is not None and not args.plot.lower().endswith(".png"):
        raise UsageError(f"--plot {args.plot!r}: must name a .png file")
    hosts = [args.host] if args.host is not None else known
    from vmplacer.adapters.protect_history import ProtectHistory

    history = ProtectHistory.in_data_dir(ctx.settings.data_dir)
    if args.plot is not None:
        return _plot(args, history, hosts, since_s)
    guests, loops = _guest_rows(history, hosts)
    try:
        ctx.container.upgrade_database()
        records = ctx.container.throttle_ledger.current(args.host)
    except SQLAlchemyError as exc:
        raise DatabaseError(exc) from None
    rows = []
    for record in records:
        try:
            live: float | str = ctx.container.hypervisor(record.host).cpu_bandwidth(record.guest).share
        except (HypervisorError, ValueError) as exc:
            live = f"unreadable: {exc}"
        rows.append({"host": record.host, "guest": record.guest, "share": round(record.bandwidth.share, 4),
                     "live_share": round(live, 4) if isinstance(live, float) else live,
                     "original_share": round(record.original.share, 4), "protects": record.protects,
                     "age_s": round(record.age_s, 1), "plan_id": record.plan_id, "reason": record.reason})
    def table(data: dict[str, Any]) -> None:
        print_table("protected guests (as their loop last saw them)" + ("" if data["guests"] else ": none recorded"),
                    PROTECTED_COLUMNS,
                    [(g["host"], g["guest"], "-" if g["ratio"] is None else f"{g['ratio']:.2f}", f"{g['floor']:.2f}",
                      g["state"], g["throttles_applied"], f"{g['below_floor_s']:.0f} s", f"{g['round_age_s']:.0f} s")
                     for g in data["guests"]])
        if data["loops"]:
            print_table("freeze budget", ("host", "frozen share", "budget", "window", "next round in", "samples"),
                        [(h["host"], f"{h['freeze_share'] * 100:.2f} %", f"{h['freeze_budget'] * 100:.2f} %",
                          f"{h['window_s']:.0f} s", f"{h['interval_s']:.0f} s", h["samples"]) for h in data["loops"]])
        rows = data["throttles"]
        print_table(
            "throttles vmplacer set" + ("" if rows else ": none"),
            ("host", "guest", "share", "libvirt shows", "before", "protects", "age", "plan"),
            [(r["host"], r["guest"], f"{r['share']:.2f}", r["live_share"] if isinstance(r["live_share"], str)
              else f"{r['live_share']:.2f}", f"{r['original_share']:.2f}", r["protects"], f"{r['age_s']:.0f} s",
              r["plan_id"] or "") for r in rows])

    emit(args, {"guests": guests, "loops": loops, "throttles": rows}, table)
    return EXIT_OK


def _guest_rows(history: Any, hosts: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per protected guest and per host loop: the newest recorded round."""
    import time

    guests, loops = [], []
    for host in hosts:
        record = history.latest(host)
        if record is None:
            continue
        age = max(0.0, time.time() - float(record.get("at", 0.0)))
        budget, pace = record.get("budget") or {}, record.get("pace") or {}
        loops.append({"host": host, "round_age_s": round(age, 1), "freeze_share": budget.get("share", 0.0),
                      "freeze_budget": budget.get("max_share", 0.0), "window_s": budget.get("window_s", 0.0),
                      "interval_s": pace.get("interval_s", 0.0), "samples": pace.get("samples", 0)})
        for name, stats in sorted((record.get("guests") or {}).items()):
            guests.append({"host": host, "guest": name, "ratio": stats.get("ratio"), "floor": stats.get("floor"),
                           "state": stats.get("state"), "throttles_applied": stats.get("throttles_applied", 0),
                           "below_floor_s": stats.get("below_floor_s", 0.0), "round_age_s": round(age, 1)})
    return guests, loops


def _plot(args: argparse.Namespace, history: Any, hosts: list[str], since_s: float | None) -> int:
    import time

    from vmplacer.cli.protect_plot import draw

    since = time.time() - since_s if since_s is not None else None
    rounds = [r for host in hosts for r in history.read(host, since=since)]
    if not rounds:
        raise OperationalError(f"no recorded protection rounds for {', '.join(hosts)}"
                               + (f" in the last {format_seconds(since_s)}" if since_s else "") + ": nothing to plot")
    try:
        drawn = draw(rounds, args.plot)
    except OSError as exc:
        raise OperationalError(f"--plot {args.plot}: {exc}") from None
    emit(args, {"plot": args.plot, "series": drawn, "rounds": len(rounds)},
         lambda d: print(f"{d['plot']}: {d['series']} series over {d['rounds']} rounds"))
    return EXIT_OK


def _print(args: argparse.Namespace, data: dict[str, Any]) -> None:
    if args.format == "json":
        from vmplacer.cli.common import json_ready

        print(json.dumps(json_ready(data), sort_keys=True), flush=True)  # one JSON object per round
        return
    if args.format == "yaml":
        from vmplacer.cli.common import yaml_text

        print("---\n" + yaml_text(data), end="", flush=True)  # one YAML document per round
        return
    if not data["verdicts"]:
        print(f"{data['host']}: no protected guest running")
    for verdict in data["verdicts"]:
        ratio = "-" if verdict["ratio"] is None else f"{verdict['ratio']:.2f}"
        print(f"{data['host']} {verdict['guest']}: ζ/ζb {ratio} floor {verdict['floor']:.2f} "
              f"[{verdict['state']}] {verdict['message']}")
    for step in data["steps"]:
        print(f"  {step['kind']} {step['guest']}: share {step['share_before']:.2f} → {step['share_after']:.2f} "
              f"({step['reason']})")
    if data["plan"]:
        print(f"  plan {data['plan']['id']}: {data['plan']['state']}")
    budget, pace = data.get("budget") or {}, data.get("pace") or {}
    allowance, span = budget.get("startup_allowance_s") or 0.0, budget.get("span_s") or 0.0
    allowed = (f" + {allowance:g} s start-up allowance: {budget.get('limit_s', 0.0) / span * 100:.2f} % of these "
               f"{span:.0f} s" if allowance and span > 0 else "")
    print(f"  neighbours frozen {data['frozen_ms']:.0f} ms this round; since start "
          f"{data['freeze_overhead'] * 100:.2f} % of the time; last {budget.get('span_s', budget.get('window_s', 0)):.0f} s "
          f"{budget.get('share', 0.0) * 100:.2f} % (budget {budget.get('max_share', 0.0) * 100:.2f} %{allowed}); "
          f"next round in {pace.get('interval_s', 0.0):.0f} s with {plural(pace.get('samples', 0), 'sample')} "
          f"({pace.get('reason', '')})")
    for note in data["notes"]:
        sys.stderr.write(f"note: {note}\n")
    sys.stdout.flush()
