"""A whole rebalance round over a simulated fleet, timed on the virtual clock as the product runs it.

The real `Rebalancer` (a shared round: batches of `round_batch_hosts`), the shipped Freeze'nSense
`Profiler` for its profile steps and trial probes, the executor and the SQL plan, lease and round
stores run over `FleetHost`s, simulated hosts whose libvirt calls take the testbed's durations
(`REPIN_S`, `MIGRATION_SETUP_S`). The round keeps the product's concurrency: hosts are read,
measured and profiled `parallel_hosts` at a time (app/host_fanout.py) and a plan's lanes run at
once (the executor's `lanes=`), on real threads.

Time on one virtual clock, with work done at once accounted at once (`ForkJoinClock`):

* the caller's thread owns the round's time; every task the product hands to a worker pool (one
  host's read, profile or measurement, one lane of a plan) runs on a timeline of its own that
  starts where the caller stood when the pool was made (the fork), so sleeps in one task never
  delay another;
* when the pool closes (the join), the caller's time moves to the fork plus the span the pool's
  own rule gives those task durations: tasks in submission order, each to the first of
  `max_workers` slots to come free (for_each_host submits in order and starts the next one
  whenever one ends). So a step over N hosts costs its slowest hosts per batch of
  `parallel_hosts`, not their sum; with one worker it is the sum. Which real thread ran which
  task does not matter (durations do), so the time is the same however the machine scheduled
  the threads;
* the hosts of one pool's tasks are disjoint (one host per task; lanes share no host), and every
  task starts no earlier than its hosts were last touched, so each host's own time only moves
  forward and its guests' progress is integrated as before.

The controller's own computing (learning, planning) does not sleep on the clock: it is measured
in CPU seconds and added to the round's time on its critical path (`RoundResult.round_s`).
"""

from __future__ import annotations

import heapq
import random
import resource
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from vmplacer.app import host_fanout
from vmplacer.app.apply.executor import ExecutorSettings
from vmplacer.app.observe import freeze
from vmplacer.app.observe.freeze import Freezer
from vmplacer.app.observe.profiler import Profiler, ProfilerConfig, measured_of
from vmplacer.app.rebalance.rebalancer import ROUNDS_PER_PROFILE, RebalancePorts, Rebalancer, RunOptions, RunReport
from vmplacer.core.model.interference import InterferenceModel, Observation
from vmplacer.core.model.pairs import PairTable
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.rebalance.trial import Measured
from vmplacer.core.topology.host import HostTopology, uniform_topology
from vmplacer.lab.profiling import LAB_WATCHDOG_S, Profiled, ProfileSettings, _MemoryJournal, _SampleLog, observations_of
from vmplacer.lab.simulator import SimCluster, SimHost, VirtualClock
from vmplacer.ports import Hypervisor

# What one live libvirt call that changes a running guest takes: `pinVcpuFlags(..., AFFECT_LIVE)`
# measured ≈ 1.1 ms on the testbed (docs/testbed.md); the emulator pin, the bandwidth
# and the metadata writes are calls of the same kind.
REPIN_S = 0.0011
# A live migration's fixed cost beyond copying memory: the testbed moved a 128 MiB guest in ≈ 10 s
# (docs/testbed.md), of which copying at the configured 1000 MiB/s is 0.13 s.
# Counted on every migration on top of memory / bandwidth (what SimHost.migrate sleeps).
MIGRATION_SETUP_S = 10.0
# The vCPU demand window of a host read (bootstrap/rebalance.py DEMAND_WINDOW_S): the round
# measures each running guest's demand over it while reading the host.
DEMAND_WINDOW_S = 1.0
# The shipped profiler defaults (examples/vmplacer.yaml `profiler:`).
T_M_S = 0.010
T_SLEEP_S = 10.0
PAIR_PROBES = 4
MAX_FREEZE_S = 0.5


# --------------------------------------------------------------------------- the clock
@dataclass(frozen=True)
class FanOut:
    """One pool's work: its tasks' own durations (submission order), its slots, when it forked and
    the span the pool's rule gives (the caller's time moved by it at the join)."""

    kind: str
    forked_at: float
    slots: int
    durations: tuple[float, ...]
    span_s: float


