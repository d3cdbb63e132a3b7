"""Running `vmplacer serve` for tests: a real uvicorn process on a free loopback port.

(Helpers only; the one test here checks the helpers' own contract.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support import VMPLACER, clean_env, run_vmplacer

START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(directory: Path, database_url: str, hosts: list[dict[str, Any]],
                 max_request_bytes: int | None = None) -> Path:
    config: dict[str, Any] = {"data_dir": str(directory), "database_url": database_url, "hosts": hosts,
                              "profiler": {"t_sleep_s": 0.2}}
    if max_request_bytes is not None:
        config["api"] = {"max_request_bytes": max_request_bytes}
    path = directory / "vmplacer.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def vmplacer(config: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_vmplacer("--config", str(config), *args, timeout=timeout)


@dataclass
class Server:
    """One `vmplacer serve` process; `url`, tokens `admin` and `read`, `client()`."""

    config: Path
    workdir: Path
    instance: str = "api-test"
    lease_ttl_s: float = 30.0
    extra_args: tuple[str, ...] = ()
    ca: Path | None = None  # serving HTTPS with this (self-signed) certificate
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    admin: str = ""
    read: str = ""

    @property
    def url(self) -> str:
        return f"{'https' if self.ca else 'http'}://127.0.0.1:{self.port}"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=str(self.ca)) if self.ca else True

    @property
    def log_path(self) -> Path:
        return self.workdir / f"serve-{self.instance}.log"

    def start(self, tokens: bool = True) -> Server:
        prepare_database(self.config)
        if tokens and not self.admin:
            self.admin = self.create_token(f"admin-{self.instance}", "admin")
            self.read = self.create_token(f"read-{self.instance}", "read")
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        tls = ("--ssl-certfile", str(self.ca), "--ssl-keyfile", str(self.ca.with_suffix(".key"))) if self.ca else ()
        self.process = subprocess.Popen(
            [VMPLACER, "--config", str(self.config), "serve", "--listen", f"127.0.0.1:{self.port}",
             "--instance", self.instance, "--lease-ttl", str(self.lease_ttl_s), *tls, *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, env=clean_env(), start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vmplacer serve exited {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0, verify=self.verify).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"vmplacer serve did not answer within {START_TIMEOUT_S:g} s:\n{self.log()}")

    def create_token(self, name: str, scope: str) -> str:
        result = vmplacer(self.config, "token", "create", name, "--scope", scope)
        if result.returncode != 0:
            raise RuntimeError(f"token create failed: {result.stderr}")
        return result.stdout.strip()

    def client(self, token: str | None = None, timeout: float = 60.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token if token is not None else self.admin}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout, verify=self.verify)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)

    def kill(self) -> None:
        """SIGKILL: a crash, no clean-up at all."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def wait_job(client: httpx.Client, job_id: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish within {timeout:g} s: {job}")


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
    assert 1024 <= port <= 65535


def make_container(database_url: str, data_dir: Path, hosts: list[dict[str, Any]] | None):  # -> Container
    """A migrated database and a container on it (for in-process apps); `hosts` None: the
    built-in host list (the example host)."""
    from vmplacer.adapters.db import migrate
    from vmplacer.bootstrap import Container
    from vmplacer.config import settings_from_mapping

    migrate.upgrade(database_url)
    document: dict[str, Any] = {"data_dir": str(data_dir), "database_url": database_url}
    if hosts is not None:
        document["hosts"] = hosts
    settings = settings_from_mapping(document, "test", environ={})
    return Container(settings)


@contextlib.contextmanager
def admin_client(database_url: str, data_dir: Path, hosts: list[dict[str, Any]] | None) -> Iterator[Any]:
    """An in-process app on a fresh container (no job runner, no journal replay) and a
    TestClient that carries an admin token; the container is closed after."""
    import warnings

    from vmplacer.adapters.db.api import SqlTokenStore
    from vmplacer.api.app import create_app
    from vmplacer.api.services import ApiOptions

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    container = make_container(database_url, data_dir, hosts)
    try:
        admin = SqlTokenStore(container.sessions).create("ops", "admin")
        app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
        with TestClient(app, raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {admin}"
            yield client
    finally:
        container.close()


def prepare_database(config: Path) -> None:
    """`vmplacer db upgrade`, as an operator does before starting instances."""
    result = vmplacer(config, "db", "upgrade")
    if result.returncode != 0:
        raise RuntimeError(f"db upgrade failed: {result.stderr}")


@contextlib.contextmanager
def scratch_database(kind: str, directory: Path) -> Iterator[str]:
    """A fresh database of `kind` (sqlite | postgresql) for a whole module's server.

    Same rules as the `postgres_url` fixture: PostgreSQL missing skips, or fails under CI=true."""
    if kind == "sqlite":
        yield f"sqlite:///{directory / 'vmplacer.db'}"
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tests.conftest import POSTGRES_ENV
    from tests.support import require

    admin_url = os.environ.get(POSTGRES_ENV)
    require(bool(admin_url), f"{POSTGRES_ENV} is not set (make test starts PostgreSQL and sets it)")
    admin = create_engine(str(admin_url), isolation_level="AUTOCOMMIT")
    name = f"vmplacer_api_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001
        admin.dispose()
        require(False, f"PostgreSQL unusable: {exc}")
    try:
        yield make_url(str(admin_url)).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE datname = :n AND backend_type = 'client backend'"),
                               {"n": name})
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


@contextlib.contextmanager
def roomy_test_driver() -> Iterator[Any]:
    """libvirt's shared test:///default with its one domain ("test", whose memory fills the
    host) out of the way, so guests fit; yields a connection to it. The driver's state lives
    as long as a connection to it is open: this one keeps it, and puts "test" back after."""
    import libvirt

    connection = libvirt.open("test:///default")
    try:
        domain = connection.lookupByName("test")
        xml = domain.XMLDesc(0)
        if domain.isActive():
            domain.destroy()
        domain.undefine()
        try:
            yield connection
        finally:
            for leftover in connection.listAllDomains():
                if leftover.isActive():
                    leftover.destroy()
                leftover.undefine()
            connection.defineXML(xml).create()
    finally:
        connection.close()
