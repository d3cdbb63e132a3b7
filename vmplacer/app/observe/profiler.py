"""The Freeze'nSense profiler: the seed's Algorithm 1 on one host.

    loop:
        for vm in sensitive VMs:
            freeze every other running domain (in parallel), sample vm for t_m -> ζb, resume
        sleep t_sleep, sampling ζ of every VM without freezing at a random moment of it

One loop iteration is a round; its length is K_s·(t_m + freeze latency) +
t_sleep, so the neighbours' frozen share is the seed's Eq. 5.1 with the
latency added.

Pair probes (`pair_probes` per round): everything but a sensitive VM and one
neighbour is frozen, and both are sampled. Next to ζb, such a sample is one
equation in a single β at a known distance, where a ζ sample mixes every
neighbour's: a model learned from ζ alone cannot tell which neighbour costs
what, and it is exactly that split a move away from one neighbour depends on.
The pairs probed least so far go first. Each probe adds one freeze to the round.

ζ windows are placed at a random point of the sleep, never right after a
resume: a vCPU thread that was paused gets the scheduler's wake-up credit for
a few milliseconds, which would bias a ζ window taken just then.

Adaptive mode (seed §5.6): each VM has a level a in [-2, 2] set from the
spread of its recent ζb samples. A noisy VM (a > 0) is sampled for t_m·2^a
every 2^a rounds; a stable VM (a < 0) for t_m·2^a, 2^-a times per round (the
extra samples at random moments of the sleep). Either way its frozen time per
round stays t_m on average: more, shorter samples where one sample says
little about the next, fewer longer ones where short windows are dominated by
short-term swings.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmplacer.app.observe.freeze import FreezeAborted, Freezer, FreezeReport, ReplayReport
from vmplacer.app.observe.frozen_share import FrozenShareGate
from vmplacer.core.model.profile_stats import Distribution, degradation, measured_share, overhead_formula
from vmplacer.core.topology.host import Cpu, DistanceClass, HostTopology
from vmplacer.core.rebalance.frozen_share import UNSAMPLED_KIND
from vmplacer.core.rebalance.trial import Measured
from vmplacer.ports import (
    WORKLOAD_CLASS_LABEL,
    Clock,
    DomainFacts,
    DomainStatus,
    FreezableHost,
    HypervisorError,
    Neighbour,
    ProfileSample,
    ProfileStore,
    Sample,
    Sampler,
    SystemClock,
)

log = logging.getLogger(__name__)

UNKNOWN_DISTANCE = "unknown"
SAME_CPU_DISTANCE = DistanceClass.SAME_CPU.value
FACTS_REFRESH_S = 30.0
REPLAY_EVERY_S = 10.0
# A vCPU thread resumed from a pause gets the scheduler's wake-up credit for a few
# milliseconds (CFS places it behind min_vruntime by up to half its latency target).
SETTLE_S = 0.05  # re-check the host at least this often while waiting
# Adaptive mode: levels scale t_m and the interval by 2**level.
ADAPT_LEVELS = (-2, 2)
ADAPT_WINDOW = 16  # recent ζb samples judged
ADAPT_EVERY = 8  # valid ζb samples between two decisions
ADAPT_STABLE_CV = 0.05
ADAPT_NOISY_CV = 0.25
LATENCY_FREEZES = 16  # recent freezes whose span tells the frozen-share gate what the next one costs


class ProfilerError(RuntimeError):
    """The run cannot go on (nothing to profile, a named VM missing); the message names it.

    `bad_input` is True when the operator named something that is not there."""

    def __init__(self, message: str, *, bad_input: bool = False):
        super().__init__(message)
        self.bad_input = bad_input


# ----- configuration ----------------------------------------------------------------------


@dataclass(frozen=True)
class SensitiveSelector:
    """Which VMs get ζb (are frozen around): all, named ones, by label, by workload class."""

    names: frozenset[str] = frozenset()
    labels: tuple[tuple[str, str], ...] = ()
    workload_class: str | None = None

    @classmethod
    def parse(cls, spec: str, names: Sequence[str] = ()) -> SensitiveSelector:
        """`all`, `label:KEY=VALUE` or `class:NAME` (e.g. class:latency-critical)."""
        spec = spec.strip()
        if spec == "all":
            return cls(frozenset(names))
        if spec.startswith("label:") and "=" in spec[6:]:
            key, value = spec[6:].split("=", 1)
            if key:
                return cls(frozenset(names), labels=((key, value),))
        if spec.startswith("class:") and spec[6:]:
            return cls(frozenset(names), workload_class=spec[6:])
        raise ValueError(f"sensitive set must be all, label:KEY=VALUE or class:NAME, got {spec!r}")

    def matches(self, name: str, facts: DomainFacts | None) -> bool:
        if self.names and name not in self.names:
            return False
        labels = facts.labels if facts else {}
        if any(labels.get(key) != value for key, value in self.labels):
            return False
        if self.workload_class is not None and labels.get(WORKLOAD_CLASS_LABEL) != self.workload_class:
            return False
        return True

    def describe(self) -> str:
        parts = [f"names={sorted(self.names)}"] if self.names else []
        parts += [f"label {k}={v}" for k, v in self.labels]
        if self.workload_class:
            parts.append(f"class {self.workload_class}")
        return ", ".join(parts) or "all"


@dataclass(frozen=True)
class ProfilerConfig:
    t_m_s: float = 0.010
    t_sleep_s: float = 10.0
    max_freeze_s: float = 0.5
    sensitive: SensitiveSelector = field(default_factory=SensitiveSelector)
    excluded: tuple[str, ...] = ()  # glob patterns: never frozen (still measured)
    scope: tuple[str, ...] = ("*",)  # glob patterns: domains the profiler considers at all
    samples: int | None = None  # stop once every sensitive VM has this many valid ζ and ζb
    duration_s: float | None = None  # ... or after this long
    adaptive: bool = False
    t_m_min_s: float = 0.001
    t_m_max_s: float | None = None  # default: half of max_freeze_s
    pair_probes: int = 0  # per round: freeze all but a sensitive VM and one neighbour, sample both
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.t_m_s > 0:
            raise ValueError(f"t_m must be positive, got {self.t_m_s * 1e3:g} ms")
        if self.t_sleep_s < 0:
            raise ValueError(f"t_sleep must not be negative, got {self.t_sleep_s:g} s")
        if not self.max_freeze_s > 0:
            raise ValueError(f"max_freeze must be positive, got {self.max_freeze_s * 1e3:g} ms")
        if self.t_m_s >= self.max_freeze_s:
            raise ValueError(
                f"t_m ({self.t_m_s * 1e3:g} ms) must be shorter than max_freeze "
                f"({self.max_freeze_s * 1e3:g} ms): suspend, resume and the sample reads need time too"
            )
        if self.samples is not None and self.samples < 1:
            raise ValueError(f"samples must be at least 1, got {self.samples}")
        if self.pair_probes < 0:
            raise ValueError(f"pair_probes must not be negative, got {self.pair_probes}")

    @property
    def t_m_ceiling_s(self) -> float:
        return min(self.t_m_max_s or self.max_freeze_s / 2, self.max_freeze_s / 2)

    def in_scope(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.scope)

    def is_excluded(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.excluded)

    def to_dict(self) -> dict[str, Any]:
        return {
            "t_m_ms": self.t_m_s * 1e3,
            "t_sleep_s": self.t_sleep_s,
            "max_freeze_ms": self.max_freeze_s * 1e3,
            "sensitive": self.sensitive.describe(),
            "excluded": list(self.excluded),
            "scope": list(self.scope),
            "samples": self.samples,
            "duration_s": self.duration_s,
            "adaptive": self.adaptive,
            "pair_probes": self.pair_probes,
        }


# ----- results ------------------------------------------------------------------------------


@dataclass
class VmProfile:
    name: str
    sensitive: bool
    zeta: list[float] = field(default_factory=list)
    zeta_b: list[float] = field(default_factory=list)
    pair_samples: int = 0  # valid samples with one neighbour running (pair probes)
    dropped: Counter[str] = field(default_factory=Counter)
    t_m_s: float = 0.0
    neighbours: tuple[Neighbour, ...] = ()  # at the latest ζb sample

    def summary(self) -> dict[str, Any]:
        zeta, zeta_b = Distribution.of(self.zeta), Distribution.of(self.zeta_b)
        loss = degradation(self.zeta, self.zeta_b)
        return {
            "sensitive": self.sensitive,
            "t_m_ms": round(self.t_m_s * 1e3, 3),
            "zeta": zeta.to_dict() if zeta else None,
            "zeta_b": zeta_b.to_dict() if zeta_b else None,
            "degradation": loss.to_dict() if loss else None,
            "pair_samples": self.pair_samples,
            "dropped": dict(self.dropped),
            "neighbours": [{"name": n.name, "distance": n.distance, "frozen": n.frozen}
                           for n in self.neighbours],
        }


@dataclass
class ProfileResult:
    host: str
    metric: str
    run_id: int | None
    config: ProfilerConfig
    vms: dict[str, VmProfile] = field(default_factory=dict)
    wall_s: float = 0.0
    frozen_s: float = 0.0
    freezes: int = 0
    pair_freezes: int = 0  # of `freezes`: pair probes
    rounds: int = 0
    aborted_freezes: Counter[str] = field(default_factory=Counter)
    watchdog_fired: int = 0
    suspend_ms: list[float] = field(default_factory=list)
    resume_ms: list[float] = field(default_factory=list)
    span_ms: list[float] = field(default_factory=list)
    replays: list[dict[str, Any]] = field(default_factory=list)
    stopped_because: str = ""
    # the frozen-share gate's limit and the guests it kept running (app/observe/frozen_share.py)
    frozen_share: dict[str, Any] | None = None

    @property
    def k_s(self) -> int:
        return sum(1 for vm in self.vms.values() if vm.sensitive)

    def overhead(self) -> dict[str, float | int]:
        """Measured O_h (share of wall time the neighbours were frozen) next to Eq. 5.1."""
        # The mean, not the median: overhead is a time average, and freeze latencies on a
        # busy host have a long tail.
        span = Distribution.of(self.span_ms)
        latency_s = max(0.0, (span.mean / 1e3 - self.config.t_m_s)) if span else 0.0
        per_round = self.k_s + (self.pair_freezes / self.rounds if self.rounds else 0.0)
        return {
            "k_s": self.k_s,
            "pair_probes_per_round": round(per_round - self.k_s, 3),
            "measured": self.frozen_s / self.wall_s if self.wall_s > 0 else 0.0,
            "formula": overhead_formula(per_round, self.config.t_m_s, self.config.t_sleep_s),
            "formula_with_latency": overhead_formula(
                per_round, self.config.t_m_s + latency_s, self.config.t_sleep_s),
            "freeze_latency_ms": latency_s * 1e3,
        }

    def to_dict(self) -> dict[str, Any]:
        def p50(values: list[float]) -> float | None:
            dist = Distribution.of(values)
            return round(dist.p50, 3) if dist else None

        return {
            "host": self.host,
            "metric": self.metric,
            "run_id": self.run_id,
            "parameters": self.config.to_dict(),
            "wall_s": round(self.wall_s, 3),
            "frozen_s": round(self.frozen_s, 6),
            "freezes": self.freezes,
            "pair_freezes": self.pair_freezes,
            "aborted_freezes": dict(self.aborted_freezes),
            "watchdog_fired": self.watchdog_fired,
            "freeze_ms": {"suspend_p50": p50(self.suspend_ms), "resume_p50": p50(self.resume_ms),
                          "span_p50": p50(self.span_ms)},
            "overhead": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.overhead().items()},
            "stopped_because": self.stopped_because,
            "vms": {name: vm.summary() for name, vm in sorted(self.vms.items())},
        } | ({"frozen_share": self.frozen_share} if self.frozen_share is not None else {})


def measured_of(host: str, vms: Mapping[str, VmProfile], message: str) -> Measured:
    """Each profiled guest's measured share of its isolated performance (`measured_share`: what a
    measured trial compares, core/rebalance/trial.py), backed by its fewer kind of samples."""
    performance: dict[str, float] = {}
    samples: dict[str, int] = {}
    for name, vm in sorted(vms.items()):
        share = measured_share(vm.zeta, vm.zeta_b)
        if share is None:
            continue
        performance[name] = share
        samples[name] = min(len(vm.zeta), len(vm.zeta_b))
    return Measured(host, performance, samples, message)


@dataclass(frozen=True)
class Progress:
    """Emitted after every sample, for progress bars."""

    vm: str
    kind: str  # zeta | zeta_b | zeta_p
    valid: bool
    zeta: int  # valid samples so far
    zeta_b: int
    target: int | None


# ----- helpers -----------------------------------------------------------------------------


def neighbour_distance(topology: HostTopology | None, mine: frozenset[int] | None,
                       theirs: frozenset[int] | None) -> str:
    """The closest distance class between any pCPU of one VM and any of the other's: the first
    level, pCPU → core → L2 → LLC → node, at which their pCPUs share a group (what
    `HostTopology.distance_class` of the closest pair says, without trying every pair: two VMs
    floating over a 256-pCPU node would be 65,536 pairs per neighbour and sample)."""
    if topology is None or not mine or not theirs:
        return UNKNOWN_DISTANCE
    ours = [topology.cpus[c] for c in mine if c in topology.cpus]
    other = [topology.cpus[c] for c in theirs if c in topology.cpus]
    if not ours or not other:
        return UNKNOWN_DISTANCE
    levels: tuple[tuple[DistanceClass, Callable[[Cpu], int | None]], ...] = (
        (DistanceClass.SAME_CPU, lambda cpu: cpu.id),
        (DistanceClass.SAME_CORE, lambda cpu: cpu.core),
        (DistanceClass.SAME_L2, lambda cpu: cpu.l2),
        (DistanceClass.SAME_LLC, lambda cpu: cpu.llc),
        (DistanceClass.SAME_NODE, lambda cpu: cpu.node),
    )
    for distance, group in levels:
        shared = {group(cpu) for cpu in ours} & {group(cpu) for cpu in other}
        shared.discard(None)  # an L2 or LLC the host does not report is shared by nobody
        if shared:
            return distance.value
    return DistanceClass.REMOTE_NODE.value


@dataclass
class _Schedule:
    level: int = 0
    rounds_waited: int = 0  # rounds since its last ζb (noisy VMs wait 2**level rounds)
    since_decision: int = 0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=ADAPT_WINDOW))


# ----- the profiler ----------------------------------------------------------------------------


class Profiler:
    def __init__(
        self,
        host: FreezableHost,
        sampler: Sampler,
        freezer: Freezer,
        config: ProfilerConfig,
        *,
        store: ProfileStore | None = None,
        topology: HostTopology | None = None,
        clock: Clock | None = None,
        wall: Callable[[], float] = time.time,
        replay: Callable[[], ReplayReport] | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        on_phase: Callable[[str], None] | None = None,
        frozen_share: FrozenShareGate | None = None,
    ):
        """`frozen_share`: the limit on each guest's frozen share of the last hour, checked
        before every freeze (None: no limit, as for the protection loop's own budgeted runs)."""
        self.host = host
        self.sampler = sampler
        self.freezer = freezer
        self.config = config
        self.store = store
        self.topology = topology
        self.clock: Clock = clock or SystemClock()
        self.wall = wall
        self.replay = replay
        self.on_progress = on_progress or (lambda _p: None)
        self.on_phase = on_phase or (lambda _p: None)
        self.frozen_share = frozen_share
        self.rng = random.Random(config.seed)
        self._facts: dict[str, DomainFacts] = {}
        self._facts_at = -math.inf
        self._schedules: dict[str, _Schedule] = {}
        self._last_replay = -math.inf
        self._last_resume = -math.inf
        self._pairs_probed: Counter[frozenset[str]] = Counter()
        self._unsampled: ProfileSample | None = None  # the last freeze, until a sample of it is stored

    # ----- public ----------------------------------------------------------------------
    def run(self, stop: Callable[[], bool] = lambda: False) -> ProfileResult:
        """Profile until `samples`/`duration_s` is reached or `stop()` says so."""
        metric = getattr(self.sampler, "metric", "?")
        result = ProfileResult(self.host.name, metric, None, self.config)
        self._maybe_replay(result, force=True)
        states = self._states_in_scope()
        self._check_named_vms(states)
        if self.store is not None:
            result.run_id = self.store.start_run(self.host.name, metric, self.config.to_dict())
        if self.frozen_share is not None:
            self.frozen_share.start(self.host.name, result.run_id)
        started = self.clock.now()
        status = "failed"
        try:
            while True:
                why = self._should_stop(result, started, stop)
                if why:
                    result.stopped_because = why
                    break
                why = self._tick(result)
                if why:
                    result.stopped_because = why
                    break
                result.wall_s = self.clock.now() - started
            status = "finished"
        except KeyboardInterrupt:
            result.stopped_because = "interrupted"
            status = "interrupted"
            raise
        finally:
            result.wall_s = self.clock.now() - started
            if self.frozen_share is not None:
                result.frozen_share = self.frozen_share.to_dict()
            if self.store is not None and result.run_id is not None:
                self.store.finish_run(result.run_id, result.to_dict(), status)
        return result

    # ----- one scheduler step --------------------------------------------------------------
    def _tick(self, result: ProfileResult) -> str:
        """One round of Algorithm 1; returns a reason to stop, or "" to go on."""
        self._maybe_replay(result)
        all_states = self.host.domain_states()
        states = {n: s for n, s in all_states.items() if self.config.in_scope(n)}
        running = sorted(n for n, s in states.items() if s.running)
        self._refresh_facts(all_states, running)
        sensitive = [n for n in running if self.config.sensitive.matches(n, self._facts.get(n))]
        if not sensitive:
            if any(vm.sensitive for vm in result.vms.values()):
                return "no sensitive VM runs any more"
            raise ProfilerError(
                f"host {self.host.name}: no running domain matches the sensitive set "
                f"({self.config.sensitive.describe()})")
        for name in running:
            vm = result.vms.get(name)
            if vm is None:
                vm = result.vms[name] = VmProfile(name, name in sensitive, t_m_s=self.config.t_m_s)
                self._schedules[name] = _Schedule()
                prepare = getattr(self.sampler, "prepare", None)
                if prepare is not None:
                    prepare([name])
            vm.sensitive = name in sensitive

        # 1. for app in sensitive: stop(rest); after t_m: ζb(app) = ζ(app); start(rest)
        extra: list[str] = []  # further short samples of stable VMs, taken during the sleep
        frozen_samples: list[ProfileSample] = []
        for name in sensitive:
            schedule = self._schedules[name]
            schedule.rounds_waited += 1
            if not self._wants_more(result.vms[name], "zeta_b"):
                continue
            if schedule.rounds_waited < 2 ** max(schedule.level, 0):
                continue
            schedule.rounds_waited = 0
            frozen_samples += self._sample_isolated(result, name)
            extra += [name] * (2 ** max(-schedule.level, 0) - 1)
        for first, second in self._pairs_to_probe(sensitive, running):
            frozen_samples += self._sample_pair(result, first, second)
        result.rounds += 1

        # 2. sleep(t_sleep), with the ζ window (and stable VMs' extra samples) at random moments;
        #    the database writes happen here too, while nothing is frozen.
        begin = self.clock.now()
        self._store(result, frozen_samples)
        window = max((self._t_m(n) for n in running), default=self.config.t_m_s)
        room = max(self.config.t_sleep_s - window, SETTLE_S)
        events: list[tuple[float, str]] = [(self.rng.uniform(SETTLE_S, room), "")]
        events += [(self.rng.uniform(SETTLE_S, room), name) for name in extra]
        for offset, name in sorted(events):
            wait = begin + offset - self.clock.now()
            if wait > 0:
                self.clock.sleep(wait)
            if name:
                if self._wants_more(result.vms[name], "zeta_b"):
                    self._store(result, self._sample_isolated(result, name))
                continue
            due = [n for n in running if self._wants_more(result.vms[n], "zeta")]
            if due:
                self._store(result, self._sample_shared(result, due, all_states))
        rest = begin + self.config.t_sleep_s - self.clock.now()
        if rest > 0:
            self.clock.sleep(rest)
        return ""

    def _store(self, result: ProfileResult, samples: list[ProfileSample]) -> None:
        if samples and self.store is not None and result.run_id is not None:
            self.store.add_samples(result.run_id, samples)

    # ----- ζb: the frozen sample -------------------------------------------------------------
    def _sample_isolated(self, result: ProfileResult, name: str) -> list[ProfileSample]:
        return self._or_unsampled(self._isolated_sample(result, name))

    def _or_unsampled(self, samples: list[ProfileSample]) -> list[ProfileSample]:
        """The samples a freeze gave, or, when it gave none (dropped, watchdog, aborted halfway),
        a record of the freeze itself: the frozen-share gate counts every pause that happened."""
        unsampled, self._unsampled = self._unsampled, None
        return samples or ([unsampled] if unsampled is not None else [])

    def _isolated_sample(self, result: ProfileResult, name: str) -> list[ProfileSample]:
        vm = result.vms[name]
        t_m = self._t_m(name)
        vm.t_m_s = t_m
        taken = self._frozen_sample(result, (name,), t_m)
        if isinstance(taken, str):
            if taken:
                vm.dropped[taken] += 1
                self._progress(vm, "zeta_b", False)
            return []
        samples, report, states = taken
        sample = samples.get(name)
        if sample is None or not sample.valid:
            vm.dropped[(sample.reason if sample else "no sample").split(":")[0]] += 1
            self._progress(vm, "zeta_b", False)
            return []
        neighbours = self._neighbours(name, states, frozen=set(report.frozen))
        vm.zeta_b.append(sample.value)
        vm.neighbours = neighbours
        self._adapt(name, sample.value)
        self._progress(vm, "zeta_b", True)
        return [ProfileSample(name, "zeta_b", sample.metric, sample.value, sample.window_s, t_m * 1e3,
                              self.wall(), neighbours, freeze_ms=report.span_ms)]

    def _frozen_sample(self, result: ProfileResult, keep: tuple[str, ...], t_m: float,
                       ) -> tuple[dict[str, Sample], FreezeReport, dict[str, DomainStatus]] | str:
        """Samples of `keep` over t_m while every other domain in scope and not excluded is
        frozen: (samples, the freeze's report, the states read before it), or why there are
        none ("" when reading the states failed: nothing was frozen, no VM to blame)."""
        try:
            states = self._states_in_scope(all_domains=True)
        except HypervisorError as exc:
            result.aborted_freezes[f"states: {exc}"[:80]] += 1
            return ""
        others = [n for n in states
                  if n not in keep and self.config.in_scope(n) and not self.config.is_excluded(n)]
        if self.frozen_share is not None:
            named = set(self.frozen_share.spared)
            spared = self.frozen_share.spare(others, t_m + self._freeze_latency(result), self.wall())
            if spared:
                if set(spared) - named:  # said once per guest and run
                    log.info("host %s: %s frozen their share of the last hour, left running",
                             self.host.name, ", ".join(sorted(set(spared) - named)))
                could = any(states[n].running for n in others)
                others = [n for n in others if n not in spared]
                if could and not any(states[n].running for n in others):
                    return "frozen share"  # nothing left to freeze: the sample would not be isolated
        samples: dict[str, Sample] = {}
        report = None
        try:
            with self.freezer.freeze(others, states) as report:
                self.on_phase("sampling")
                token = self.sampler.begin(list(keep))
                self.clock.sleep(t_m)
                samples = self.sampler.end(token)
        except FreezeAborted as exc:
            result.aborted_freezes[str(exc).split(":")[0] if not exc.domain else "suspend failed"] += 1
            log.warning("%s", exc)
            return "freeze aborted"
        finally:
            self._account(result, report, pair=len(keep) > 1)
            self._unsampled = self._freeze_record(result, keep, t_m, report)
        assert report is not None
        if report.watchdog_fired:
            return "watchdog"  # the freeze outlived max_freeze: not isolated to the end
        return samples, report, states

    def _freeze_latency(self, result: ProfileResult) -> float:
        """What a freeze lasts beyond its window lately (suspend and resume): the median of the
        last LATENCY_FREEZES spans past t_m, 0 before the first."""
        recent = sorted(result.span_ms[-LATENCY_FREEZES:])
        if not recent:
            return 0.0
        return max(0.0, recent[len(recent) // 2] / 1e3 - self.config.t_m_s)

    def _account(self, result: ProfileResult, report: FreezeReport | None, *, pair: bool = False) -> None:
        if report is not None and report.frozen:
            if self.frozen_share is not None:
                self.frozen_share.record(self.wall(), report.span_ms / 1e3, report.frozen)
            self._last_resume = self.clock.now()
            result.freezes += 1
            result.pair_freezes += pair
            result.frozen_s += report.span_ms / 1e3
            result.suspend_ms.append(report.suspend_ms)
            result.resume_ms.append(report.resume_ms)
            result.span_ms.append(report.span_ms)
            if report.watchdog_fired:
                result.watchdog_fired += 1

    def _freeze_record(self, result: ProfileResult, keep: tuple[str, ...], t_m: float,
                       report: FreezeReport | None) -> ProfileSample | None:
        """A freeze as the frozen-share history stores it when no sample of it is (only with the
        gate on: other readers of a store know ζ, ζb and ζp)."""
        if self.frozen_share is None or report is None or not report.frozen:
            return None
        frozen = tuple(Neighbour(name, UNKNOWN_DISTANCE, True) for name in sorted(report.frozen))
        return ProfileSample(keep[0], UNSAMPLED_KIND, result.metric, report.span_ms / 1e3, t_m, t_m * 1e3,
                             self.wall(), frozen, freeze_ms=report.span_ms)

    # ----- pair probes: one neighbour running -------------------------------------------------
    def _pairs_to_probe(self, sensitive: list[str], running: list[str]) -> list[tuple[str, str]]:
        """Up to `pair_probes` (sensitive VM, neighbour) pairs, least probed first.

        A pair qualifies when both are pinned (the distance is what the sample teaches),
        not on one pCPU (that is time sharing, no β), the neighbour can be frozen, and
        some third domain is frozen meanwhile (else the probe is just a ζ sample)."""
        budget = self.config.pair_probes
        if budget <= 0:
            return []
        freezable = [n for n in running if not self.config.is_excluded(n)]
        if len(freezable) < 3:
            return []
        candidates: dict[frozenset[str], None] = {}  # ordered, and a set
        for name in sensitive:
            mine = self._facts.get(name)
            for other in freezable:
                pair = frozenset((name, other))
                if other == name or pair in candidates:
                    continue
                theirs = self._facts.get(other)
                distance = neighbour_distance(self.topology, mine.pcpus if mine else None,
                                              theirs.pcpus if theirs else None)
                if distance in (UNKNOWN_DISTANCE, SAME_CPU_DISTANCE):
                    continue
                candidates[pair] = None
        order = list(candidates)
        self.rng.shuffle(order)
        order.sort(key=lambda pair: self._pairs_probed[pair])
        chosen = order[:budget]
        for pair in chosen:
            self._pairs_probed[pair] += 1
        return [tuple(sorted(pair)) for pair in chosen]  # type: ignore[misc]

    def _sample_pair(self, result: ProfileResult, first: str, second: str) -> list[ProfileSample]:
        return self._or_unsampled(self._pair_sample(result, first, second))

    def _pair_sample(self, result: ProfileResult, first: str, second: str) -> list[ProfileSample]:
        pair = (first, second)
        t_m = max(self._t_m(name) for name in pair)
        taken = self._frozen_sample(result, pair, t_m)
        if isinstance(taken, str):
            return []
        samples, report, states = taken
        if not report.frozen or not all(name in states and states[name].running for name in pair):
            return []  # nothing else was frozen (a ζ sample), or one of the pair was not running
        stored = []
        for name in pair:
            sample = samples.get(name)
            vm = result.vms.get(name)
            if vm is None or sample is None or not sample.valid:
                continue
            vm.pair_samples += 1
            self._progress(vm, "zeta_p", True)
            stored.append(ProfileSample(name, "zeta_p", sample.metric, sample.value, sample.window_s, t_m * 1e3,
                                        self.wall(), self._neighbours(name, states, frozen=set(report.frozen)),
                                        freeze_ms=report.span_ms))
        return stored

    # ----- ζ: shared samples, no freezing -----------------------------------------------------
    def _sample_shared(self, result: ProfileResult, names: list[str],
                       states: dict[str, DomainStatus]) -> list[ProfileSample]:
        groups: dict[float, list[str]] = {}
        for name in names:
            groups.setdefault(self._t_m(name), []).append(name)
        stored: list[ProfileSample] = []
        # Let the scheduler's wake-up credit of just-resumed neighbours wear off first.
        settle = self._last_resume + SETTLE_S - self.clock.now()
        if settle > 0:
            self.clock.sleep(settle)
        for t_m, members in sorted(groups.items()):
            token = self.sampler.begin(members)
            self.clock.sleep(t_m)
            samples = self.sampler.end(token)
            at = self.wall()
            for name in members:
                vm = result.vms[name]
                sample = samples.get(name)
                if sample is None or not sample.valid:
                    vm.dropped[(sample.reason if sample else "no sample").split(":")[0]] += 1
                    self._progress(vm, "zeta", False)
                    continue
                vm.zeta.append(sample.value)
                self._progress(vm, "zeta", True)
                stored.append(ProfileSample(name, "zeta", sample.metric, sample.value, sample.window_s,
                                            t_m * 1e3, at, self._neighbours(name, states, frozen=set())))
        return stored

    # ----- bookkeeping ----------------------------------------------------------------------
    def _states_in_scope(self, all_domains: bool = False) -> dict[str, DomainStatus]:
        states = self.host.domain_states()
        if all_domains:
            return states
        return {n: s for n, s in states.items() if self.config.in_scope(n)}

    def _check_named_vms(self, states: dict[str, DomainStatus]) -> None:
        for name in sorted(self.config.sensitive.names):
            status = states.get(name)
            if status is None:
                raise ProfilerError(f"VM {name}: not found on host {self.host.name}"
                                    + ("" if self.config.in_scope(name) else " (outside the profiling scope)"),
                                    bad_input=True)
            if not status.running:
                raise ProfilerError(f"VM {name}: is {status.state}"
                                    + (f" ({status.pause_reason})" if status.pause_reason else "")
                                    + f" on host {self.host.name}; only running VMs can be profiled",
                                    bad_input=True)

    def _refresh_facts(self, all_states: dict[str, DomainStatus], running: list[str]) -> None:
        """Pinning and labels of every domain (neighbours outside the scope count too)."""
        now = self.clock.now()
        missing = [n for n in running if n not in self._facts]
        if missing or now - self._facts_at > FACTS_REFRESH_S:
            self._facts = self.host.domain_facts(sorted(all_states))
            self._facts_at = now

    def _neighbours(self, name: str, states: dict[str, DomainStatus], frozen: set[str]) -> tuple[Neighbour, ...]:
        mine = self._facts.get(name)
        result = []
        for other, status in sorted(states.items()):
            if other == name or not (status.running or other in frozen):
                continue
            theirs = self._facts.get(other)
            result.append(Neighbour(
                other,
                neighbour_distance(self.topology, mine.pcpus if mine else None, theirs.pcpus if theirs else None),
                other in frozen,
            ))
        return tuple(result)

    def _wants_more(self, vm: VmProfile, kind: str) -> bool:
        if self.config.samples is None:
            return True
        return len(vm.zeta_b if kind == "zeta_b" else vm.zeta) < self.config.samples

    def _should_stop(self, result: ProfileResult, started: float, stop: Callable[[], bool]) -> str:
        if stop():
            return "stopped"
        if self.config.duration_s is not None and self.clock.now() - started >= self.config.duration_s:
            return "duration reached"
        if self.config.samples is not None and result.vms:
            sensitive = [vm for vm in result.vms.values() if vm.sensitive]
            if sensitive and all(len(vm.zeta_b) >= self.config.samples and len(vm.zeta) >= self.config.samples
                                 for vm in sensitive):
                return "samples reached"
            limit = 3 * self.config.samples + 10
            stuck = [vm.name for vm in sensitive if sum(vm.dropped.values()) > limit]
            if stuck:
                return f"too many dropped samples: {', '.join(stuck)}"
        return ""

    def _maybe_replay(self, result: ProfileResult, force: bool = False) -> None:
        if self.replay is None:
            return
        now = self.clock.now()
        if not force and now - self._last_replay < REPLAY_EVERY_S:
            return
        self._last_replay = now
        report = self.replay()
        if report.resumed or report.errors:
            result.replays.append(report.to_dict())

    def _progress(self, vm: VmProfile, kind: str, valid: bool) -> None:
        self.on_progress(Progress(vm.name, kind, valid, len(vm.zeta), len(vm.zeta_b), self.config.samples))

    # ----- adaptive sampling (seed §5.6) ---------------------------------------------------------
    def _t_m_bounds(self) -> tuple[float, float]:
        base = self.config.t_m_s
        return min(self.config.t_m_min_s, base), max(self.config.t_m_ceiling_s, base)

    def _t_m(self, name: str) -> float:
        level = self._schedules[name].level if name in self._schedules else 0
        low, high = self._t_m_bounds()
        return min(max(self.config.t_m_s * 2.0 ** level, low), high)

    def _adapt(self, name: str, value: float) -> None:
        schedule = self._schedules[name]
        schedule.recent.append(value)
        if not self.config.adaptive:
            return
        schedule.since_decision += 1
        if schedule.since_decision < ADAPT_EVERY or len(schedule.recent) < ADAPT_EVERY:
            return
        schedule.since_decision = 0
        spread = Distribution.of(list(schedule.recent))
        assert spread is not None
        low, high = ADAPT_LEVELS
        shortest, longest = self._t_m_bounds()
        base = self.config.t_m_s
        if (spread.cv < ADAPT_STABLE_CV and schedule.level > low
                and base * 2.0 ** (schedule.level - 1) >= shortest):
            schedule.level -= 1  # stable: shorter, more frequent freezes
        elif (spread.cv > ADAPT_NOISY_CV and schedule.level < high
              and base * 2.0 ** (schedule.level + 1) <= longest):
            schedule.level += 1  # noisy: longer windows average the short-term swings out
        else:
            return
        schedule.recent.clear()
        log.info("VM %s: adaptive level %d, t_m %.1f ms (cv %.3f)",
                 name, schedule.level, self._t_m(name) * 1e3, spread.cv)
