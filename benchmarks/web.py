"""Web view benchmark: page sizes, server cost per page and per refresh poll, and render times in
headless Chromium, on a fleet of 1,000 hosts plus the built-in example host and a 512-pCPU host.

    python benchmarks/web.py [--out benchmarks/results/web.json] [--fleet 1000] [--requests 50] [--loads 5]

A real `vmplacer serve` (uvicorn, one process, no job runner) on loopback over SQLite, the hosts on
libvirt's test driver with capabilities files (the example host's for the fleet, a generated
2 × 2 × 64 × 2 host for "big-512"); the example host holds the placements, plan and profile runs the
browser tests use (tests/functional/web_support), and the model is learned from those runs.

Server side (httpx, one keep-alive connection, signed in with a read token): each page and each
JSON the pages poll is fetched `--requests` times after a warm-up; recorded are the body size, the
median and p95 wall time, and the server process's CPU time per request (/proc, user + system).
The fleet's first request after start-up is timed apart (it reads every host's topology once).
A poll every 10 s per open page costs the server (CPU ms per poll) / 10 000 of one core.

Browser side (Selenium + Debian's chromium, headless): the 512-pCPU host page and the fleet page
are loaded `--loads` times; recorded are the Navigation Timing medians (response end, DOM
complete, load event end) and the time of one refresh round (fetch + DOM update) on each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import host_facts  # noqa: E402

VMPLACER = str(Path(sys.executable).with_name("vmplacer"))
REFRESH_S = 10.0
BIG = "big-512"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def build(directory: Path, fleet: int) -> tuple[Path, str]:
    """The configuration and database the server reads; returns (config, read token)."""
    import yaml

    from tests.functional.web_support import big_host, record_guests, store_plan, store_profiles
    from vmplacer.adapters.db import migrate
    from vmplacer.adapters.db.api import SqlTokenStore
    from vmplacer.bootstrap import Container
    from vmplacer.config import EXAMPLE_CAPABILITIES, EXAMPLE_HOST_NAME, settings_from_mapping

    database = f"sqlite:///{directory / 'vmplacer.db'}"
    hosts = [{"name": EXAMPLE_HOST_NAME, "uri": "test:///default", "capabilities": str(EXAMPLE_CAPABILITIES)},
             {"name": BIG, "uri": "test:///default", "capabilities": str(big_host(directory))}]
    hosts += [{"name": f"f{i:04d}", "uri": "test:///default", "capabilities": str(EXAMPLE_CAPABILITIES)}
              for i in range(fleet)]
    document = {"data_dir": str(directory), "database_url": database, "hosts": hosts}
    config = directory / "vmplacer.yaml"
    config.write_text(yaml.safe_dump(document))
    migrate.upgrade(database)
    container = Container(settings_from_mapping(document, str(config), environ={}))
    try:
        record_guests(container, EXAMPLE_HOST_NAME)
        store_plan(container, EXAMPLE_HOST_NAME)
        store_profiles(container, EXAMPLE_HOST_NAME)
        token = SqlTokenStore(container.sessions).create("bench", "read")
    finally:
        container.close()
    return config, token


class Server:
    def __init__(self, config: Path, directory: Path):
        self.config = config
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = directory / "serve.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VMPLACER_")}
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [VMPLACER, "--config", str(self.config), "serve", "--listen", f"127.0.0.1:{self.port}",
                 "--log-level", "warning", "--no-jobs"], stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
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


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure_server(server: Server, token: str, paths: dict[str, str], requests: int) -> dict[str, Any]:
    assert server.process is not None
    pid = server.process.pid
    result: dict[str, Any] = {}
    with httpx.Client(base_url=server.url, headers={"Origin": server.url}, timeout=120) as client:
        answer = client.post("/ui/login", data={"token": token})
        if answer.status_code != 303:
            raise RuntimeError(f"sign-in failed: {answer.status_code} {answer.text[:200]}")
        cpu, started = cpu_seconds(pid), time.perf_counter()
        first = client.get(paths["fleet page"])
        result["fleet first request after start"] = {
            "status": first.status_code, "wall_ms": round((time.perf_counter() - started) * 1e3, 1),
            "server_cpu_ms": round((cpu_seconds(pid) - cpu) * 1e3, 1)}
        for name, path in paths.items():
            for _ in range(3):
                client.get(path)  # warm: caches filled as a browser that keeps the page open finds them
            walls = []
            cpu = cpu_seconds(pid)
            size = 0
            for _ in range(requests):
                started = time.perf_counter()
                answer = client.get(path)
                walls.append((time.perf_counter() - started) * 1e3)
                if answer.status_code != 200:
                    raise RuntimeError(f"{path}: {answer.status_code}")
                size = len(answer.content)
            cpu_ms = (cpu_seconds(pid) - cpu) * 1e3 / requests
            result[name] = {"path": path, "bytes": size, "wall_ms_p50": round(statistics.median(walls), 2),
                            "wall_ms_p95": round(_percentile(walls, 0.95), 2), "server_cpu_ms": round(cpu_ms, 2)}
            if path.startswith("/ui/api/"):
                result[name]["server_core_share_per_open_page"] = round(cpu_ms / (REFRESH_S * 1e3), 5)
            print(f"{name}: {result[name]}", flush=True)
    return result


def measure_browser(server: Server, token: str, loads: int) -> dict[str, Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1440,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                              options=options)
    result: dict[str, Any] = {"browser": driver.capabilities.get("browserVersion", "")}
    try:
        driver.get(f"{server.url}/ui/login")
        driver.find_element(By.ID, "token").send_keys(token)
        driver.find_element(By.ID, "sign-in").click()
        WebDriverWait(driver, 60).until(lambda d: d.current_url == f"{server.url}/ui/")
        for name, path, selector, expected in (("host 512 pCPUs", f"/ui/hosts/{BIG}", "#cpu-map .cpu", 512),
                                               ("fleet page", "/ui/", "#fleet-rows tr", 50)):
            timings = []
            for _ in range(loads):
                driver.get(server.url + path)
                count = len(driver.find_elements(By.CSS_SELECTOR, selector))
                if count != expected:
                    raise RuntimeError(f"{path}: {count} elements for {selector}, expected {expected}")
                timings.append(driver.execute_script("""
                    const n = performance.getEntriesByType("navigation")[0];
                    return {response_ms: n.responseEnd - n.startTime, dom_complete_ms: n.domComplete - n.startTime,
                            load_ms: n.loadEventEnd - n.startTime, transfer_bytes: n.transferSize};"""))
            refresh = [driver.execute_async_script("""
                const done = arguments[arguments.length - 1];
                const t = performance.now();
                window.vmplacerRefresh().then(() => done(performance.now() - t), (e) => done(-1));""")
                       for _ in range(loads)]
            result[name] = {key: round(statistics.median(t[key] for t in timings), 1) for key in timings[0]}
            result[name]["refresh_round_ms"] = round(statistics.median(refresh), 1)
            result[name]["loads"] = loads
            print(f"{name} in the browser: {result[name]}", flush=True)
    finally:
        driver.quit()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "web.json"))
    parser.add_argument("--fleet", type=int, default=1000, help="hosts besides the example and the 512-pCPU host")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()
    from urllib.parse import quote

    from tests.functional.web_support import DEDICATED, HOSTILE

    load_before = host_facts.load_average()
    with tempfile.TemporaryDirectory(prefix="vmplacer-web-bench-") as tmp:
        directory = Path(tmp)
        config, token = build(directory, args.fleet)
        paths = {
            "fleet page": "/ui/", "fleet poll": "/ui/api/fleet",
            "host page (example)": "/ui/hosts/example", "host poll (example)": "/ui/api/hosts/example",
            "host page 512 pCPUs": f"/ui/hosts/{BIG}", "host poll 512 pCPUs": f"/ui/api/hosts/{BIG}",
            "guest page": f"/ui/hosts/example/guests/{DEDICATED}",
            "guest page (hostile name)": f"/ui/hosts/example/guests/{quote(HOSTILE, safe='')}",
            "model page": "/ui/model", "plans page": "/ui/plans", "plan page": "/ui/plans/1",
        }
        with Server(config, directory) as server:
            served = measure_server(server, token, paths, args.requests)
            browser = measure_browser(server, token, args.loads)
    result = {
        "benchmark": "web view",
        "machine": {"cpu": host_facts.cpu_model(platform.machine()), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "load_average_before": load_before, "load_average_after": host_facts.load_average(),
        "fleet_hosts": args.fleet + 2, "requests_per_case": args.requests, "refresh_s": REFRESH_S,
        "server": served, "browser": browser,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
