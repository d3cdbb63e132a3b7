"""REST API benchmark: successful dry runs and real placements per second, and their latency.

    python benchmarks/api.py [--out benchmarks/results/api.json] [--requests 2000] [--placements 300]
                             [--concurrency 1,32,200] [--databases sqlite,postgresql]
                             [--kinds dry_run,place] [--baseline CHECKOUT]

Each database gets a real `vmplacer serve` (uvicorn, one process, started by
benchmarks/api_server.py) on loopback with one host on libvirt's test driver,
its built-in guest taken off so that guests fit. At each concurrency, after a
warm-up, the client sends:

- dry runs: `--requests` dry-run placements (one dedicated vCPU, 64 MiB),
  each answered 200 with placement and rendered domain XML;
- placements: `--placements` real placements (one shared vCPU, 4 MiB; the
  test driver defines the domain), each answered 201; they are deleted again
  (untimed) before the next case, so every case starts on the same host.

The client is one asyncio loop in this process (one keep-alive connection per
request in flight, plain HTTP/1.1), so the numbers are the server's, not a
thread-bound client's; it still shares the machine's CPUs with the server.
Only successful answers count: any other status is reported under `errors`.
Each case also records the server process's CPU time per request (one Python
process runs one thread at a time, so this bounds its rate), and `isolated`
holds libvirt's defineXML/undefine of a rendered placement alone.
PostgreSQL comes from $VMPLACER_TEST_POSTGRES_URL, else scripts/postgres.sh. With
`--baseline CHECKOUT` the placement cases run a second time on that checkout's code (its
benchmarks/api_server.py; the schema must be this one's), recorded under `baseline`: old and
new code measured in the same run, on the same machine load.

Targets (this 2-core machine): rps at 200 in flight >= 0.8 x rps at 1; p99 at 32 in flight < 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import host_facts  # noqa: E402

VMPLACER = str(Path(sys.executable).with_name("vmplacer"))
SERVER = str(ROOT / "benchmarks" / "api_server.py")
TARGET_SCALING = 0.8  # rps at 200 in flight / rps at 1
TARGET_P99_MS_AT_32 = 100.0
WARMUP = 200
PLACEMENT_WARMUP = 20


def machine() -> dict[str, object]:
    return {"cpu": host_facts.cpu_model(platform.machine()), "cpus": os.cpu_count(),
            "python": platform.python_version()}


load_average = host_facts.load_average


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
    """One `vmplacer serve` process with one test-driver host that has room for guests."""

    def __init__(self, directory: Path, database_url: str, server: str = SERVER):
        """`server`: the api_server.py to run (another checkout's, to measure its code)."""
        import yaml

        self.config = directory / "vmplacer.yaml"
        self.config.write_text(yaml.safe_dump({
            "data_dir": str(directory), "database_url": database_url,
            "hosts": [{"name": "h", "uri": "test:///default", "domain_type": "qemu",
                       "cpu_allocation_ratio": 64}]}))  # room for every placement of a case: 16 pCPUs
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = directory / "serve.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.token = ""
        self.server = server

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
                [sys.executable, self.server, str(self.config), "--listen", f"127.0.0.1:{self.port}",
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


# ----- the client: one asyncio loop, one keep-alive connection per request in flight ---------------------
def _request(method: str, path: str, token: str, body: dict[str, object] | None = None) -> bytes:
    payload = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n")
    return head.encode() + payload


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return int(head[9:12])


async def _load(port: int, requests: list[bytes], concurrency: int) -> tuple[float, list[tuple[float, int]]]:
    queue = list(reversed(requests))
    results: list[tuple[float, int]] = []

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while queue:
                request = queue.pop()
                started = time.perf_counter()
                try:
                    status = await _exchange(reader, writer, request)
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    status = 0
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                results.append((time.perf_counter() - started, status))
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    return time.perf_counter() - started, results


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(port: int, requests: list[bytes], concurrency: int, success: int,
             pid: int | None = None) -> dict[str, object]:
    cpu_before = cpu_seconds(pid) if pid else 0.0
    elapsed, results = asyncio.run(_load(port, requests, concurrency))
    cpu = cpu_seconds(pid) - cpu_before if pid else None
    ok = sorted(latency for latency, status in results if status == success)
    statuses: dict[str, int] = {}
    for _, status in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {
        "requests": len(requests),
        "concurrency": concurrency,
        "rps": round(len(ok) / elapsed, 1),
        "p50_ms": round(statistics.median(ok) * 1e3, 2) if ok else None,
        "p99_ms": round(ok[int(0.99 * (len(ok) - 1))] * 1e3, 2) if ok else None,
        "errors": len(results) - len(ok),
        "statuses": statuses,
        # one Python process serves: its CPU per request bounds its rate (~1 core, the GIL)
        "server_cpu_ms_per_request": round(cpu * 1e3 / len(results), 2) if cpu is not None else None,
    }


def dry_runs(token: str, count: int, tag: str) -> list[bytes]:
    return [_request("POST", "/v1/placements", token, {
        "name": f"dry-{tag}-{i}", "vcpus": 1, "memory_mib": 64, "cpu_policy": "dedicated", "dry_run": True})
        for i in range(count)]


def placements(token: str, names: list[str]) -> list[bytes]:
    return [_request("POST", "/v1/placements", token, {"name": name, "vcpus": 1, "memory_mib": 4, "define": True})
            for name in names]


def removals(token: str, names: list[str]) -> list[bytes]:
    return [_request("DELETE", f"/v1/placements/{name}", token) for name in names]


def measure(server: Serve, kind: str, count: int, concurrency: int) -> dict[str, object]:
    port, token = server.port, server.token
    tag = f"{kind}-{concurrency}"
    pid = server.process.pid if server.process is not None else None
    if kind == "dry_run":
        run_load(port, dry_runs(token, WARMUP, f"w{tag}"), concurrency, 200)
        return run_load(port, dry_runs(token, count, tag), concurrency, 200, pid)
    warm = [f"w{tag}-{i}" for i in range(PLACEMENT_WARMUP)]
    names = [f"{tag}-{i}" for i in range(count)]
    run_load(port, placements(token, warm), concurrency, 201)
    try:
        return {**run_load(port, placements(token, names), concurrency, 201, pid),
                "guests_on_host": [PLACEMENT_WARMUP, PLACEMENT_WARMUP + count]}
    finally:
        removed = run_load(port, removals(token, warm + names), 8, 200)
        if set(removed["statuses"]) - {"200", "404"}:  # type: ignore[arg-type]  # 404: never placed
            raise RuntimeError(f"cleaning up placements failed: {removed['statuses']}")


def define_cost(server: Serve, samples: int = 200) -> dict[str, object]:
    """libvirt's defineXML (and undefine) of the XML a placement renders, alone: on the test
    driver, in this process, without HTTP, database or vmplacer around it."""
    import libvirt

    answer = httpx.post(f"{server.url}/v1/placements", headers={"Authorization": f"Bearer {server.token}"},
                        json={"name": "define-cost", "vcpus": 1, "memory_mib": 4, "dry_run": True}, timeout=30)
    answer.raise_for_status()
    xml = answer.json()["xml"]
    conn = libvirt.open("test:///default")
    try:
        defines, undefines = [], []
        for _ in range(samples):
            started = time.perf_counter()
            domain = conn.defineXML(xml)
            defines.append(time.perf_counter() - started)
            started = time.perf_counter()
            domain.undefine()
            undefines.append(time.perf_counter() - started)
    finally:
        conn.close()
    return {"driver": "test:///default", "samples": samples,
            "define_ms_p50": round(statistics.median(defines) * 1e3, 3),
            "undefine_ms_p50": round(statistics.median(undefines) * 1e3, 3),
            "budget_ms_per_placement_for_p99_at_32": round(TARGET_P99_MS_AT_32 / 32, 2)}


def targets(cases: list[dict[str, object]]) -> list[dict[str, object]]:
    """Per database and kind: rps at the highest concurrency against rps at 1, and p99 at 32."""
    verdicts = []
    groups: dict[tuple[object, object], dict[object, dict[str, object]]] = {}
    for case in cases:
        groups.setdefault((case["database"], case["kind"]), {})[case["concurrency"]] = case
    for (database, kind), by_concurrency in groups.items():
        verdict: dict[str, object] = {"database": database, "kind": kind}
        if 1 in by_concurrency and 200 in by_concurrency:
            ratio = float(by_concurrency[200]["rps"]) / max(float(by_concurrency[1]["rps"]), 1e-9)  # type: ignore[arg-type]
            verdict["rps_200_over_rps_1"] = round(ratio, 2)
            verdict["scaling_met"] = ratio >= TARGET_SCALING
        if 32 in by_concurrency and by_concurrency[32]["p99_ms"] is not None:
            verdict["p99_ms_at_32"] = by_concurrency[32]["p99_ms"]
            verdict["p99_met"] = float(by_concurrency[32]["p99_ms"]) < TARGET_P99_MS_AT_32  # type: ignore[arg-type]
        verdicts.append(verdict)
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "api.json"))
    parser.add_argument("--requests", type=int, default=2000, help="dry runs per case")
    parser.add_argument("--placements", type=int, default=300, help="real placements per case")
    parser.add_argument("--concurrency", default="1,32,200")
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--kinds", default="dry_run,place")
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="also run the placement cases on this checkout's code (e.g. `git archive` of the "
                        "previous version unpacked): the same machine, database and load, for comparison")
    args = parser.parse_args(argv)
    cases: list[dict[str, object]] = []
    load_before = load_average()
    counts: dict[str, int] = {"dry_run": args.requests, "place": args.placements}
    isolated: dict[str, object] = {}
    codes = [("current", SERVER)]
    if args.baseline:
        codes.append(("baseline", str(Path(args.baseline).resolve() / "benchmarks" / "api_server.py")))
    baseline: list[dict[str, object]] = []
    for database in args.databases.split(","):
        for code, script in codes:
            kinds = args.kinds.split(",") if code == "current" else [k for k in args.kinds.split(",") if k == "place"]
            with tempfile.TemporaryDirectory(prefix="vmplacer-bench-") as tmp, \
                    Database(database, Path(tmp)) as url, Serve(Path(tmp), url, script) as server:
                if not isolated:
                    isolated = define_cost(server)
                for kind in kinds:
                    for concurrency in (int(c) for c in args.concurrency.split(",")):
                        load = load_average()
                        case = {"database": database, "kind": kind, "load_average": load,
                                **measure(server, kind, counts[kind], concurrency)}
                        (cases if code == "current" else baseline).append(case)
                        print(f"{code:8} {database:10} {kind:7} c={concurrency:<3} {case['rps']:7.1f} req/s  "
                              f"p50 {case['p50_ms']} ms  p99 {case['p99_ms']} ms  {case['statuses']}  load {load}",
                              flush=True)
    result = {
        "machine": {**machine(), "load_average": {"before": load_before, "after": load_average()}},
        "target": {"rps_200_over_rps_1": TARGET_SCALING, "p99_ms_at_32": TARGET_P99_MS_AT_32},
        "notes": "successful answers only: dry runs (200, 1 dedicated vCPU, 64 MiB, placement and rendered "
                 "XML) and real placements (201, 1 shared vCPU, 4 MiB, domain defined on libvirt's test "
                 "driver) through real HTTP to one `vmplacer serve` process; the client is one asyncio loop "
                 "in another process on the same machine. Load averages are the machine's (other work "
                 "shares it).",
        "targets": targets(cases),
        "isolated": isolated,
        "cases": cases,
    }
    if args.baseline:  # the previous code's placements, measured in the same run
        result["baseline"] = {"code": args.baseline, "cases": baseline}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