def pool_span(durations: Sequence[float], slots: int) -> float:
    """The time `durations` take on `slots` workers when each task, in order, goes to the first
    worker to come free: the rule of app/host_fanout.py (and of any thread pool fed in order)."""
    if slots < 1:
        raise ValueError(f"slots must be at least 1, got {slots}")
    free = [0.0] * min(slots, max(1, len(durations)))
    for duration in durations:
        heapq.heappush(free, heapq.heappop(free) + duration)
    return max(free)


class _Timeline:
    """One task's own time; threads working for the task (its freezer's) share it."""

    def __init__(self, now: float):
        self.now = now


class ForkJoinClock(VirtualClock):
    """A virtual clock whose worker tasks keep time of their own (see the module's docstring)."""

    def __init__(self, start: float = 0.0):
        super().__init__(start)
        self._local = threading.local()
        self._lock = threading.Lock()
        self.fan_outs: list[FanOut] = []

    def timeline(self) -> _Timeline | None:
        """The calling thread's task timeline (None: the caller's own, the round's time)."""
        return getattr(self._local, "timeline", None)

    def now(self) -> float:
        own = self.timeline()
        return self._now if own is None else own.now

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot sleep a negative time ({seconds} s)")
        own = self.timeline()
        if own is None:
            self._now += seconds
        else:
            own.now += seconds

    @contextmanager
    def on(self, timeline: _Timeline | None) -> Iterator[None]:
        """Run the calling thread on `timeline` (a task's, shared; None: the round's time)."""
        outer = self.timeline()
        self._local.timeline = timeline
        try:
            yield
        finally:
            self._local.timeline = outer

    def join(self, until: float) -> None:
        """The calling thread's time moves to `until` if that is later (the end of a fan-out)."""
        own = self.timeline()
        if own is None:
            self._now = max(self._now, until)
        else:
            own.now = max(own.now, until)

    def record(self, fan_out: FanOut) -> None:
        with self._lock:
            self.fan_outs.append(fan_out)


def task_kind(work: Callable[..., Any]) -> str:
    """Which step of the round a pool's work is, from the product's function that does it."""
    name = getattr(work, "__qualname__", "")
    for marker, kind in (("_profile_step", "profile"), ("_read_host", "read"),
                         ("_measure_before_trials", "measure"), ("_run_lanes", "lanes")):
        if marker in name:
            return kind
    return "other"


class ForkJoinPool(ThreadPoolExecutor):
    """A thread pool whose tasks each run on their own timeline of a `ForkJoinClock`, and whose
    close moves the caller's time by the pool's span (`pool_span`). Real threads, as the product's."""

    def __init__(self, clock: ForkJoinClock, max_workers: int | None = None, thread_name_prefix: str = "",
                 **kwargs: Any):
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix, **kwargs)
        self._clock = clock
        self._slots = self._max_workers
        self._forked_at = clock.now()  # made by the caller, in its thread
        self._durations: list[float] = []
        self._kind = "other"

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        index = len(self._durations)
        self._durations.append(0.0)
        if index == 0:
            self._kind = task_kind(fn)
        clock, start, durations = self._clock, self._forked_at, self._durations

        def timed() -> Any:
            timeline = _Timeline(start)
            with clock.on(timeline):
                try:
                    return fn(*args, **kwargs)
                finally:
                    durations[index] = timeline.now - start

        return super().submit(timed)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        if not self._durations:
            return
        span = pool_span(self._durations, self._slots)
        self._clock.join(self._forked_at + span)
        self._clock.record(FanOut(self._kind, self._forked_at, self._slots, tuple(self._durations), span))
        self._durations = []


