"""`vmplacer db upgrade|downgrade|current`: schema migrations (Alembic)."""

from __future__ import annotations

import argparse

from sqlalchemy.exc import SQLAlchemyError

from vmplacer.cli.common import CliContext, OperationalError, add_format_argument, emit


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("db", help="database schema migrations")
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


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def run_upgrade(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.adapters.db.migrate import upgrade

    url = ctx.settings.database_url
    try:
        upgrade(url, args.revision)
    except SQLAlchemyError as exc:
        raise OperationalError(f"database {_redacted(url)}: upgrade failed: {exc.__class__.__name__}: {exc}") from None
    print(f"database {_redacted(url)} at revision {args.revision}")
    return 0


def run_downgrade(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.adapters.db.migrate import downgrade

    url = ctx.settings.database_url
    try:
        downgrade(url, args.revision)
    except SQLAlchemyError as exc:
        raise OperationalError(f"database {_redacted(url)}: downgrade failed: {exc}") from None
    print(f"database {_redacted(url)} at revision {args.revision}")
    return 0


def run_current(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.adapters.db.migrate import current_revision, head_revision

    try:
        current = current_revision(ctx.container.engine)
    except SQLAlchemyError as exc:
        raise OperationalError(f"database {_redacted(ctx.settings.database_url)}: {exc}") from None
    data = {
        "database": _redacted(ctx.settings.database_url),
        "current": current,
        "head": head_revision(),
    }
    emit(args, data, lambda d: print(f"{d['database']}: revision {d['current'] or 'none'} (head {d['head']})"))
    return 0
