"""`vmplacer protect`: hold protected guests above their ζ/ζb floor by throttling their neighbours.

    vmplacer protect --host H [--once | --rounds N] [--interval 2s] [--scope GLOB ...]
                     [--samples N] [--t-m-ms MS] [--format table|json]
    vmplacer protect status [--host H] [--format table|json]

Runs in the foreground (systemd/vmplacer-protect@.service runs it per host). Each round profiles
the protected guests with short Freeze'nSense rounds, asks the interference model who costs them
their performance, and throttles or releases throttleable neighbours one step through a stored
plan (shown by `vmplacer plans`). `status` lists the throttles in force that vmplacer set (the
throttle ledger) with the share libvirt shows now. Policy and limits: docs/protect.md. Exit codes: 0 done
(or stopped by a signal); 1 the host or the database failed; 2 bad input.
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
    OperationalError,
    UsageError,
    add_format_argument,
    parse_duration,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "protect",
        help="hold protected guests above their ζ/ζb floor by throttling the neighbours that hurt them",
        description="Each round: measure every protected guest's ζ/ζb (Freeze'nSense), attribute its loss to "
        "neighbours with the interference model, throttle the neighbour that costs it most one step (never "
        "below its vmplacer.min_cpu_share, never a guest without one), release step by step when it has "
        "headroom, release at once when it stops. A floor throttling cannot hold is reported with a "
        "proposed rebalance plan. See docs/protect.md.",
    )
    parser.add_argument("what", nargs="?", choices=("status",), help="status: the throttles in force, no loop")
    parser.add_argument("--host", metavar="NAME", help="the configured host to protect on (required for the loop; "
                        "status: only this host)")
    runs = parser.add_mutually_exclusive_group()
    runs.add_argument("--once", action="store_true", help="one round, then exit")
    runs.add_argument("--rounds", type=int, metavar="N", help="this many rounds, then exit (default: until stopped)")
    parser.add_argument("--interval", metavar="DURATION", help="time between round starts (default: the config's "
                        "protect.interval_s)")
    parser.add_argument("--scope", action="append", metavar="GLOB",
                        help="only guests whose names match (repeatable; default every guest): read, frozen and "
                        "throttled only within it")
    parser.add_argument("--samples", type=int, default=5, metavar="N",
                        help="ζ and ζb samples per protected guest per round (default 5)")
    parser.add_argument("--t-m-ms", type=float, metavar="MS",
                        help="Freeze'nSense window (default: the config's profiler.t_m_ms)")
    add_format_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from vmplacer.ports import HypervisorError

    if args.what == "status":
        return _status(args, ctx)
    if args.host is None:
        raise UsageError("--host: required (the loop protects one host; `vmplacer protect status` lists all)")
    if args.host not in [h.name for h in ctx.settings.hosts]:
        known = ", ".join(h.name for h in ctx.settings.hosts)
        raise UsageError(f"--host {args.host!r}: not a configured host (configured: {known})")
    if args.rounds is not None and args.rounds < 1:
        raise UsageError(f"--rounds: must be at least 1, got {args.rounds}")
    if not 1 <= args.samples <= 100:
        raise UsageError(f"--samples: must be 1..100, got {args.samples}")
    if args.t_m_ms is not None and not 0.1 <= args.t_m_ms <= 1000:
        raise UsageError(f"--t-m-ms: must be 0.1..1000 ms, got {args.t_m_ms}")
    for pattern in args.scope or ():
        if not pattern.strip():
            raise UsageError("--scope: a glob must not be empty")
    interval = (parse_duration(args.interval, "--interval", "s") if args.interval
                else ctx.settings.protect.interval_s)
    if interval <= 0:
        raise UsageError(f"--interval: must be longer than 0, got {args.interval}")
    rounds = 1 if args.once else args.rounds

    from vmplacer.bootstrap_protect import build_protect_loop

    stopping = {"now": False}

    def stop(_signum: int, _frame: Any) -> None:
        stopping["now"] = True  # finish the round in progress: never stop in the middle of an action

    signal.signal(signal.SIGTERM, stop)
    try:
        ctx.container.upgrade_database()
        loop = build_protect_loop(ctx.container, args.host, scope=tuple(args.scope or ("*",)),
                                  samples=args.samples, t_m_s=None if args.t_m_ms is None else args.t_m_ms / 1e3,
                                  interval_s=interval)
        loop.run(rounds=rounds, stop=lambda: stopping["now"],
                 on_round=lambda report: _print(args, report.to_dict()))
    except KeyboardInterrupt:
        return EXIT_OK
    except HypervisorError as exc:
        raise OperationalError(str(exc)) from None
    except SQLAlchemyError as exc:
        raise OperationalError(f"database: {exc}") from None
    return EXIT_OK


def _status(args: argparse.Namespace, ctx: CliContext) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from vmplacer.adapters.db.throttles import SqlThrottleLedger
    from vmplacer.cli.common import emit, print_table
    from vmplacer.ports import HypervisorError

    known = [h.name for h in ctx.settings.hosts]
    if args.host is not None and args.host not in known:
        raise UsageError(f"--host {args.host!r}: not a configured host (configured: {', '.join(known)})")
    try:
        ctx.container.upgrade_database()
        records = SqlThrottleLedger(ctx.container.sessions).current(args.host)
    except SQLAlchemyError as exc:
        raise OperationalError(f"database: {exc}") from None
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
    emit(args, rows, lambda data: print_table(
        "throttles vmplacer set" + ("" if data else ": none"),
        ("host", "guest", "share", "libvirt shows", "before", "protects", "age", "plan"),
        [(r["host"], r["guest"], f"{r['share']:.2f}", r["live_share"] if isinstance(r["live_share"], str)
          else f"{r['live_share']:.2f}", f"{r['original_share']:.2f}", r["protects"], f"{r['age_s']:.0f} s",
          r["plan_id"] or "") for r in data]))
    return EXIT_OK


def _print(args: argparse.Namespace, data: dict[str, Any]) -> None:
    if args.format == "json":
        print(json.dumps(data, sort_keys=True), flush=True)  # one JSON object per round
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
    print(f"  neighbours frozen {data['frozen_ms']:.0f} ms this round; since start "
          f"{data['freeze_overhead'] * 100:.2f} % of the time")
    for note in data["notes"]:
        sys.stderr.write(f"note: {note}\n")
    sys.stdout.flush()
