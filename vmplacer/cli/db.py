"""`vmplacer db upgrade|downgrade|current`: schema migrations (Alembic);
`vmplacer db prune`: data retention."""

from __future__ import annotations

import argparse
import re
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from vmplacer.cli.common import (
    CliContext,
    DatabaseError,
    UsageError,
    add_format_argument,
    duration,
    emit,
    print_table,
)
from vmplacer.cli.confirm import add_yes_argument, confirm
from vmplacer.core.text import excerpt

HISTORY_COLUMNS = ("revision", "current", "description")
# one row per kind; `rows`: deleted, or in a dry run what would be (the title says which)
PRUNE_COLUMNS = ("kind", "older than", "rows")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("db", help="database schema migrations and data retention")
    actions = parser.add_subparsers(dest="db_action", metavar="ACTION", required=True,
                                    help="upgrade, downgrade, current, history or prune")
    up = actions.add_parser("upgrade", help="migrate the database to the newest schema (or REVISION)")
    up.add_argument("revision", nargs="?", default="head", metavar="REVISION",
                    help="the schema revision to migrate to (default: head, the newest; `db history` lists them)")
    up.set_defaults(func=run_upgrade)
    down = actions.add_parser("downgrade", help="migrate the database back to REVISION")
    down.add_argument("revision", metavar="REVISION",
                      help="the schema revision to migrate back to (`vmplacer db history` lists them)")
    add_yes_argument(down, "do it without asking (needed when stdin is not a terminal: a downgrade drops what "
                           "newer revisions added; on a terminal a y/N question asks first, No exits 2)")
    down.set_defaults(func=run_downgrade)
    current = actions.add_parser("current", help="show the database's schema revision")
    add_format_argument(current)
    current.set_defaults(func=run_current)
    history = actions.add_parser("history", help="list the schema revisions this vmplacer knows (oldest first)")
    add_format_argument(history, columns=HISTORY_COLUMNS)
    history.set_defaults(func=run_history)
    prune = actions.add_parser(
        "prune", help="delete finished plans, profile runs, audit entries and jobs older than the config's "
                      "retention ages, expired idempotency keys and ended web sign-ins")
    prune.add_argument("--older-than", type=duration(unit=None, days=True), metavar="DURATION",
                       help="one age for every kind instead of the config's retention section: a number "
                            "and its unit, s, m, h or d (e.g. 30d, 12h, 90m, 3600s; a bare number is refused). "
                            "Idempotency keys and web sign-ins keep their own ends (the replay window; "
                            "web.session_lifetime_s and web.session_idle_s)")
    prune.add_argument("--dry-run", action="store_true", help="count what would go, delete nothing")
    prune.epilog = ("prune does not ask for confirmation (no --yes): it deletes only finished records older than "
                    "the retention ages, as the daily timer does; --dry-run shows what would go.")
    add_format_argument(prune, columns=PRUNE_COLUMNS)
    prune.set_defaults(func=run_prune)


def _check_revision(revision: str) -> None:
    """REVISION must be one this vmplacer ships (or head, base, or a relative step such as -1):
    a typo is bad input, not a database that a newer vmplacer migrated."""
    from vmplacer.bootstrap import Container

    known = [rev for rev, _doc in Container.known_revisions()]
    base = re.split(r"[+-]\d+$", revision)[0]
    if revision == "heads" or re.fullmatch(r"[+-]\d+", revision) or base in (*known, "head", "base"):
        return
    raise UsageError(f"REVISION {excerpt(revision, 40)}: not a known schema revision (known: base, "
                     f"{known[0]} to {known[-1]}, head; `vmplacer db history` lists them with what each does)")


def _migrate(args: argparse.Namespace, ctx: CliContext, verb: str) -> int:
    from alembic.util.exc import CommandError

    _check_revision(args.revision)
    name = ctx.container.database_name()
    if verb == "downgrade":
        confirm(args, "db downgrade", f"migrate database {name} back to revision {excerpt(args.revision, 40)}, "
                "dropping what newer revisions added")
    step = ctx.container.upgrade_database if verb == "upgrade" else ctx.container.downgrade_database
    try:
        step(args.revision)
    except SQLAlchemyError as exc:
        raise DatabaseError(exc, f"{verb} failed") from None
    except CommandError as exc:
        text = str(exc).splitlines()[0] if str(exc) else ""
        if "not a valid" in text or "Destination" in text or "relative" in text:
            # a known revision in the wrong direction (upgrade to an older one, downgrade to a newer one)
            raise UsageError(f"REVISION {excerpt(args.revision, 40)}: {text[:200]} (`vmplacer db current` shows "
                             f"the database's revision)") from None
        raise
    try:  # what the database is at now, not what was asked: `upgrade 0005` at 0011 changes nothing
        current, _head = ctx.container.schema_revisions()
    except SQLAlchemyError as exc:
        raise DatabaseError(exc) from None
    print(f"database {name} at revision {current or 'base (no schema)'}")
    return 0


def run_upgrade(args: argparse.Namespace, ctx: CliContext) -> int:
    return _migrate(args, ctx, "upgrade")


def run_downgrade(args: argparse.Namespace, ctx: CliContext) -> int:
    return _migrate(args, ctx, "downgrade")


def run_history(args: argparse.Namespace, ctx: CliContext) -> int:
    """The schema revisions this vmplacer knows, oldest first, the database's marked."""
    try:
        current, _head = ctx.container.schema_revisions()
    except SQLAlchemyError:
        current = None  # the list is this vmplacer's own: still worth showing without a database
    rows = [{"revision": rev, "description": doc, "current": rev == current}
            for rev, doc in ctx.container.known_revisions()]
    emit(args, rows, lambda d: print_table("schema revisions (oldest first)", HISTORY_COLUMNS,
                                           [(r["revision"], r["current"], r["description"]) for r in d]))
    return 0


def run_current(args: argparse.Namespace, ctx: CliContext) -> int:
    try:
        current, head = ctx.container.schema_revisions()
    except SQLAlchemyError as exc:
        raise DatabaseError(exc) from None
    name = ctx.container.database_name()
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
        raise DatabaseError(exc, "prune failed") from None
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
              "profile_samples": ages["profiles"], "audit": ages["audit"], "jobs": ages["jobs"],
              "rebalance_rounds": ages["plans"], "rebalance_round_hosts": ages["plans"]}
    ends = data["web_sessions_end_s"]
    web_end = f"ended ({_age(ends['lifetime'])} old or {_age(ends['idle'])} idle)"
    title = "prune (dry run: nothing deleted; rows: what would be)" if data["dry_run"] else "prune: rows deleted"
    print_table(title, PRUNE_COLUMNS,
                [(kind, _age(age_of[kind]) if kind in age_of else web_end if kind == "web_sessions" else "expired",
                  n) for kind, n in data["counts"].items()])