class HelperPool(ThreadPoolExecutor):
    """A thread pool that works for the task that made it (a profiler's freezer): each call runs
    on that task's timeline, which the task waits on."""

    def __init__(self, clock: ForkJoinClock, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._clock = clock
        self._timeline = clock.timeline()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        clock, timeline = self._clock, self._timeline

        def on_timeline() -> Any:
            with clock.on(timeline):
                return fn(*args, **kwargs)

        return super().submit(on_timeline)


@contextmanager
def fork_join(clock: ForkJoinClock) -> Iterator[None]:
    """While inside, the product's fan-outs (app/host_fanout.py, used by the rebalancer and the
    executor) run their pools as `ForkJoinPool`s of `clock`, and a freezer's workers run on the
    timeline of the task that froze."""
    def pool(*args: Any, **kwargs: Any) -> ForkJoinPool:
        return ForkJoinPool(clock, *args, **kwargs)

    def helpers(*args: Any, **kwargs: Any) -> HelperPool:
        return HelperPool(clock, *args, **kwargs)

    with mock.patch.object(host_fanout, "ThreadPoolExecutor", pool), \
            mock.patch.object(freeze, "ThreadPoolExecutor", helpers):
        yield


# --------------------------------------------------------------------------- the fleet
class FleetHost(SimHost):
    """A simulated host whose live changes take what they take on a real one (REPIN_S per call,
    MIGRATION_SETUP_S more per migration), on the caller's timeline."""

    def _live_call(self) -> None:
        self._cluster.clock.sleep(REPIN_S)

    def pin_vcpu(self, name: str, vcpu: int, cpus: frozenset[int]) -> None:
        self._live_call()
        super().pin_vcpu(name, vcpu, cpus)

    def pin_emulator(self, name: str, cpus: frozenset[int]) -> None:
        self._live_call()
        super().pin_emulator(name, cpus)

    def set_exclusive_cpus(self, name: str, cpus: frozenset[int]) -> None:
        self._live_call()
        super().set_exclusive_cpus(name, cpus)

    def set_cpu_bandwidth(self, name: str, bandwidth: Any) -> None:
        self._live_call()
        super().set_cpu_bandwidth(name, bandwidth)

    def migrate(self, name: str, destination: Hypervisor, *, bandwidth_mib_s: int | None = None,
                timeout_s: float | None = None) -> None:
        self._cluster.clock.sleep(MIGRATION_SETUP_S)
        super().migrate(name, destination, bandwidth_mib_s=bandwidth_mib_s,
                        timeout_s=None if timeout_s is None else max(0.0, timeout_s - MIGRATION_SETUP_S))


@dataclass(frozen=True)
class FleetShape:
    """Hosts of `nodes` × `cores_per_node` × `threads_per_core` pCPUs, each with `guests` one-vCPU
    guests pinned to random pCPUs (stacked: a rebalance has moves to make), workloads drawn from
    the truth's pair table, memory drawn from `memory_gib`."""

    guests: int = 40
    nodes: int = 2
    cores_per_node: int = 12
    threads_per_core: int = 2
    memory_gib: tuple[int, ...] = (1, 2, 4, 8)

    def topology(self, name: str) -> HostTopology:
        return uniform_topology(nodes=self.nodes, cores_per_node=self.cores_per_node,
                                threads_per_core=self.threads_per_core, name=name)


def add_fleet_host(cluster: SimCluster, name: str, topology: HostTopology) -> FleetHost:
    """A FleetHost in `cluster` (as SimCluster.add_host adds a SimHost)."""
    if name in cluster.hosts:
        raise ValueError(f"simulated host {name!r} already exists")
    host = FleetHost(name, topology, cluster)
    cluster.hosts[name] = host
    return host


def fleet(truth: PairTable, hosts: int, shape: FleetShape = FleetShape(), *, seed: int = 0,
          noise: float = 0.03, clock: ForkJoinClock | None = None) -> SimCluster:
    """`hosts` FleetHosts named h0000… (seeded), on `clock`."""
    cluster = SimCluster(truth, seed=seed, noise=noise, clock=clock or ForkJoinClock())
    rng = random.Random(seed)
    workloads = list(truth.workloads)
    if not workloads:
        raise ValueError(f"pair table {truth.source!r} names no workload")
    cpus = shape.nodes * shape.cores_per_node * shape.threads_per_core
    for index in range(hosts):
        name = f"h{index:04d}"
        host = add_fleet_host(cluster, name, shape.topology(name))
        for guest in range(shape.guests):
            host.define_domain(f"{name}-vm{guest:02d}", workload=rng.choice(workloads),
                               vcpupin=[rng.randrange(cpus)], workload_class="batch",
                               memory_kib=rng.choice(shape.memory_gib) * 1024 * 1024)
    return cluster


def profiler_config(seconds: float) -> ProfilerConfig:
    """The profiler a round's profile step or probe of `seconds` runs, as the product builds it
    (bootstrap/rebalance.py): the shipped defaults, t_sleep a tenth of the run, until `seconds`."""
    return ProfilerConfig(t_m_s=T_M_S, t_sleep_s=min(T_SLEEP_S, max(0.2, seconds / ROUNDS_PER_PROFILE)),
                          max_freeze_s=MAX_FREEZE_S, pair_probes=PAIR_PROBES, duration_s=seconds)


# --------------------------------------------------------------------------- the round
@dataclass
class RoundResult:
    """One round: the report, its time split by step (virtual seconds plus the controller's own
    computing), and what it did."""

    hosts: int
    report: RunReport
    virtual_s: float  # the clock's time at the end of the round (waits, on the critical path)
    phases: dict[str, float]  # profile, learn, plan, apply: virtual seconds plus computing
    compute_s: dict[str, float]  # learn, plan: CPU seconds of the controller on the critical path
    fan_outs: list[FanOut]
    counts: dict[str, Any]
    cpu_s: float  # process CPU seconds of the whole round (simulation included)
    # CPU seconds of the threads running profiler runs (the product's profiler and the simulated hosts;
    # their freezers' helper threads not counted)
    profiler_cpu_s: float
    wall_s: float
    peak_rss_mib: float
    plans: list[Any] = field(default_factory=list)

    @property
    def round_s(self) -> float:
        return self.virtual_s + sum(self.compute_s.values())


class FleetRound:
    """The product's rebalancer over a simulated fleet, with the production steps wired the way
    bootstrap/rebalance.py wires them: Freeze'nSense profile and probes, a model learned from
    the round's samples, vCPU demand measured while reading, the SQL stores at `url`."""

    def __init__(self, cluster: SimCluster, url: str, *, settings: RebalanceSettings | None = None,
                 executor_settings: ExecutorSettings | None = None, solver: Any = None,
                 config_for: Callable[[float], ProfilerConfig] = profiler_config):
        from vmplacer.adapters.db.engine import make_engine, make_session_factory
        from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlanStore
        from vmplacer.adapters.db.rounds import SqlRoundStore

        if not isinstance(cluster.clock, ForkJoinClock):
            raise ValueError("a fleet round needs a cluster on a ForkJoinClock")
        self.cluster = cluster
        self.clock: ForkJoinClock = cluster.clock
        self.config_for = config_for
        self.engine = make_engine(url)
        sessions = make_session_factory(self.engine)
        self.plans = SqlPlanStore(sessions)
        self.model = InterferenceModel()
        self._observations: list[Observation] = []
        self._lock = threading.Lock()
        self.profiler_runs = 0
        self.profiler_cpu_s = 0.0
        self.learn_cpu_s = 0.0
        self.settings = settings or RebalanceSettings()
        self.rebalancer = Rebalancer(
            RebalancePorts(hosts=dict(cluster.hosts), plans=self.plans, leases=SqlLeaseStore(sessions),
                           rounds=SqlRoundStore(sessions), clock=self.clock, load_model=lambda: self.model,
                           learn=self._learn, profile=self._profile, probe=self._probe, demand=self._demand,
                           solver=solver, thread_safe=True),
            holder="fleet-round", settings=self.settings,
            executor_settings=executor_settings or ExecutorSettings(migration_bandwidth_mib_s=1000),
        )

    def close(self) -> None:
        self.engine.dispose()

    # ----- the steps, as production wires them ---------------------------------------------------
    def _profile(self, host_name: str, seconds: float, scope: Sequence[str]) -> Measured:
        cpu = time.thread_time()
        host = self.cluster.hosts[host_name]
        config = self.config_for(seconds)
        freezer = Freezer(host, _MemoryJournal(), max_freeze_s=max(LAB_WATCHDOG_S, config.max_freeze_s),
                          owner={"process": "vmplacer-lab"}, workers=1, clock=self.clock.now)
        samples = _SampleLog()
        profiler = Profiler(host, self.cluster.sampler(host), freezer, config, store=samples,
                            topology=host.topology(), clock=self.clock, wall=self.clock.now)
        try:
            result = profiler.run()
        finally:
            freezer.close()
        found = observations_of(host, Profiled(result, samples.samples), ProfileSettings())
        with self._lock:
            self._observations.extend(found)
            self.profiler_runs += 1
            self.profiler_cpu_s += time.thread_time() - cpu
        return measured_of(host_name, result.vms, f"{len(found)} observations, {result.rounds} rounds")

    def _probe(self, host_name: str, seconds: float) -> Measured:
        return self._profile(host_name, seconds, ("*",))

    def _demand(self, host_name: str, names: list[str]) -> dict[str, float]:
        """Each running guest's demand over the product's window: what it asks of its pCPU."""
        host = self.cluster.hosts[host_name]
        self.clock.sleep(DEMAND_WINDOW_S)
        return {d.name: float(d.labels.get("load", "1.0")) for d in host.domains() if d.name in names}

    def _learn(self) -> str:
        cpu = time.thread_time()
        with self._lock:
            new, self._observations = self._observations, []
        for observation in new:
            self.model.update(observation)
        self.learn_cpu_s += time.thread_time() - cpu
        return f"{len(new)} new observations; the model holds {self.model.observations}"

    # ----- the round ------------------------------------------------------------------------------
    def run(self, *, profile_seconds: float = 10.0, lease_ttl_s: float = 900.0) -> RoundResult:
        """One `rebalance --all-hosts --profile-seconds N` round over every host of the cluster."""
        hosts = sorted(self.cluster.hosts)
        started, cpu, wall = self.clock.now(), time.process_time(), time.perf_counter()
        options = RunOptions(share=True, batch_hosts=self.settings.round_batch_hosts, lease_ttl_s=lease_ttl_s,
                             profile_seconds=profile_seconds, round_rest_s=self.settings.round_rest_s)
        with fork_join(self.clock):
            report = self.rebalancer.run(options)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        virtual = self.clock.now() - started
        plans = [self.plans.get(b["plan_id"]) for b in (report.round.batches if report.round else ())
                 if b["plan_id"] is not None]
        compute = {"learn": self.learn_cpu_s, "plan": report.plan_cpu_s}
        phases = self._phases(report, virtual, compute)
        return RoundResult(
            hosts=len(hosts), report=report, virtual_s=virtual, phases=phases, compute_s=compute,
            fan_outs=list(self.clock.fan_outs), counts=self._counts(report, plans), cpu_s=cpu,
            profiler_cpu_s=self.profiler_cpu_s, wall_s=wall,
            peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, plans=plans)

    def _phases(self, report: RunReport, virtual: float, compute: dict[str, float]) -> dict[str, float]:
        """The round's time by step: profile, learn, plan (reading and measuring the hosts, then
        planning), apply (trial measurements before, then the lanes). The profile steps are what
        the round's time leaves to the others; checked against the profile pools' spans (and the
        hosts profiled alone, where a batch had one host)."""
        steps = {name: sum(s.seconds for s in report.steps if s.name == name) for name in ("learn", "plan", "apply")}
        profile = virtual - sum(steps.values())
        batches = report.round.batches if report.round else []
        alone = {b["hosts"][0] for b in batches if len(b["hosts"]) == 1}
        expected = sum(f.span_s for f in self.clock.fan_outs if f.kind == "profile")
        expected += sum(s.seconds for s in report.steps if s.name.startswith("profile ")
                        and (s.name.split(" ", 1)[1] in alone or self.settings.parallel_hosts == 1))
        if abs(profile - expected) > 1e-6 * max(1.0, virtual):
            raise AssertionError(f"the round's profile time ({profile:.6f} s: its time on the clock less the other "
                                 f"steps) is not its profile pools' span ({expected:.6f} s)")
        return {"profile": profile, "learn": steps["learn"] + compute["learn"],
                "plan": steps["plan"] + compute["plan"], "apply": steps["apply"]}

    def _counts(self, report: RunReport, plans: list[Any]) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        states: dict[str, int] = {}
        trials = {"trials": 0, "kept": 0, "undone": 0}
        for plan in plans:
            for action in plan.actions:
                kinds[action.kind] = kinds.get(action.kind, 0) + 1
                states[action.state] = states.get(action.state, 0) + 1
                if action.kind == "probe" and action.parameters.get("trial"):
                    trials["trials"] += 1
                    trials["kept"] += action.state == "succeeded"
                    trials["undone"] += action.state == "rolled_back"
        done = report.round.done_here if report.round else []
        planned = sorted(h for plan in plans for h in plan.hosts)
        return {"hosts_done": len(done), "hosts_planned": len(planned), "hosts_planned_once": planned == sorted(set(planned)),
                "batches": len(report.round.batches) if report.round else 0, "plans": len(plans),
                "plan_states": _tally(p.state for p in plans), "actions": kinds, "action_states": states,
                "profiler_runs": self.profiler_runs, **trials,
                "migrations": kinds.get("migrate", 0), "repins": kinds.get("repin", 0),
                "probes": kinds.get("probe", 0)}


def _tally(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts
