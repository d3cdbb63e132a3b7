"""A run reads and profiles its hosts at once, on SQLite and PostgreSQL: every host's profile
runs alongside the others (each waits at a barrier only all of them reach together), never
more at once than `parallel_hosts`, each under the run's lease, renewed while they work; a
failed host fails alone; and the plan is the one a run visiting the hosts one after another
makes."""

from __future__ import annotations

import threading
import time

from tests.support import SerialisedHost
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlanStore
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer, RunOptions
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.topology.host import uniform_topology
from vmplacer.lab.simulator import SimCluster

HOSTS = ("h0", "h1", "h2", "h3")


class RealClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def fleet() -> dict[str, SerialisedHost]:
    cluster = SimCluster(seed=3, noise=0.0)
    for name in HOSTS:
        host = cluster.add_host(name, uniform_topology(nodes=1, cores_per_node=4, name=name))
        for guest in range(3):
            host.define_domain(f"{name}-g{guest}", workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    return {name: SerialisedHost(host) for name, host in cluster.hosts.items()}


def rebalancer(sessions, holder: str, *, parallel: int, profile=None, demand=None) -> Rebalancer:
    return Rebalancer(
        RebalancePorts(hosts=fleet(), plans=SqlPlanStore(sessions), leases=SqlLeaseStore(sessions),
                       clock=RealClock(), profile=profile, demand=demand, thread_safe=True),
        holder=holder, settings=RebalanceSettings(allow_migration=False, trials=False, parallel_hosts=parallel),
    )


def test_every_host_is_profiled_at_once_under_the_runs_lease(sessions):
    together = threading.Barrier(len(HOSTS), timeout=60)
    leases = SqlLeaseStore(sessions)
    held: dict[str, str | None] = {}

    def profile(host: str, seconds: float, scope) -> str:
        together.wait()  # only passes when every host's profile runs at the same time
        held[host] = leases.holders([host]).get(host, {}).get("holder")
        return f"{host} profiled"

    run = rebalancer(sessions, "fanout", parallel=len(HOSTS), profile=profile)
    report = run.run(RunOptions(profile_seconds=1.0, dry_run=True))
    steps = [s for s in report.steps if s.name.startswith("profile ")]
    assert [(s.name, s.status) for s in steps] == [(f"profile {h}", "ok") for h in HOSTS], report.to_dict()
    assert held == {h: "fanout" for h in HOSTS}
    # the report shows the overlap: each step began before any other ended
    spans = [(s.offset_s, s.offset_s + s.seconds) for s in steps]
    assert max(start for start, _ in spans) <= min(end for _, end in spans)
    assert all("offset_s" in s.to_dict() for s in steps)


def test_never_more_hosts_at_once_than_the_setting_and_a_failed_host_fails_alone(sessions):
    pairs = threading.Barrier(2, timeout=60)
    lock = threading.Lock()
    flight = {"now": 0, "most": 0}

    def profile(host: str, seconds: float, scope) -> str:
        with lock:
            flight["now"] += 1
            flight["most"] = max(flight["most"], flight["now"])
        try:
            pairs.wait()
            if host == "h2":
                raise RuntimeError("h2: the sampler found no counters")
            return f"{host} profiled"
        finally:
            with lock:
                flight["now"] -= 1

    report = rebalancer(sessions, "pairs", parallel=2, profile=profile).run(
        RunOptions(profile_seconds=1.0, dry_run=True))
    steps = {s.name: s for s in report.steps if s.name.startswith("profile ")}
    assert flight["most"] == 2
    assert [n for n in steps] == [f"profile {h}" for h in HOSTS]
    assert steps["profile h2"].status == "failed" and "no counters" in steps["profile h2"].message
    assert all(steps[f"profile {h}"].status == "ok" for h in HOSTS if h != "h2")
    assert report.plan is not None, "a failed profile leaves the old model in place: the run still plans"


def test_the_lease_is_renewed_while_hosts_are_still_profiling(sessions):
    ttl = 3.0  # renewed every max(1 s, ttl / 4) while profiles run; a profile outlives two TTLs
    leases = SqlLeaseStore(sessions)
    last: dict[str, str | None] = {}

    def profile(host: str, seconds: float, scope) -> str:
        time.sleep(2 * ttl)
        last[host] = leases.holders([host]).get(host, {}).get("holder")
        return "profiled"

    run = rebalancer(sessions, "renewing", parallel=len(HOSTS), profile=profile)
    report = run.run(RunOptions(profile_seconds=1.0, dry_run=True, lease_ttl_s=ttl))
    assert report.status in ("planned", "nothing-to-do"), report.to_dict()
    assert last == {h: "renewing" for h in HOSTS}, "a lease lapsed while its host was being profiled"


def test_hosts_are_read_at_once_and_the_plan_is_the_one_read_one_after_another(sessions):
    together = threading.Barrier(len(HOSTS), timeout=60)

    def demand(host: str, names: list[str]) -> dict[str, float]:
        together.wait()  # every host's demand window open at once
        return {name: 1.0 for name in names}

    notes: list[str] = []
    parallel = rebalancer(sessions, "wide", parallel=len(HOSTS), demand=demand).make_plan(list(HOSTS), notes=notes)
    serial = rebalancer(sessions, "narrow", parallel=1,
                        demand=lambda host, names: {name: 1.0 for name in names}).make_plan(list(HOSTS), notes=[])
    assert [a.to_dict() for a in parallel.actions] == [a.to_dict() for a in serial.actions]
    assert parallel.summary == serial.summary
    assert not any("not measured" in n for n in notes), notes
