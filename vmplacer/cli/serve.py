"""`vmplacer serve`: the REST API under uvicorn.

    vmplacer serve [--listen 127.0.0.1:8470] [--ssl-certfile CERT --ssl-keyfile KEY]
                   [--instance NAME] [--lease-ttl 30s] [--no-jobs] [--isolation-every 60s]

Listens on api.listen (127.0.0.1:8470 by default). The database schema must be
current (`vmplacer db upgrade`); a fresh SQLite file is created on first start.
Before serving, the freeze journal is replayed (domains a killed vmplacer left
paused are resumed). SIGTERM/SIGINT stop it gracefully: running jobs are asked
to stop and their host leases are released.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys

from vmplacer.cli.common import CliContext, OperationalError, UsageError, duration

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the REST API (uvicorn)",
        description="Serve the REST API for orchestrators. Every route but /healthz needs a bearer "
        "token (`vmplacer token create`). Several instances may share one PostgreSQL database: "
        "host leases make sure one instance at a time acts on a host.",
    )
    parser.add_argument("--listen", metavar="HOST:PORT",
                        help="address to listen on (default: api.listen of the config, 127.0.0.1:8470)")
    parser.add_argument("--ssl-certfile", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--ssl-keyfile", metavar="FILE", help="private key of --ssl-certfile (PEM)")
    parser.add_argument("--instance", metavar="NAME",
                        help="this instance's name in leases and jobs (default: hostname:pid:random)")
    parser.add_argument("--isolation-every", type=duration(zero="never"), default=60.0, metavar="DURATION",
                        help="check each host's live pinning against the isolation invariant this often "
                        "(/metrics vmplacer_isolation_violations, a log line per violation; default 60s, 0: never)")
    parser.add_argument("--lease-ttl", type=duration(low=1.0), default=30.0, metavar="DURATION",
                        help="host lease lifetime, e.g. 30s or 2m; a crashed instance's hosts are taken over "
                        "after it (default 30s)")
    parser.add_argument("--no-jobs", action="store_true",
                        help="queue jobs but leave running them to other instances")
    parser.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"),
                        default="info", help="uvicorn's log level (default: info)")
    parser.add_argument("--access-log", action="store_true", help="log every request")
    parser.set_defaults(func=run)


def parse_listen(text: str) -> tuple[str, int]:
    """'127.0.0.1:8470', '[::1]:8470', 'localhost:8470' -> (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise UsageError(f"--listen: expected HOST:PORT, got {text!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise UsageError(f"--listen: port must be 0..65535, got {port}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ensure_schema(ctx: CliContext) -> None:
    """The schema must be current. A database with no schema at all is created when it is
    SQLite (the single-node default just works); PostgreSQL is upgraded by the operator."""
    from sqlalchemy.exc import SQLAlchemyError

    from vmplacer.cli.common import DatabaseError

    container = ctx.container
    url = ctx.settings.database_url
    try:
        current, head = container.schema_revisions()
        if current is None and url.startswith("sqlite"):
            container.upgrade_database()
            return
    except SQLAlchemyError as exc:
        raise DatabaseError(exc) from None
    if current != head:
        raise OperationalError(
            f"database schema is at revision {current or 'none'}, this vmplacer needs {head}: "
            "run `vmplacer db upgrade` (see docs/operations.md, Upgrade)")


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    import uvicorn

    from vmplacer.api.app import create_app
    from vmplacer.api.services import ApiOptions, instance_name
    from vmplacer.bootstrap import ServerContainer

    host, port = parse_listen(args.listen or ctx.settings.api.listen)
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        raise UsageError("--ssl-certfile and --ssl-keyfile go together")
    for option, path in (("--ssl-certfile", args.ssl_certfile), ("--ssl-keyfile", args.ssl_keyfile)):
        if path:
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise UsageError(f"{option} {path}: {exc.strerror}") from None
    if not is_loopback(host) and not args.ssl_certfile:
        sys.stderr.write(f"vmplacer: warning: listening on {host} without TLS; bearer tokens cross the "
                         "network in clear text (use --ssl-certfile/--ssl-keyfile or a TLS reverse proxy)\n")
    ensure_schema(ctx)
    isolation_every = args.isolation_every
    options = ApiOptions(instance=args.instance or instance_name(), lease_ttl_s=args.lease_ttl,
                         run_jobs=not args.no_jobs, isolation_check_s=isolation_every)
    container = ServerContainer(ctx.settings)
    app = create_app(container, options)
    log.info("vmplacer API instance %s on %s:%d", options.instance, host, port)
    config = uvicorn.Config(
        # log_config=None: uvicorn's lines go through vmplacer's handler, in --log-format's form
        app, host=host, port=port, log_level=args.log_level, access_log=args.access_log, log_config=None,
        ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile,
        timeout_graceful_shutdown=30, server_header=False, date_header=True,
    )
    server = uvicorn.Server(config)
    try:
        server.run()
    finally:
        container.close()
    return 0 if server.started else 1
