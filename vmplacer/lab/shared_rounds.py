"""Several rebalancing instances sharing one database, on a simulated fleet.

Each instance is its own OS process with its own copy of the same seeded
fleet (`simulated_fleet`): a host is planned and applied by exactly one
instance per round, so each copy is right about the hosts its process did.
The functional tests and benchmarks/fleet_rounds.py start instances with
`run_instance`, which uses the real stores (plans, leases, rounds) on the
database at `url`.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

from vmplacer.lab.simulator import SimCluster
from vmplacer.core.topology.host import uniform_topology


class WallClock:
    """Real time: leases expire in the database's time, so waiting must be real too."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def simulated_fleet(hosts: int, guests: int, *, seed: int = 0, nodes: int = 2, cores_per_node: int = 6,
                    threads_per_core: int = 2) -> SimCluster:
    """`hosts` hosts named h000…, each running `guests` one-vCPU guests pinned at random (seeded:
    every process builds the same fleet), stacked enough that a rebalance has moves to make."""
    cluster = SimCluster(seed=seed, noise=0.0)
    rng = random.Random(seed)
    cpus = nodes * cores_per_node * threads_per_core
    for index in range(hosts):
        name = f"h{index:03d}"
        host = cluster.add_host(name, uniform_topology(nodes=nodes, cores_per_node=cores_per_node,
                                                       threads_per_core=threads_per_core, name=name))
        for guest in range(guests):
            host.define_domain(f"{name}-vm{guest:02d}", workload="spin", vcpupin=[rng.randrange(max(1, cpus // 3))],
                               memory_kib=256 * 1024)
    return cluster


def run_instance(url: str, holder: str, *, hosts: int, guests: int, batch_hosts: int, lease_ttl_s: float,
                 profile_s: float = 0.0, hang_in_profile: bool = False, start_at: float | None = None,
                 out: str | None = None, seed: int = 0, barrier: Any = None,
                 parallel_hosts: int = 1) -> dict[str, Any]:
    """One instance's `rebalance --all` (shared round) over the simulated fleet; its report as a
    dict, with the process's CPU seconds. `profile_s`: a profiling step that takes this long per
    host (a real one profiles for seconds); `hang_in_profile`: never come back from the first
    profile (an instance to be killed while it holds leases). `start_at`: a wall-clock moment
    to start at, so instances start together; `barrier` (a multiprocessing.Barrier): wait there
    for the other instances once everything is loaded. `out`: also write the report there as JSON.
    `parallel_hosts`: hosts of a batch read and profiled at once (1: one after another)."""
    from vmplacer.adapters.db.engine import make_engine, make_session_factory
    from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlanStore
    from vmplacer.adapters.db.rounds import SqlRoundStore
    from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer, RunOptions
    from vmplacer.core.rebalance.state import RebalanceSettings

    cluster = simulated_fleet(hosts, guests, seed=seed)
    engine = make_engine(url)
    sessions = make_session_factory(engine)

    def profile(host: str, seconds: float, scope: Any) -> str:
        if hang_in_profile:
            time.sleep(3600)
        time.sleep(seconds)
        return f"{host}: profiled {seconds:g} s"

    rebalancer = Rebalancer(
        RebalancePorts(hosts=dict(cluster.hosts), plans=SqlPlanStore(sessions), leases=SqlLeaseStore(sessions),
                       rounds=SqlRoundStore(sessions), clock=WallClock(),
                       profile=profile if (profile_s > 0 or hang_in_profile) else None,
                       thread_safe=parallel_hosts > 1),
        holder=holder, settings=RebalanceSettings(allow_migration=False, trials=False, cooldown_s=0.0,
                                                  parallel_hosts=parallel_hosts),
    )
    options = RunOptions(share=True, batch_hosts=batch_hosts, lease_ttl_s=lease_ttl_s,
                         profile_seconds=profile_s if not hang_in_profile else 1.0)
    if barrier is not None:
        barrier.wait(300)
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        report = rebalancer.run(options)
    finally:
        engine.dispose()
    result = {"holder": holder, "pid": os.getpid(), "wall_s": time.perf_counter() - wall,
              "cpu_s": time.process_time() - cpu, "plan_cpu_s": report.plan_cpu_s, **report.to_dict()}
    if out is not None:
        Path(out).write_text(json.dumps(result))
    return result
