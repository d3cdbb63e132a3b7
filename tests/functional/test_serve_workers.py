"""`vmplacer serve --workers N`: N real worker processes accepting on one address, sharing the
database (SQLite and PostgreSQL). Concurrent placements answered by different workers never
claim a pCPU twice (the claims' unique key; each worker's libvirt test driver is its own, so
the database is all they share), each job runs in one worker, a stop signal to the parent
stops every worker (PostgreSQL's run), and a worker that dies takes the server down with a
report instead of leaving it short (SQLite's run).

libvirt's test driver keeps its state in the process that opened it, and its built-in guest
holds all of its memory: the launcher takes that guest off in the parent before the workers
fork (as benchmarks/api_server.py does) and starts a small one pinned to pCPU 15 instead, so
each worker starts on the same 16-pCPU host with 15 pCPUs free and a running guest to profile.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.functional.test_api_helpers import (
    free_port,
    prepare_database,
    scratch_database,
    vmplacer,
    wait_job,
    write_config,
)
from tests.support import clean_env, run_vmplacer

WORKERS = 3
# the test driver's host has pCPUs 0-15 on two nodes; a guest defined outside vmplacer holds 15
FREE_CPUS = frozenset(range(15))
GUESTS = 24  # one dedicated pCPU each: 15 fit, 9 must be refused
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0  # only how long a hung stop is waited for before failing

LAUNCHER = """
import sys, libvirt
conn = libvirt.open("test:///default")  # kept open: the driver's state lives while a connection does
builtin = conn.lookupByName("test")
builtin.destroy()
builtin.undefine()
# a running guest of someone else's, alone on pCPU 15: what the profile jobs measure
conn.defineXML("<domain type='test'><name>theirs</name><memory>16384</memory><vcpu>1</vcpu>"
               "<cputune><vcpupin vcpu='0' cpuset='15'/></cputune><os><type>hvm</type></os></domain>").create()
from vmplacer.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


class Workers:
    """`vmplacer serve --workers N` on a test-driver host with room for guests."""

    def __init__(self, directory: Path, database_url: str, workers: int = WORKERS):
        self.database = database_url.split(":", 1)[0].split("+", 1)[0]
        self.config = write_config(directory, database_url, [{"name": "t", "uri": "test:///default",
                                                              "domain_type": "qemu"}])
        self.log_path = directory / "serve.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.process: subprocess.Popen[bytes] | None = None
        self.token = ""

    def start(self) -> Workers:
        prepare_database(self.config)
        created = vmplacer(self.config, "token", "create", "workers-test", "--scope", "admin")
        assert created.returncode == 0, created.stderr
        self.token = created.stdout.strip()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, "--config", str(self.config), "serve",
                 "--listen", f"127.0.0.1:{self.port}", "--instance", "workers-test",
                 "--workers", str(self.workers), "--isolation-every", "0"],
                stdout=log, stderr=subprocess.STDOUT, env=clean_env(), start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.log().count("Application startup complete.") < self.workers:
            if self.process.poll() is not None:
                raise AssertionError(f"vmplacer serve exited {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.workers} workers did not start within {START_TIMEOUT_S:g} s:\n"
                                     f"{self.log()}")
            time.sleep(0.1)
        return self

    def children(self) -> list[psutil.Process]:
        assert self.process is not None
        return psutil.Process(self.process.pid).children()

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(STOP_TIMEOUT_S)

    def kill(self) -> None:
        """Everything left of the server, at the end of a failed test."""
        if self.process is not None and self.process.poll() is None:
            for child in self.children():
                child.kill()
            self.process.kill()
            self.process.wait(10)


@pytest.fixture(params=["sqlite", "postgresql"])
def served(request, tmp_path):
    with scratch_database(request.param, tmp_path) as url:
        server = Workers(tmp_path, url).start()
        try:
            yield server
        finally:
            server.kill()


def _accepted_by(workers: list[psutil.Process], port: int) -> dict[int, int]:
    """Client port -> pid of the worker that holds the other end of its connection."""
    owner = {}
    for worker in workers:
        for connection in worker.net_connections(kind="tcp"):
            if connection.status == psutil.CONN_ESTABLISHED and connection.laddr.port == port and connection.raddr:
                owner[connection.raddr.port] = worker.pid
    return owner


