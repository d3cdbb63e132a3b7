"""`vmplacer token create|revoke|list`: bearer tokens of the REST API.

    vmplacer token create NAME --scope admin|read   # prints the token, once
    vmplacer token revoke NAME [--yes]             # asks y/N on a terminal; --yes elsewhere
    vmplacer token list [--format json]

Only the SHA-256 of a token is stored; a lost token is revoked and replaced,
never recovered. A revoked token stops working within seconds on every
instance (each caches verified tokens for a few seconds).
"""

from __future__ import annotations

import argparse
import sys

from vmplacer.cli.common import (
    CliContext,
    DatabaseError,
    UsageError,
    add_format_argument,
    emit,
    print_table,
)
from vmplacer.cli.confirm import add_yes_argument, confirm
from vmplacer.core.text import excerpt, iso_utc

TOKEN_COLUMNS = ("name", "scope", "created", "last used")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("token", help="create, revoke and list REST API bearer tokens")
    actions = parser.add_subparsers(dest="token_action", metavar="ACTION", required=True,
                                    help="create, revoke or list")
    create = actions.add_parser("create", help="create a token and print it (shown only this once)")
    create.add_argument("name", help="who or what uses it (1-64 of A-Z a-z 0-9 _ . - @)")
    create.add_argument("--scope", choices=("admin", "read"), required=True,
                        help="read: GET only; admin: everything")
    create.set_defaults(func=run_create)
    revoke = actions.add_parser("revoke", help="revoke a token by name")
    revoke.add_argument("name", help="the name the token was created with")
    add_yes_argument(revoke)
    revoke.set_defaults(func=run_revoke)
    listing = actions.add_parser("list", help="list tokens (names and scopes; never the tokens)")
    add_format_argument(listing, columns=TOKEN_COLUMNS)
    listing.set_defaults(func=run_list)


def _store(ctx: CliContext):  # -> SqlTokenStore
    from vmplacer.cli.serve import ensure_schema

    ensure_schema(ctx)
    return ctx.container.token_store


def run_create(args: argparse.Namespace, ctx: CliContext) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from vmplacer.ports import TokenError

    store = _store(ctx)
    try:
        token = store.create(args.name, args.scope)
    except TokenError as exc:
        raise UsageError(str(exc)) from None
    except SQLAlchemyError as exc:
        raise DatabaseError(exc) from None
    print(token)
    if sys.stderr.isatty():
        sys.stderr.write(f"token {args.name} ({args.scope}) created; it is shown only now — store it safely\n")
    return 0


def run_revoke(args: argparse.Namespace, ctx: CliContext) -> int:
    store = _store(ctx)
    if args.name not in {token.name for token in store.list()}:
        raise UsageError(f"no token named {excerpt(args.name, 64)}")
    confirm(args, "token revoke", f"revoke token {excerpt(args.name, 64)}: whatever uses it is refused from then on")
    if not store.revoke(args.name):
        raise UsageError(f"no token named {excerpt(args.name, 64)}")
    print(f"token {args.name} revoked")
    return 0


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "never"
    return iso_utc(epoch)


def run_list(args: argparse.Namespace, ctx: CliContext) -> int:
    tokens = [t.to_dict() for t in _store(ctx).list()]
    emit(args, tokens, lambda rows: print_table(
        "API tokens", TOKEN_COLUMNS,
        [(r["name"], r["scope"], _when(r["created_at"]), _when(r["last_used_at"])) for r in rows]))
    return 0
