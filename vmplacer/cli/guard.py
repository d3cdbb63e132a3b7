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
import os
import select
import signal
import time
from typing import Any

from vmplacer.cli.common import (
    CliContext,
    DatabaseError,
    OperationalError,
    add_format_argument,
    duration,
    emit,
    refuse_options,
)

log = logging.getLogger(__name__)
DEFAULT_EVERY_S = 1.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "guard", help="resume guests left paused by a killed vmplacer process (once, or every second)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None)
    parser.add_argument("--once", action="store_true", help="replay once and exit (for ExecStopPost=)")
    parser.add_argument("--every", type=duration(), metavar="DURATION",
                        help="time between replays without --once, e.g. 1s (default 1s)")
    add_format_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.once:
        refuse_options(args, ("every",), "paces the repeated replays, not guard --once (one replay)")
    every = DEFAULT_EVERY_S if args.every is None else args.every
    from vmplacer.bootstrap.profiler import replay_freeze_journal

    if args.once:
        report = replay_freeze_journal(ctx.container, cause="guard")
        _unreadable(report)
        emit(args, report.to_dict(), print_replay)
        return 1 if report.errors else 0

    hosts: dict[str, Any] = {}
    with _Stop() as stop:
        log.info("replaying the freeze journal every %g s", every)
        while True:
            report = replay_freeze_journal(ctx.container, cause="guard", hosts=hosts)
            if report.resumed or report.errors:
                emit(args, report.to_dict(), print_replay)
            if stop.wait(every):
                return 0


class _Stop:
    """SIGTERM/SIGINT, waited for between replays without a lock.

    A handler that sets a threading.Event can deadlock: it runs in the main thread, perhaps
    while that thread holds the Event's own lock inside `wait`. Here the handler only notes the
    signal, and the signal module's wake-up pipe ends the wait at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __enter__(self) -> _Stop:
        self.received: list[int] = []
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._previous_fd = signal.set_wakeup_fd(self._write)
        self._previous = {s: signal.signal(s, lambda signum, _frame: self.received.append(signum))
                          for s in self.SIGNALS}
        return self

    def wait(self, seconds: float) -> bool:
        """Whether a stop signal came, waiting up to `seconds` for one."""
        deadline = time.monotonic() + seconds
        while not self.received and (left := deadline - time.monotonic()) > 0:
            if select.select([self._read], [], [], left)[0]:
                while True:  # drain: any signal wakes the pipe, only ours stop
                    try:
                        if not os.read(self._read, 512):
                            break
                    except BlockingIOError:
                        break
        return bool(self.received)

    def __exit__(self, *_exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._read)
        os.close(self._write)


def _unreadable(report: Any) -> None:
    """A journal that cannot be read fails the command: a database one says what to do
    (`vmplacer db upgrade` on a fresh database), never the driver's SQL."""
    from sqlalchemy.exc import SQLAlchemyError

    if isinstance(report.journal_error, SQLAlchemyError):
        raise DatabaseError(report.journal_error, "freeze journal unreadable")
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
