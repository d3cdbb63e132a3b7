"""`vmplacer hosts`: the configured hosts and whether each answers."""

from __future__ import annotations

import argparse

from vmplacer.cli.common import CliContext, add_format_argument, emit, print_table
from vmplacer.ports import HypervisorError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("hosts", help="list configured hosts and check that each answers")
    add_format_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    rows = []
    for host in ctx.settings.hosts:
        entry: dict[str, object] = {"name": host.name, "uri": host.uri, "reachable": False}
        try:
            entry.update(ctx.container.hypervisor(host.name).ping())
            entry["reachable"] = True
        except HypervisorError as exc:
            entry["error"] = str(exc)
        rows.append(entry)

    def table(data: list[dict[str, object]]) -> None:
        print_table(
            "hosts",
            ("name", "uri", "reachable", "driver", "domains", "detail"),
            [
                (
                    r["name"],
                    r["uri"],
                    "yes" if r["reachable"] else "NO",
                    r.get("driver", ""),
                    r.get("domains", ""),
                    r.get("error", r.get("hostname", "")),
                )
                for r in data
            ],
        )

    emit(args, rows, table)
    # Listing is the job; an unreachable host is reported, not an error of this command,
    # but scripts checking health want to know: exit 1 when any host is down.
    return 0 if all(r["reachable"] for r in rows) else 1
