"""`vmplacer serve`: the REST API under uvicorn.

    vmplacer serve [--listen 127.0.0.1:8470] [--ssl-certfile CERT --ssl-keyfile KEY]
                   [--instance NAME] [--lease-ttl 30s] [--no-jobs] [--isolation-every 60s]
                   [--workers N]

Listens on api.listen (127.0.0.1:8470 by default). The database schema must be
current (`vmplacer db upgrade`); a fresh SQLite file is created on first start.
Before serving, the freeze journal is replayed (domains a killed vmplacer left
paused are resumed). SIGTERM/SIGINT stop it gracefully: running jobs are asked
to stop and their host leases are released.

With `--workers N` (N > 1) the parent binds the address, checks the schema, then forks N
worker processes, each accepting on its own socket of one SO_REUSEPORT group on that address.
Each worker is a whole instance (its own database pool, libvirt connections, job runner and
housekeeping), as if N instances shared the database: see `serve_workers`.
"""

from __future__ import annotations

import argparse
import errno
import functools
import ipaddress
import logging
import os
import signal
import socket
import time
from collections.abc import Callable

from vmplacer.cli.common import CliContext, OperationalError, UsageError, count, duration
from vmplacer.cli.log_format import say

log = logging.getLogger(__name__)

MAX_WORKERS = 64
# A worker still running this long after it was asked to stop is killed (uvicorn's graceful
# shutdown takes at most 30 s, then the job runner waits up to 30 s for its handlers).
WORKER_STOP_S = 75.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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
    parser.add_argument("--workers", type=count(1, MAX_WORKERS), default=1, metavar="N",
                        help="worker processes accepting on the same address, each a whole instance sharing "
                        "the database (1..64; default 1: one process). Use PostgreSQL for more than a few; "
                        "see docs/operations.md, Worker processes")
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
    try:
        ensure_schema(ctx)  # once, here: workers creating a fresh SQLite schema at once would race
        if args.workers == 1:
            return serve_here(args, ctx, listeners, host, port, args.instance)
        ctx.container.close()  # no database connection may cross a fork (SQLite's rule, psycopg's too)
        groups = worker_listeners(listeners, args.workers, listen_text(host, listeners[0].getsockname()[1]))
        return serve_workers(groups, lambda index, sockets: serve_here(
            args, ctx, sockets, host, port, f"{args.instance}-w{index}" if args.instance else None))
    finally:
        for sock in listeners:
            sock.close()


