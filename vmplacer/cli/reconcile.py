"""`vmplacer reconcile`: make the placement records agree with what libvirt runs.

    vmplacer reconcile [--host H ... | --all] [--dry-run] [--drift restore|adopt|report]
                       [--reservation-grace 1h] [--settle 60s]

Records of domains undefined or migrated by hand (`virsh undefine`,
`virsh migrate`) are forgotten with their exclusive pCPU claims; recorded
states follow libvirt's; drifted pinning (vCPU, emulator pins, memory nodes)
is pinned back as recorded (`--drift adopt`: the record takes libvirt's pins
unless they break isolation; `--drift report`: left alone); threads running on
another guest's exclusive or the host's reserved pCPUs (kind `isolation`) and
domains without a record are reported. Each host is reconciled under its lease, so never while a
rebalance applies a plan there. Rebalancing plans a stopped process left
`running` (no live lease on their hosts) are closed as `failed` first
(listed; a dry run lists them only). Exit codes: 0 every host reconciled; 1 a host
was unreachable or busy (named on stderr; the others were still reconciled)
or the database failed, or a drift repair failed; 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

from vmplacer.cli.common import (
    EXIT_OK,
    EXIT_OPERATIONAL,
    CliContext,
    DatabaseError,
    OperationalError,
    UsageError,
    add_format_argument,
    add_host_selection,
    duration,
    emit,
    print_table,
    resolve_hosts,
)
from vmplacer.core.text import plural

RECONCILE_COLUMNS = ("host", "guest", "kind", "action", "outcome", "detail")

def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "reconcile",
        help="forget placements whose domains are gone, fix recorded states (holds a lease per host)",
        description="Compare each host's placement records with the domains libvirt runs there. Records whose "
        "domain was undefined, replaced or moved outside vmplacer are released with their exclusive pCPU "
        "claims; reservations no domain was defined for within the grace are released; recorded states follow "
        "libvirt; drifted pinning is pinned back as recorded (see --drift). Isolation violations and domains "
        "without a record are reported. Records changed within the settle window are left alone (a placement "
        "may be in progress).",
    )
    add_host_selection(parser, default="all", verb="reconcile")
    parser.add_argument("--dry-run", action="store_true", help="report what would change; change nothing")
    parser.add_argument("--drift", choices=("restore", "adopt", "report"), default="restore",
                        help="drifted pinning: pin it back as recorded (default), adopt libvirt's pins into the "
                        "record (refused where they break isolation), or only report it")
    parser.add_argument("--reservation-grace", type=duration(zero="at once"), default=3600.0, metavar="DURATION",
                        help="release a reservation (state planned) whose domain was not defined this long "
                        "after reserving (default 1h; e.g. 30m, 2h, 900s)")
    parser.add_argument("--settle", type=duration(zero="none"), default=60.0, metavar="DURATION",
                        help="never touch a record changed this recently (default 60s; 0: none)")
    add_format_argument(parser, columns=RECONCILE_COLUMNS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from vmplacer.app.observe.reconcile import ReconcileError

    grace, settle = args.reservation_grace, args.settle
    hosts = resolve_hosts(ctx, args.host)
    try:
        reconciler = _reconciler(ctx)
        report = reconciler.run(hosts, dry_run=args.dry_run, planned_grace_s=grace, settle_s=settle,
                                drift=args.drift)
    except ReconcileError as exc:
        if exc.bad_input:
            raise UsageError(str(exc)) from None
        raise OperationalError(str(exc)) from None
    except SQLAlchemyError as exc:
        raise DatabaseError(exc) from None
    emit(args, report.to_dict(), _render)
    if report.complete:
        return EXIT_OK
    sys.stderr.write("vmplacer: failed: " + "; ".join(report.problems) + "\n")
    return EXIT_OPERATIONAL


def _reconciler(ctx: CliContext) -> Any:
    ctx.container.upgrade_database()
    return ctx.container.reconciler(f"reconcile:{socket.gethostname()}:{os.getpid()}")


def _render(data: dict[str, Any]) -> None:
    rows = [(f["host"], f["guest"], f["kind"], f["action"], f["outcome"], f["detail"])
            for host in data["hosts"] for f in host["findings"]]
    mode = " (dry run: nothing changed)" if data["dry_run"] else ""
    if rows:
        print_table(f"reconcile{mode}", RECONCILE_COLUMNS, rows)
    for host in data["hosts"]:
        counts = ", ".join(f"{n} {kind}" for kind, n in host["counts"].items()) or "records agree with libvirt"
        print(f"host {host['host']}: {host['status']}" + (f" ({counts})" if host["status"] == "reconciled"
                                                          else f": {host['message']}"))
    throttles = [(t["host"], t["guest"], t["kind"], t["detail"]) for host in data["hosts"]
                 for t in host.get("throttles", [])]
    if throttles:
        print_table("throttles (reported, not changed)", ("host", "guest", "kind", "detail"), throttles)
    for plan in data.get("closed_plans", []):
        print(f"plan {plan['id']}: " + (plan["message"] if data["dry_run"] else f"closed as failed: {plan['message']}"))
    verb = "would release" if data["dry_run"] else "released"
    print(f"{verb} {plural(data['released'], 'record')}, {'would move' if data['dry_run'] else 'moved'} "
          f"{data['followed']} to their domain's new host, {'would update' if data['dry_run'] else 'updated'} "
          f"{data['updated']}, {'would pin back' if data['dry_run'] else 'pinned back'} {data['restored']}, "
          f"{'would adopt' if data['dry_run'] else 'adopted'} the pins of {data['adopted']}{mode}")
