"""REST API benchmark: dry-run placements per second and their latency.

    python benchmarks/api.py [--out benchmarks/results/api.json] [--requests 2000]
                             [--concurrency 8,32] [--drivers test,qemu] [--databases sqlite,postgresql]

Each case starts a real `vmplacer serve` (uvicorn, one process) on loopback
with one host and one database, creates a token, warms up, then sends
`--requests` dry-run placement requests (one dedicated vCPU, 64 MiB) from
`--concurrency` client threads, each with its own keep-alive connection, and
measures every request from send to full response. The client runs in this
process, on the same 2-core machine as the server: its CPU time is part of
what limits the numbers.

Drivers: `test` is libvirt's built-in test driver (test:///default). Its
built-in domain holds all of its NUMA memory, so every dry run there answers
409 with the NoFit reasons: the full request path (auth, validation, host
snapshot, allocation, reasons), but no XML rendering. `qemu` is the real
libvirtd (qemu:///system): answers are 200 with placement and domain XML when
the host has room (other guests running on it may fill its shared pool; the
status counts say what happened). PostgreSQL comes from
$VMPLACER_TEST_POSTGRES_URL (`make postgres` prints one), else scripts/postgres.sh.

Target: >= 200 dry-run placements/s with p99 < 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VMPLACER = str(Path(sys.executable).with_name("vmplacer"))
URIS = {"test": "test:///default", "qemu": "qemu:///system"}
TARGET_RPS = 200.0
TARGET_P99_MS = 100.0
WARMUP = 100


def machine() -> str:
    model = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{model}, {os.cpu_count()} CPUs{memory}, Python {platform.python_version()}"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("VMPLACER_")}


def _postgres_admin_url() -> str:
    url = os.environ.get("VMPLACER_TEST_POSTGRES_URL")
    if url:
        return url
    result = subprocess.run(["bash", str(ROOT / "scripts" / "postgres.sh")], capture_output=True, text=True,
                            check=True)
    return result.stdout.strip()


class Database:
    def __init__(self, kind: str, directory: Path):
        self.kind = kind
        self.directory = directory
        self.admin = None
        self.name = ""

    def __enter__(self) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{self.directory / 'bench.db'}"
        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        admin_url = _postgres_admin_url()
        self.admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self.name = f"vmplacer_bench_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{self.name}"'))
        return make_url(admin_url).set(database=self.name).render_as_string(hide_password=False)

    def __exit__(self, *exc: object) -> None:
        if self.admin is None:
            return
        from sqlalchemy import text

        with self.admin.connect() as connection:
            connection.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE datname = :n AND backend_type = 'client backend'"),
                               {"n": self.name})
            connection.execute(text(f'DROP DATABASE IF EXISTS "{self.name}"'))
        self.admin.dispose()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Serve:
    """One `vmplacer serve` process with one host."""

    def __init__(self, directory: Path, database_url: str, uri: str):
        import yaml

        self.config = directory / "vmplacer.yaml"
        self.config.write_text(yaml.safe_dump({
            "data_dir": str(directory), "database_url": database_url,
            "hosts": [{"name": "h", "uri": uri, "domain_type": "qemu"}]}))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = directory / "serve.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.token = ""

    def _cli(self, *args: str) -> str:
        result = subprocess.run([VMPLACER, "--config", str(self.config), *args], capture_output=True, text=True,
                                env=_env(), timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"vmplacer {' '.join(args)}: {result.stderr}")
        return result.stdout.strip()

    def __enter__(self) -> Serve:
        self._cli("db", "upgrade")
        self.token = self._cli("token", "create", "bench", "--scope", "admin")
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [VMPLACER, "--config", str(self.config), "serve", "--listen", f"127.0.0.1:{self.port}",
                 "--log-level", "warning", "--no-jobs"], stdout=log, stderr=subprocess.STDOUT, env=_env())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"vmplacer serve did not start:\n{self.log.read_text()[-3000:]}")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def run_load(url: str, token: str, requests: int, concurrency: int) -> dict[str, object]:
    local = threading.local()
    clients: list[httpx.Client] = []
    lock = threading.Lock()

    def client() -> httpx.Client:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
            with lock:
                clients.append(local.client)
        return local.client

    def one(i: int) -> tuple[float, int]:
        body = {"name": f"bench-{i}", "vcpus": 1, "memory_mib": 64, "cpu_policy": "dedicated", "dry_run": True}
        started = time.perf_counter()
        try:
            status = client().post("/v1/placements", json=body).status_code
        except httpx.HTTPError:
            status = 0
        return time.perf_counter() - started, status

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(WARMUP)))
        started = time.perf_counter()
        results = list(pool.map(one, range(requests)))
        elapsed = time.perf_counter() - started
    for c in clients:
        c.close()
    latencies = sorted(r[0] for r in results)
    statuses: dict[str, int] = {}
    for _, status in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    errors = sum(n for s, n in statuses.items() if s not in ("200", "409"))
    return {
        "requests": requests,
        "concurrency": concurrency,
        "rps": round(requests / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1e3, 2),
        "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1e3, 2),
        "errors": errors,
        "statuses": statuses,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "api.json"))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", default="8,32")
    parser.add_argument("--drivers", default="test,qemu")
    parser.add_argument("--databases", default="sqlite,postgresql")
    args = parser.parse_args(argv)
    cases = []
    load_before = os.getloadavg()
    for driver in args.drivers.split(","):
        for database in args.databases.split(","):
            with tempfile.TemporaryDirectory(prefix="vmplacer-bench-") as tmp, \
                    Database(database, Path(tmp)) as url, Serve(Path(tmp), url, URIS[driver]) as server:
                for concurrency in (int(c) for c in args.concurrency.split(",")):
                    case = {"driver": driver, "database": database,
                            **run_load(server.url, server.token, args.requests, concurrency)}
                    case["target_met"] = bool(case["rps"] >= TARGET_RPS and case["p99_ms"] < TARGET_P99_MS)
                    cases.append(case)
                    print(f"{driver:5} {database:10} c={concurrency:<3} {case['rps']:7.1f} req/s  "
                          f"p50 {case['p50_ms']:6.1f} ms  p99 {case['p99_ms']:6.1f} ms  {case['statuses']}",
                          flush=True)
    result = {
        "machine": machine(),
        "target": {"rps": TARGET_RPS, "p99_ms": TARGET_P99_MS},
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
        "notes": "dry-run placements (1 dedicated vCPU, 64 MiB) through real HTTP to one `vmplacer serve` "
                 "process; client threads in the benchmark process on the same machine. test = libvirt test "
                 "driver (its memory is full: every answer is a 409 NoFit with reasons); qemu = qemu:///system "
                 "(200 with placement and domain XML when it has room).",
        "cases": cases,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
