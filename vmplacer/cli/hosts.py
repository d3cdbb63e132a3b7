"""`vmplacer hosts`: the configured hosts, whether each answers, and maintenance mode.

Without a config file the one host is the built-in example (said so in the
table, and as "builtin_example" in the JSON).

`hosts disable HOST --reason TEXT` puts a host in maintenance: the API places
no new guest on it and the rebalancer moves none onto it (`vmplacer rebalance
--drain HOST` moves its guests away). `hosts enable HOST` puts it back in
service. The state lives in the database, so every instance sees it.
"""

from __future__ import annotations

import argparse
import sys

from vmplacer.cli.common import (
    EXIT_OK,
    CliContext,
    UsageError,
    add_format_argument,
    emit,
    operator_name,
    print_table,
)
from vmplacer.ports import HypervisorError

HOSTS_COLUMNS = ("name", "uri", "reachable", "driver", "domains", "maintenance", "detail")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "hosts", help="list configured hosts and check that each answers; maintenance mode (disable/enable)")
    add_format_argument(parser, columns=HOSTS_COLUMNS)
    parser.set_defaults(func=run)
    actions = parser.add_subparsers(dest="hosts_command", metavar="{disable,enable}",
                                    help="maintenance mode of one host (without: list the hosts)")
    disable = actions.add_parser("disable", help="put a host in maintenance: no new guests, no migrations in")
    disable.add_argument("host", metavar="HOST", help="a configured host")
    disable.add_argument("--reason", required=True, help="why (kept with the host and in the audit log)")
    add_format_argument(disable, inherited=True)
    disable.set_defaults(func=run_disable)
    enable = actions.add_parser("enable", help="take a host out of maintenance")
    enable.add_argument("host", metavar="HOST", help="a configured host")
    add_format_argument(enable, inherited=True)
    enable.set_defaults(func=run_enable)


def _configured(ctx: CliContext, name: str) -> str:
    """The configured host's URI; exit 2 naming the configured hosts otherwise."""
    for host in ctx.settings.hosts:
        if host.name == name:
            return host.uri
    known = ", ".join(h.name for h in ctx.settings.hosts) or "none"
    raise UsageError(f"HOST {name!r}: unknown host (configured: {known})")


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from alembic.util.exc import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from vmplacer.cli.common import database_problem

    container = ctx.container
    database_error = None
    try:  # a health check: the hosts are still listed when the database is down (or at a
        # schema revision this version does not know: a newer vmplacer migrated it)
        container.upgrade_database()
        closed = container.maintenance.current()
    except (SQLAlchemyError, CommandError) as exc:
        database_error = database_problem(exc, ctx)
        closed = {}
    rows = []
    for host in ctx.settings.hosts:
        entry: dict[str, object] = {"name": host.name, "uri": host.uri, "reachable": False,
                                    "maintenance": closed[host.name].to_dict() if host.name in closed else None,
                                    "builtin_example": host.is_builtin_example,
                                    "capabilities": str(host.capabilities) if host.capabilities else None}
        try:
            entry.update(container.hypervisor(host.name).ping())
            entry["reachable"] = True
        except HypervisorError as exc:
            entry["error"] = str(exc)
        rows.append(entry)

    def table(data: list[dict[str, object]]) -> None:
        print_table(
            "hosts",
            HOSTS_COLUMNS,
            [
                (
                    r["name"],
                    r["uri"],
                    bool(r["reachable"]),
                    r.get("driver", ""),
                    r.get("domains", ""),
                    _maintenance_text(r["maintenance"]),
                    r.get("error", _detail(r)),
                )
                for r in data
            ],
        )
        for r in data:
            if r["builtin_example"]:
                print(example_note(str(r["capabilities"])))

    emit(args, rows, table)
    if database_error:
        sys.stderr.write(f"vmplacer: maintenance states unknown: {database_error}\n")
    # Listing is the job; an unreachable host (or database) is reported, not an error of this
    # command, but scripts checking health want to know: exit 1 when anything is down.
    return 0 if all(r["reachable"] for r in rows) and not database_error else 1


def example_note(capabilities: str) -> str:
    """What the built-in example host is, read from its capabilities file."""
    from vmplacer.adapters.capabilities import read_capabilities_file

    topology = read_capabilities_file(capabilities)
    node_gib = sorted({round(node.memory_kib / 1024**2) for node in topology.nodes.values()})
    return (
        f"built-in example host (no config file): the topology of a {len(topology.packages)}-socket server, "
        f"{len(topology.cpus)} pCPUs (SMT-{topology.smt}), {len(topology.nodes)} NUMA nodes of "
        f"{'/'.join(map(str, node_gib))} GiB, from {capabilities};\n"
        "its domains go to libvirt's test driver, which keeps them only while this vmplacer process runs.\n"
        "To place on real hosts, write a config file (examples/vmplacer.yaml) and pass --config or $VMPLACER_CONFIG."
    )


def _detail(row: dict[str, object]) -> str:
    if row["builtin_example"]:
        return "built-in example host"
    if row["capabilities"]:
        return f"topology from {row['capabilities']}"
    return str(row.get("hostname", ""))


def _maintenance_text(record: object) -> str:
    if not isinstance(record, dict):
        return ""
    return f"since {str(record['since'])[:16].replace('T', ' ')} by {record['by']}: {record['reason']}"


def _no_columns(args: argparse.Namespace, action: str) -> None:
    """`hosts --columns ... disable X` prints no table: refused rather than silently ignored."""
    if getattr(args, "columns", None):
        raise UsageError(f"--columns: applies to the hosts list, not to hosts {action}")


def run_disable(args: argparse.Namespace, ctx: CliContext) -> int:
    _no_columns(args, "disable")
    uri = _configured(ctx, args.host)
    reason = args.reason.strip()
    if not reason:
        raise UsageError("--reason: must not be empty (operators read it to know why the host is out of service)")
    container = ctx.container
    container.upgrade_database()
    record, changed = container.maintenance.start(args.host, uri, by=operator_name(), reason=reason)
    data = {"host": args.host, "changed": changed, "maintenance": record.to_dict()}

    def table(d: dict[str, object]) -> None:
        print(("" if d["changed"] else "already: ") + record.describe())
        print(f"no new guests and no migrations go to {args.host}; "
              f"`vmplacer rebalance --drain {args.host}` moves its guests away")

    emit(args, data, table)
    return EXIT_OK


def run_enable(args: argparse.Namespace, ctx: CliContext) -> int:
    _no_columns(args, "enable")
    _configured(ctx, args.host)
    container = ctx.container
    container.upgrade_database()
    record = container.maintenance.end(args.host, by=operator_name())
    data = {"host": args.host, "changed": record is not None,
            "was": record.to_dict() if record is not None else None}

    def table(d: dict[str, object]) -> None:
        print(f"host {args.host} is in service" + ("" if d["changed"] else " (it was not in maintenance)"))

    emit(args, data, table)
    return EXIT_OK
