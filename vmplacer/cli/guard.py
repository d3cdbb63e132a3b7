"""`vmplacer guard`: the freeze journal's safety net outside any freezing process.

Every freeze has a guardian process that resumes its guests if the freezer
dies. What kills both at once (a systemd cgroup kill, the OOM killer taking
the whole unit, a reboot of the controller) leaves a journal row; this
command resumes the guests of such rows. `--once` is for a unit's
ExecStopPost=; without it, it replays every `--every` (default 1 s) until
stopped, for a host that runs vmplacer from timers but no `vmplacer serve`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

from vmplacer.cli.common import (
    CliContext,
    OperationalError,
    UsageError,
    add_format_argument,
    emit,
    parse_duration,
)

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "guard", help="resume guests left paused by a killed vmplacer process (once, or every second)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None)
    parser.add_argument("--once", action="store_true", help="replay once and exit (for ExecStopPost=)")
    parser.add_argument("--every", default="1s", metavar="DURATION",
                        help="time between replays without --once (default 1s)")
    add_format_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    every = parse_duration(args.every, "--every", "s")
    if every <= 0:
        raise UsageError(f"--every: must be positive, got {args.every!r}")
    from vmplacer.bootstrap.profiler import replay_freeze_journal

    if args.once:
        report = replay_freeze_journal(ctx.container, cause="guard")
        _unreadable(report)
        emit(args, report.to_dict(), print_replay)
        return 1 if report.errors else 0

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    hosts: dict[str, Any] = {}
    log.info("replaying the freeze journal every %g s", every)
    while True:
        report = replay_freeze_journal(ctx.container, cause="guard", hosts=hosts)
        if report.resumed or report.errors:
            emit(args, report.to_dict(), print_replay)
        if stop.wait(every):
            return 0


def _unreadable(report: Any) -> None:
    unreadable = [e for e in report.errors if "freeze journal unreadable" in e]
    if unreadable:
        raise OperationalError(unreadable[0])


def print_replay(data: dict[str, Any]) -> None:
    for item in data["resumed"]:
        print(f"resumed {item['domain']} on {item['host']}")
    for item in data["left_alone"]:
        print(f"left {item['domain']} on {item['host']} paused: {item['why']}")
    for error in data["errors"]:
        print(f"error: {error}")
    if not (data["resumed"] or data["left_alone"] or data["errors"]):
        print("freeze journal: nothing to replay")