def test_workers_share_the_database_without_claiming_a_pcpu_twice_and_end_together(served):
    workers = served.children()
    assert len(workers) == WORKERS, served.log()
    answers: dict[str, httpx.Response] = {}
    client_ports: dict[str, int] = {}
    clients = [served.client() for _ in range(GUESTS)]
    start = threading.Barrier(GUESTS)

    def place(index: int) -> None:
        name = f"w-{index}"
        start.wait()
        response = clients[index].post("/v1/placements", json={"name": name, "vcpus": 1, "memory_mib": 16,
                                                                "cpu_policy": "dedicated", "host": "t"})
        answers[name] = response
        client_ports[name] = response.extensions["network_stream"].get_extra_info("client_addr")[1]

    try:
        threads = [threading.Thread(target=place, args=(i,)) for i in range(GUESTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert len(answers) == GUESTS
        # every connection is still open (keep-alive): the worker holding it is the one that answered
        owners = _accepted_by(workers, served.port)
        answered_by = {name: owners[port] for name, port in client_ports.items()}
    finally:
        for client in clients:
            client.close()

    # the kernel spreads connections over the workers' sockets by a hash of their addresses: 24
    # connections all on one of 3 workers would be a chance of 3 in 3**24
    assert len(set(answered_by.values())) >= 2, answered_by
    placed = {name: r for name, r in answers.items() if r.status_code == 201}
    refused = {name: r for name, r in answers.items() if r.status_code != 201}
    assert all(r.status_code == 409 and r.json()["error"]["code"] == "no-fit" for r in refused.values()), \
        {name: r.text for name, r in refused.items()}
    assert len(placed) == len(FREE_CPUS), {name: r.text for name, r in refused.items()}
    with served.client() as api:  # read back from the database, through any worker
        records = {p["guest"]: p for p in api.get("/v1/placements", params={"limit": 100}).json()["placements"]}
    assert set(records) == set(placed)
    claims = [cpu for record in records.values() for cpu in record["claims"]]
    assert sorted(claims) == sorted(FREE_CPUS)  # every pCPU claimed once, none twice
    assert {n: set(r.json()["placement"]["exclusive_cpus"]) for n, r in placed.items()} == \
        {n: set(record["claims"]) for n, record in records.items()}

    _jobs_run_once_one_host_at_a_time(served)
    # how the server ends, one way per database (each is the same on both; a start costs seconds)
    if served.database == "postgresql":
        _sigterm_stops_every_worker(served, workers)
    else:
        _a_dying_worker_is_reported_and_the_others_are_stopped(served, workers)


def _jobs_run_once_one_host_at_a_time(served: Workers) -> None:
    """Every worker runs a job runner: each queued job is claimed by exactly one of them (a
    conditional update), and the host's lease keeps two jobs on one host from overlapping."""
    body = {"host": "t", "duration_s": 1.0, "t_sleep_s": 0.2, "t_m_ms": 5}
    with served.client() as api:
        first = api.post("/v1/profiles", json=body)
        assert first.status_code == 202, first.text
        done = [wait_job(api, first.json()["job"]["id"], timeout=60)]
        second = api.post("/v1/profiles", json=body)  # the host is free again: a second job, maybe elsewhere
        assert second.status_code == 202, second.text
        done.append(wait_job(api, second.json()["job"]["id"], timeout=60))
    instances = {f"workers-test-w{index}" for index in range(1, WORKERS + 1)}
    for job in done:
        assert job["status"] == "succeeded" and job["owner"] in instances, (job["owner"], job["error"])
    assert done[0]["finished_at"] <= done[1]["started_at"]


def _sigterm_stops_every_worker(served: Workers, workers: list[psutil.Process]) -> None:
    # the workers' sockets share the port (SO_REUSEPORT): another server must still be refused it
    second = vmplacer(served.config, "serve", "--listen", f"127.0.0.1:{served.port}", "--workers", "2")
    assert second.returncode == 1 and "address already in use" in second.stderr, second.stderr
    assert served.stop() == 0, served.log()
    assert served.log().count("Application shutdown complete.") == WORKERS  # each one gracefully
    assert not [w.pid for w in workers if _alive(w)]


def _a_dying_worker_is_reported_and_the_others_are_stopped(served: Workers, workers: list[psutil.Process]) -> None:
    victim, *others = workers
    victim.kill()
    assert served.process is not None
    assert served.process.wait(STOP_TIMEOUT_S) == 1, served.log()  # a server short of a worker is no server
    assert f"(pid {victim.pid}) was killed by SIGKILL" in served.log()
    assert served.log().count("Application shutdown complete.") == len(others)  # the others, gracefully
    assert not [w.pid for w in others if _alive(w)]


def _alive(process: psutil.Process) -> bool:
    return process.is_running() and process.status() != psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("value", ["0", "65", "two"])
def test_workers_outside_1_to_64_are_refused_naming_the_option(tmp_path, value):
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'vmplacer.db'}", [])
    result = run_vmplacer("--config", str(config), "serve", "--listen", f"127.0.0.1:{free_port()}",
                          "--workers", value)
    assert result.returncode == 2
    assert "--workers" in result.stderr and ("1..64" in result.stderr or "whole number" in result.stderr)
    assert not (tmp_path / "vmplacer.db").exists()  # refused before anything was touched