def serve_here(args: argparse.Namespace, ctx: CliContext, listeners: list[socket.socket], host: str, port: int,
               instance: str | None) -> int:
    """Serve the API in this process on the bound `listeners` until stopped (`instance` None: a
    name made of this process's host, pid and a random part)."""
    import uvicorn

    from vmplacer.api.app import create_app
    from vmplacer.api.services import ApiOptions, instance_name
    from vmplacer.bootstrap import ServerContainer

    container = None
    try:
        options = ApiOptions(instance=instance or instance_name(), lease_ttl_s=args.lease_ttl,
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
        if container is not None:
            container.close()
    return 0 if server.started else 1


# ----- several worker processes -----------------------------------------------------------------
def worker_listeners(listeners: list[socket.socket], workers: int, where: str) -> list[list[socket.socket]]:
    """One set of listening sockets per worker, on the addresses `listeners` hold, all in one
    SO_REUSEPORT group: the kernel spreads new connections over the workers evenly (by a hash
    of each connection's addresses).

    Why not every worker on the one socket: a worker's event loop accepts every connection
    waiting when it wakes, so a burst of connections (clients opening their keep-alive pool)
    lands on whichever worker woke first; measured with 32 connections, 2 workers got 29 and
    3, 4 workers 14, 13, 3 and 2. `listeners` were bound without SO_REUSEPORT, so an address
    another program (or another vmplacer serve) listens on was refused there, exclusively;
    they are closed here and the group is bound at once on the same port."""
    addresses = [(sock.family, sock.getsockname()) for sock in listeners]
    for sock in listeners:
        sock.close()
    groups: list[list[socket.socket]] = []
    try:
        for _ in range(workers):
            group: list[socket.socket] = []
            groups.append(group)
            for family, address in addresses:
                sock = socket.socket(family, socket.SOCK_STREAM)
                group.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(2048)
    except OSError as exc:
        _close_all(groups)
        raise OperationalError(f"cannot listen on {where}: {_bind_problem(exc)}") from None
    return groups


def _close_all(groups: list[list[socket.socket]]) -> None:
    for group in groups:
        for sock in group:
            sock.close()


def serve_workers(groups: list[list[socket.socket]], serve: Callable[[int, list[socket.socket]], int]) -> int:
    """Run `serve(index, sockets)` in one forked process per socket group until a stop signal
    or a worker's death.

    Why fork, not uvicorn's own `workers=`: uvicorn's supervisor spawns fresh interpreters that
    import the app from a string and bind (or unpickle) their own sockets, so neither the
    sockets bound here (a taken address refused at once, naming it) nor the application built
    from this command's settings and options would reach them. A fork after binding hands each
    worker its listening sockets and the parsed arguments as they are; each worker then builds
    its own container (database pool, libvirt connections), since none is open at the fork.
    TLS is the workers' own (uvicorn loads the certificate in each). A worker keeps only its own
    sockets open, and the parent none: a socket of the group that nobody accepts on would hold
    the connections the kernel hands it.

    What runs in the background runs in every worker, as it does in several instances sharing
    a database, and is safe so: jobs are claimed with a conditional update under host leases
    (one worker acts on a host at a time), each worker has its own instance name, the freeze
    journal is replayed only for owners no longer alive (each worker is its own owner), and
    housekeeping's purge and orphaned-plan closing are idempotent statements.

    The parent only supervises: SIGTERM or SIGINT is passed on to every worker as SIGTERM
    (uvicorn's graceful shutdown; a second stop signal is passed on as SIGINT, uvicorn's
    forced exit), and it exits 0 once all stopped. A worker that dies on its own is reported
    with its status, the others are stopped, and the parent exits 1: a server short of a worker
    is not restarted piecemeal (a worker failing at start would fail again), the service
    manager restarts the whole server instead. A worker gets SIGTERM when the parent dies, even
    by SIGKILL (PR_SET_PDEATHSIG), so none is left orphaned on the port."""
    parent = os.getpid()
    watched = {*STOP_SIGNALS, signal.SIGCHLD}
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)  # waited for below, never lost
    children: dict[int, int] = {}  # pid -> worker index
    failed = stopping = False
    deadline = float("inf")
    try:
        for index, group in enumerate(groups, start=1):
            pid = os.fork()
            if pid == 0:
                _close_all([g for g in groups if g is not group])
                _worker(index, parent, previous_mask, functools.partial(serve, index, group))  # never returns
            children[pid] = index
            _close_all([group])
        log.info("serving with %d worker processes: %s", len(groups), ", ".join(str(pid) for pid in children))
        while children:
            timeout = 1.0 if not stopping else max(0.0, min(1.0, deadline - time.monotonic()))
            received = signal.sigtimedwait(watched, timeout)
            if received is not None and received.si_signo in STOP_SIGNALS:
                forward = signal.SIGINT if stopping else signal.SIGTERM
                if not stopping:
                    log.info("stopping %d worker processes (%s)", len(children),
                             signal.Signals(received.si_signo).name)
                    stopping, deadline = True, time.monotonic() + WORKER_STOP_S
                _signal_all(children, forward)
            for pid, status in _reaped(children):
                index = children.pop(pid)
                if stopping and _stopped_cleanly(status):
                    continue
                failed = True
                log.error("worker %d (pid %d) %s", index, pid, _exit_text(status))
                if not stopping:
                    log.error("stopping the other %d worker processes: the server is incomplete", len(children))
                    stopping, deadline = True, time.monotonic() + WORKER_STOP_S
                    _signal_all(children, signal.SIGTERM)
            if stopping and children and time.monotonic() >= deadline:
                log.error("worker processes %s did not stop within %g s: killed",
                          ", ".join(str(pid) for pid in children), WORKER_STOP_S)
                _signal_all(children, signal.SIGKILL)
                failed, deadline = True, float("inf")
    finally:
        _close_all(groups)
        if children:  # the parent itself failed: take its workers down with it
            _signal_all(children, signal.SIGKILL)
            for pid in children:
                os.waitpid(pid, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
    return 1 if failed else 0


def _worker(index: int, parent: int, mask: set[signal.Signals], serve: Callable[[], int]) -> None:
    """A forked worker: die with the parent, take signals again, serve, and exit without
    running anything of the parent's stack (its `finally` blocks and atexit hooks are the
    parent's)."""
    code = 1
    try:
        _die_with_parent(parent)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        code = serve()
    except UsageError as exc:
        say("error", str(exc))
        code = 2
    except OperationalError as exc:
        say("failed", str(exc))
        code = 1
    except KeyboardInterrupt:
        code = 130
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported, then the worker ends with a failure
        log.exception("worker %d failed", index)
        code = 1
    finally:
        logging.shutdown()
        os._exit(code)


def _die_with_parent(parent: int) -> None:
    """Ask Linux to send SIGTERM when the parent dies; a parent already gone ends this worker."""
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _signal_all(children: dict[int, int], sig: signal.Signals) -> None:
    for pid in children:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass  # exited meanwhile: reaped next


def _reaped(children: dict[int, int]) -> list[tuple[int, int]]:
    """(pid, wait status) of every worker that ended."""
    ended = []
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            ended.append((pid, status))
    return ended


def _stopped_cleanly(status: int) -> bool:
    """How a worker asked to stop ends: exit 0, or uvicorn re-raising the stop signal after its
    graceful shutdown (killed by SIGTERM or SIGINT; 130 when SIGINT became KeyboardInterrupt)."""
    if os.WIFSIGNALED(status):
        return os.WTERMSIG(status) in STOP_SIGNALS
    return os.WEXITSTATUS(status) in (0, 130)


def _exit_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.WEXITSTATUS(status)}"
