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
import errno
import ipaddress
import logging
import socket

from vmplacer.cli.common import CliContext, OperationalError, UsageError, duration
from vmplacer.cli.log_format import say

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


def listen_text(host: str, port: int) -> str:
    """'127.0.0.1:8470', '[::1]:8470': the address as --listen spells it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_tls_pair(certfile: str, keyfile: str) -> None:
    """Exit 2 naming both files when they are not a PEM certificate and its own private key:
    found here, not as a traceback from the TLS layer once the server starts."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        reason = exc.reason or ""
        if "KEY_VALUES_MISMATCH" in reason or "key values mismatch" in str(exc):
            why = "the private key does not belong to the certificate"
        elif "PEM" in reason or "NO_START_LINE" in reason or "no start line" in str(exc):
            why = "not a PEM certificate and private key"
        else:
            why = f"not a usable certificate and key ({reason or exc.__class__.__name__})"
        raise UsageError(f"--ssl-certfile {certfile}, --ssl-keyfile {keyfile}: {why}") from None
    except OSError as exc:
        raise UsageError(f"--ssl-certfile {certfile}, --ssl-keyfile {keyfile}: {exc.strerror or exc}") from None


def bind_listeners(host: str, port: int) -> list[socket.socket]:
    """The listening sockets, one per address `host` resolves to (`localhost`: 127.0.0.1 and ::1),
    bound as uvicorn binds them (SO_REUSEADDR, IPv6 sockets IPv6 only). An address that is taken,
    not this machine's or not allowed is an OperationalError naming HOST:PORT (exit 1: the API
    cannot start), never uvicorn's bare errno line and its startup-failure code."""
    where = listen_text(host, port)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OperationalError(f"cannot listen on {where}: {exc.strerror}") from None
    sockets: list[socket.socket] = []
    for family, _kind, _proto, _name, address in dict.fromkeys((i[0], i[1], i[2], i[3], i[4]) for i in infos):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sockets.append(sock)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(2048)  # uvicorn's default backlog
        except OSError as exc:
            for each in sockets:
                each.close()
            raise OperationalError(f"cannot listen on {where}: {_bind_problem(exc)}") from None
        if port == 0:  # the other addresses take the port the first one got
            port = sock.getsockname()[1]
    return sockets


def _bind_problem(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "address already in use (another vmplacer serve or another program listens there)"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "no such address on this machine"
    return exc.strerror or str(exc)


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
    if args.ssl_certfile:
        check_tls_pair(args.ssl_certfile, args.ssl_keyfile)
    if not is_loopback(host) and not args.ssl_certfile:
        say("warning", f"listening on {host} without TLS; bearer tokens cross the network in clear text "
                       "(use --ssl-certfile/--ssl-keyfile or a TLS reverse proxy)")
    listeners = bind_listeners(host, port)  # before anything starts: a taken address is one line, at once
    container = None
    try:
        ensure_schema(ctx)
        options = ApiOptions(instance=args.instance or instance_name(), lease_ttl_s=args.lease_ttl,
                             run_jobs=not args.no_jobs, isolation_check_s=args.isolation_every)
        container = ServerContainer(ctx.settings)
        app = create_app(container, options)
        scheme = "https" if args.ssl_certfile else "http"
        log.info("vmplacer API instance %s on %s://%s", options.instance, scheme,
                 listen_text(host, listeners[0].getsockname()[1]))
        config = uvicorn.Config(
            # log_config=None: uvicorn's lines go through vmplacer's handler, in --log-format's form
            app, host=host, port=port, log_level=args.log_level, access_log=args.access_log, log_config=None,
            ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile,
            timeout_graceful_shutdown=30, server_header=False, date_header=True,
            # X-Forwarded-For/-Proto are believed only from configured proxies (uvicorn's default: loopback)
            forwarded_allow_ips=[str(network) for network in ctx.settings.api.trusted_proxies],
        )
        server = uvicorn.Server(config)
        try:
            server.run(sockets=listeners)
        except SystemExit as exc:  # uvicorn's startup failure is its exit 3, which is vmplacer's "does not fit"
            if server.started:
                raise
            raise OperationalError(f"the API on {listen_text(host, port)} did not start "
                                   f"(uvicorn stopped with {exc.code}; its log line above says why)") from None
    finally:
        for sock in listeners:
            sock.close()
        if container is not None:
            container.close()
    return 0 if server.started else 1
