"""`vmplacer db upgrade|downgrade|current`: schema migrations (Alembic);
`vmplacer db prune`: data retention."""

from __future__ import annotations

import argparse
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from vmplacer.cli.common import (
    CliContext,
    OperationalError,
    add_format_argument,
    duration,
    emit,
    print_table,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("db", help="database schema migrations and data retention")
    actions = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True)
    up = actions.add_parser("upgrade", help="migrate the database to the newest schema (or REVISION)")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(func=run_upgrade)
    down = actions.add_parser("downgrade", help="migrate the database back to REVISION")
    down.add_argument("revision")
    down.set_defaults(func=run_downgrade)
    current = actions.add_parser("current", help="show the database's schema revision")
    add_format_argument(current)
    current.set_defaults(func=run_current)
    prune = actions.add_parser(
        "prune", help="delete finished plans, profile runs, audit entries, jobs and expired idempotency keys "
                      "older than the config's retention ages")
    prune.add_argument("--older-than", type=duration(days=True), metavar="DURATION",
                       help="one age for every kind instead of the config's retention section "
                            "(e.g. 30d, 12h, 90m, 3600)")
    prune.add_argument("--dry-run", action="store_true", help="count what would go, delete nothing")
    add_format_argument(prune)
    prune.set_defaults(func=run_prune)


def run_upgrade(args: argparse.Namespace, ctx: CliContext) -> int:
    name = ctx.container.database_name()
    try:
        ctx.container.upgrade_database(args.revision)
    except SQLAlchemyError as exc:
        raise OperationalError(f"database {name}: upgrade failed: {exc.__class__.__name__}: {exc}") from None
    print(f"database {name} at revision {args.revision}")
    return 0


def run_downgrade(args: argparse.Namespace, ctx: CliContext) -> int:
    name = ctx.container.database_name()
    try:
        ctx.container.downgrade_database(args.revision)
    except SQLAlchemyError as exc:
        raise OperationalError(f"database {name}: downgrade failed: {exc}") from None
    print(f"database {name} at revision {args.revision}")
    return 0


def run_current(args: argparse.Namespace, ctx: CliContext) -> int:
    name = ctx.container.database_name()
    try:
        current, head = ctx.container.schema_revisions()
    except SQLAlchemyError as exc:
        raise OperationalError(f"database {name}: {exc}") from None
    data = {
        "database": name,
        "current": current,
        "head": head,
    }
    emit(args, data, lambda d: print(f"{d['database']}: revision {d['current'] or 'none'} (head {d['head']})"))
    return 0


def run_prune(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.cli.serve import ensure_schema

    if args.older_than is not None:
        age = args.older_than
        ages = {"plans_s": age, "profiles_s": age, "audit_s": age, "jobs_s": age}
    else:
        kept = ctx.settings.retention
        ages = {"plans_s": kept.plans_s, "profiles_s": kept.profiles_s, "audit_s": kept.audit_s,
                "jobs_s": kept.jobs_s}
    ensure_schema(ctx)
    try:
        report = ctx.container.prune(**ages, actor="vmplacer db prune", dry_run=args.dry_run)
    except SQLAlchemyError as exc:
        raise OperationalError(f"database {ctx.container.database_name()}: prune failed: "
                               f"{exc.__class__.__name__}: {exc}") from None
    emit(args, report.to_dict(), _render_prune)
    return 0


def _age(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _render_prune(data: dict[str, Any]) -> None:
    ages = data["older_than_s"]
    age_of = {"plans": ages["plans"], "plan_actions": ages["plans"], "profile_runs": ages["profiles"],
              "profile_samples": ages["profiles"], "audit": ages["audit"], "jobs": ages["jobs"]}
    verb = "would delete" if data["dry_run"] else "deleted"
    title = "prune (dry run: nothing deleted)" if data["dry_run"] else "prune"
    print_table(title, ("kind", "older than", verb),
                [(kind, _age(age_of[kind]) if kind in age_of else "expired", n)
                 for kind, n in data["counts"].items()])
