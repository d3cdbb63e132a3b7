"""The profiler loop (Algorithm 1) on a fake host whose domains share pCPUs.

The fake host keeps real run states and a log of every suspend/resume; the
fake sampler reports each domain's CPU share from how many running domains
share its pCPU at that moment — so the expected ζ, ζb and degradation follow
from the pinning, not from numbers written into the tests.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

from vmplacer.app.observe.freeze import Freezer
from vmplacer.app.observe.profiler import (
    Profiler,
    ProfilerConfig,
    ProfilerError,
    SensitiveSelector,
    neighbour_distance,
)
from vmplacer.core.model.profile_stats import overhead_formula
from vmplacer.core.topology.host import uniform_topology
from vmplacer.ports import DomainFacts, DomainGone, DomainStatus, HypervisorError, Sample


# ----- fakes (also used by tests/functional/test_freeze.py) ----------------------------------


@dataclass
class FakeDomain:
    name: str
    pcpus: frozenset[int] | None = None
    state: str = "running"
    reason: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    uuid: str = ""

    def __post_init__(self) -> None:
        self.uuid = self.uuid or f"00000000-0000-0000-0000-{abs(hash(self.name)) % 10**12:012d}"


class FakeHost:
    """A FreezableHost with libvirt's semantics: suspend of a paused domain is a no-op,
    resume of a running one is fine, unknown names raise DomainGone."""

    def __init__(self, *domains: FakeDomain, name: str = "fake"):
        self.name = name
        self.domains = {d.name: d for d in domains}
        self.log: list[tuple[str, str, float]] = []
        self.lock = threading.Lock()
        self.suspend_delay: dict[str, float] = {}
        self.fail_suspend: dict[str, Exception] = {}
        self.fail_resume: dict[str, int] = {}  # name -> how many resumes fail first
        self.on_suspend = None

    def domain_states(self) -> dict[str, DomainStatus]:
        with self.lock:
            return {n: DomainStatus(n, d.uuid, d.state, d.reason) for n, d in self.domains.items()}

    def suspend(self, name: str) -> None:
        if self.on_suspend is not None:
            self.on_suspend(name)
        if name in self.suspend_delay:
            time.sleep(self.suspend_delay[name])
        if name in self.fail_suspend:
            raise self.fail_suspend[name]
        with self.lock:
            domain = self.domains.get(name)
            if domain is None:
                raise DomainGone(f"domain {name} gone", host=self.name, domain=name)
            self.log.append(("suspend", name, time.perf_counter()))
            if domain.state == "running":
                domain.state, domain.reason = "paused", "user"

    def resume(self, name: str) -> None:
        with self.lock:
            if self.fail_resume.get(name, 0) > 0:
                self.fail_resume[name] -= 1
                raise HypervisorError(f"resume {name}: daemon hiccup", host=self.name, domain=name)
            domain = self.domains.get(name)
            if domain is None:
                raise DomainGone(f"domain {name} gone", host=self.name, domain=name)
            self.log.append(("resume", name, time.perf_counter()))
            if domain.state == "paused":
                domain.state, domain.reason = "running", None

    def domain_facts(self, names: list[str]) -> dict[str, DomainFacts]:
        return {n: DomainFacts(self.domains[n].pcpus, dict(self.domains[n].labels))
                for n in names if n in self.domains}

    def running(self) -> set[str]:
        with self.lock:
            return {n for n, d in self.domains.items() if d.state == "running"}


class ShareSampler:
    """ζ = the share of its pCPU a domain gets: 1 / (running domains on that pCPU)."""

    metric = "cpu"

    def __init__(self, host: FakeHost, hang: dict[str, float] | None = None,
                 values: dict[str, list[float]] | None = None):
        self.host = host
        self.hang = hang or {}
        self.values = {k: list(v) for k, v in (values or {}).items()}
        self.begins: list[tuple[list[str], set[str]]] = []

    def _share(self, name: str) -> float:
        if name in self.values and self.values[name]:
            return self.values[name].pop(0)
        mine = self.host.domains[name].pcpus or frozenset()
        running = self.host.running()
        crowd = sum(1 for n in running if (self.host.domains[n].pcpus or frozenset()) & mine)
        return 1.0 / max(crowd, 1)

    def begin(self, domains: list[str]) -> object:
        self.begins.append((list(domains), self.host.running()))
        return ({n: self._share(n) for n in domains}, time.perf_counter())

    def end(self, token: object) -> dict[str, Sample]:
        shares, started = token  # type: ignore[misc]
        for name in shares:
            if name in self.hang:
                time.sleep(self.hang.pop(name))  # once
        window = time.perf_counter() - started
        return {n: Sample(n, self.metric, v, window) for n, v in shares.items()}


class MemoryJournal:
    def __init__(self):
        self.rows: dict[int, dict] = {}
        self.next_id = 1

    def open(self, host, domains, max_freeze_s, owner):
        entry = self.next_id
        self.next_id += 1
        self.rows[entry] = {"host": host, "domains": list(domains), "owner": owner,
                            "deadline": time.time() + max_freeze_s}
        return entry

    def close(self, entry_id):
        self.rows.pop(entry_id, None)

    def pending(self, host=None):
        return []


class VirtualClock:
    """Profiler time that advances only when the profiler sleeps (thread-safe)."""

    def __init__(self):
        self.t = 1000.0
        self.lock = threading.Lock()

    def now(self) -> float:
        with self.lock:
            return self.t

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.t += max(seconds, 0.0)


def make_profiler(host, config, sampler=None, clock=None, topology=None, freezer_clock=None, store=None):
    sampler = sampler or ShareSampler(host)
    freezer = Freezer(host, MemoryJournal(), max_freeze_s=config.max_freeze_s, owner={"pid": 0},
                      clock=freezer_clock or time.perf_counter)
    profiler = Profiler(host, sampler, freezer, config, clock=clock or VirtualClock(), topology=topology,
                        store=store)
    return profiler, freezer, sampler


# ----- Algorithm 1 ---------------------------------------------------------------------------


def test_each_sample_runs_with_every_other_running_domain_frozen_and_only_those():
    host = FakeHost(
        FakeDomain("a", frozenset({0})), FakeDomain("b", frozenset({0})), FakeDomain("c", frozenset({1})),
        FakeDomain("paused-by-user", frozenset({1}), state="paused", reason="user"),
        FakeDomain("infra-dns", frozenset({1})), FakeDomain("other-tenant", frozenset({1})),
        FakeDomain("stopped", frozenset({0}), state="shutoff"),
    )
    config = ProfilerConfig(t_m_s=0.01, t_sleep_s=0.1, samples=3, excluded=("infra-*",),
                            scope=("a", "b", "c", "paused-*", "infra-*", "stopped"))
    profiler, freezer, sampler = make_profiler(host, config)
    result = profiler.run()
    freezer.close()

    # excluded domains are never frozen but still measured; out-of-scope ones are ignored
    measured = {"a", "b", "c", "infra-dns"}
    frozen_samples = [(names, running) for names, running in sampler.begins if len(names) == 1]
    assert {names[0] for names, _ in frozen_samples} == measured
    for names, running in frozen_samples:
        # while ζb(x) is sampled, x runs and so do only the domains that must not be frozen
        assert running == {names[0], "infra-dns", "other-tenant"}
    touched = {name for _, name, _ in host.log}
    assert touched == {"a", "b", "c"}
    suspends = Counter(name for op, name, _ in host.log if op == "suspend")
    resumes = Counter(name for op, name, _ in host.log if op == "resume")
    assert suspends == resumes
    assert host.running() == {"a", "b", "c", "infra-dns", "other-tenant"}
    assert host.domains["paused-by-user"].state == "paused"
    assert result.stopped_because == "samples reached"
    assert {name for name, vm in result.vms.items() if vm.sensitive} == measured


def test_degradation_follows_the_pinning():
    host = FakeHost(FakeDomain("a", frozenset({0})), FakeDomain("b", frozenset({0})),
                    FakeDomain("c", frozenset({1})))
    profiler, freezer, _ = make_profiler(host, ProfilerConfig(t_m_s=0.01, t_sleep_s=0.1, samples=4))
    result = profiler.run()
    freezer.close()
    summary = {name: vm.summary() for name, vm in result.vms.items()}
    for name in ("a", "b"):  # two on one pCPU: half the speed of alone
        assert summary[name]["zeta"]["p50"] == pytest.approx(0.5)
        assert summary[name]["zeta_b"]["p50"] == pytest.approx(1.0)
        assert summary[name]["degradation"]["estimate"] == pytest.approx(0.5)
    assert summary["c"]["degradation"]["estimate"] == pytest.approx(0.0)
    assert all(len(vm.zeta) >= 4 and len(vm.zeta_b) >= 4 for vm in result.vms.values())


def test_round_length_gives_the_seeds_overhead_formula():
    """With instant suspend/resume the frozen share is exactly K_s·t_m / (K_s·t_m + t_sleep)."""
    host = FakeHost(*(FakeDomain(n, frozenset({i % 2})) for i, n in enumerate("abc")))
    clock = VirtualClock()
    config = ProfilerConfig(t_m_s=0.02, t_sleep_s=0.5, samples=5)
    profiler, freezer, _ = make_profiler(host, config, clock=clock, freezer_clock=clock.now)
    result = profiler.run()
    freezer.close()
    overhead = result.overhead()
    assert overhead["k_s"] == 3
    assert overhead["formula"] == pytest.approx(overhead_formula(3, 0.02, 0.5))
    assert overhead["measured"] == pytest.approx(overhead["formula"], rel=1e-6)
    assert result.freezes == 15


def test_neighbours_and_their_distance_classes_are_recorded():
    topology = uniform_topology(nodes=2, cores_per_node=2, threads_per_core=2)  # cpus 0-3, siblings n, n+4
    host = FakeHost(FakeDomain("me", frozenset({0})), FakeDomain("sibling", frozenset({4})),
                    FakeDomain("same-pcpu", frozenset({0})), FakeDomain("far", frozenset({2})),
                    FakeDomain("floating", None))
    config = ProfilerConfig(t_m_s=0.01, t_sleep_s=0.05, samples=1, sensitive=SensitiveSelector(frozenset({"me"})))
    profiler, freezer, _ = make_profiler(host, config, topology=topology)
    result = profiler.run()
    freezer.close()
    distances = {n.name: (n.distance, n.frozen) for n in result.vms["me"].neighbours}
    assert distances == {
        "sibling": ("same-core", True),
        "same-pcpu": ("same-cpu", True),
        "far": ("remote-node", True),
        "floating": ("unknown", True),
    }


def test_neighbour_distance_takes_the_closest_pair():
    topology = uniform_topology(nodes=2, cores_per_node=2, threads_per_core=2)
    assert neighbour_distance(topology, frozenset({0, 2}), frozenset({1, 6})) == "same-core"
    assert neighbour_distance(topology, frozenset({0}), frozenset({1})) == "same-llc"
    assert neighbour_distance(None, frozenset({0}), frozenset({1})) == "unknown"
    assert neighbour_distance(topology, frozenset({0}), None) == "unknown"


# ----- selection and bad input ------------------------------------------------------------------


def test_sensitive_set_by_label_and_by_workload_class():
    host = FakeHost(FakeDomain("db", frozenset({0}), labels={"workload_class": "latency-critical", "tier": "1"}),
                    FakeDomain("batch", frozenset({0}), labels={"workload_class": "batch"}),
                    FakeDomain("web", frozenset({1}), labels={"tier": "1"}))
    for spec, expected in (("class:latency-critical", {"db"}), ("label:tier=1", {"db", "web"}),
                           ("all", {"db", "batch", "web"})):
        config = ProfilerConfig(t_m_s=0.01, t_sleep_s=0.05, samples=1, sensitive=SensitiveSelector.parse(spec))
        profiler, freezer, _ = make_profiler(host, config)
        result = profiler.run()
        freezer.close()
        assert {n for n, vm in result.vms.items() if vm.zeta_b} == expected, spec
    with pytest.raises(ValueError, match="label:KEY=VALUE"):
        SensitiveSelector.parse("labels:tier")


@pytest.mark.parametrize(("name", "message"), [("ghost", "VM ghost: not found"), ("sleepy", "VM sleepy: is paused")])
def test_named_vms_must_exist_and_run(name, message):
    host = FakeHost(FakeDomain("a", frozenset({0})), FakeDomain("sleepy", state="paused", reason="user"))
    config = ProfilerConfig(t_m_s=0.01, t_sleep_s=0.05, samples=1, sensitive=SensitiveSelector(frozenset({name})))
    profiler, freezer, _ = make_profiler(host, config)
    with pytest.raises(ProfilerError, match=message) as caught:
        profiler.run()
    freezer.close()
    assert caught.value.bad_input
    assert host.log == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"t_m_s": 0.6, "max_freeze_s": 0.5}, "must be shorter than max_freeze"),
     ({"t_m_s": 0.0}, "t_m must be positive"),
     ({"t_sleep_s": -1}, "t_sleep must not be negative"),
     ({"samples": 0}, "samples must be at least 1")],
)
def test_config_errors_name_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ProfilerConfig(**kwargs)


# ----- failures during a sample ------------------------------------------------------------------


def test_a_hung_sampler_cannot_keep_neighbours_frozen():
    host = FakeHost(FakeDomain("a", frozenset({0})), FakeDomain("b", frozenset({0})))
    sampler = ShareSampler(host, hang={"a": 0.3})
    config = ProfilerConfig(t_m_s=0.01, t_sleep_s=0.01, max_freeze_s=0.08, samples=1,
                            sensitive=SensitiveSelector(frozenset({"a"})))
    profiler, freezer, _ = make_profiler(host, config, sampler=sampler)
    result = profiler.run()
    freezer.close()
    frozen_for = _frozen_intervals(host, "b")
    assert frozen_for and max(frozen_for) < 0.08 + 0.05
    assert result.watchdog_fired >= 1
    assert result.vms["a"].dropped["watchdog"] >= 1
    assert host.running() == {"a", "b"}


def _frozen_intervals(host: FakeHost, name: str) -> list[float]:
    intervals, since = [], None
    for op, who, at in host.log:
        if who != name:
            continue
        if op == "suspend" and since is None:
            since = at
        elif op == "resume" and since is not None:
            intervals.append(at - since)
            since = None
    return intervals


def test_a_neighbour_vanishing_mid_freeze_aborts_only_that_sample():
    host = FakeHost(FakeDomain("a", frozenset({0})), FakeDomain("b", frozenset({0})),
                    FakeDomain("c", frozenset({0})))
    host.fail_suspend["c"] = DomainGone("domain c gone", host="fake", domain="c")
    config = ProfilerConfig(t_m_s=0.01, t_sleep_s=0.01, samples=2, sensitive=SensitiveSelector(frozenset({"a"})))
    profiler, freezer, _ = make_profiler(host, config)
    result = profiler.run()
    freezer.close()
    assert sum(result.aborted_freezes.values()) == result.vms["a"].dropped["freeze aborted"] > 0
    assert result.stopped_because.startswith("too many dropped samples: a")
    assert not result.vms["a"].zeta_b
    assert host.running() == {"a", "b", "c"}  # b was suspended, then resumed by each abort
    suspends = [n for op, n, _ in host.log if op == "suspend"]
    assert suspends and set(suspends) == {"b"}
    assert suspends.count("b") == [n for op, n, _ in host.log if op == "resume"].count("b")


def test_invalid_samples_are_dropped_and_counted():
    host = FakeHost(FakeDomain("a", frozenset({0})), FakeDomain("b", frozenset({1})))

    class Ragged(ShareSampler):
        def end(self, token):
            samples = super().end(token)
            return {n: Sample(n, "cpu", 0.0, s.window_s, valid=False, reason="counter reset: test")
                    if n == "b" else s for n, s in samples.items()}

    config = ProfilerConfig(t_m_s=0.01, t_sleep_s=0.01, samples=2)
    profiler, freezer, _ = make_profiler(host, config, sampler=Ragged(host))
    result = profiler.run()
    freezer.close()
    assert result.vms["b"].dropped["counter reset"] > 0
    assert not result.vms["b"].zeta and not result.vms["b"].zeta_b
    assert result.stopped_because.startswith("too many dropped samples: b")
    assert len(result.vms["a"].zeta_b) >= 2


# ----- adaptive sampling -------------------------------------------------------------------------


def test_adaptive_mode_shortens_stable_and_lengthens_noisy_samples():
    host = FakeHost(FakeDomain("steady", frozenset({0})), FakeDomain("jumpy", frozenset({1})))
    noisy = [0.2, 1.0, 0.5, 0.9, 0.1, 0.8, 0.3, 1.0] * 40
    sampler = ShareSampler(host, values={"steady": [0.8] * 400, "jumpy": noisy})
    clock = VirtualClock()
    config = ProfilerConfig(t_m_s=0.01, t_sleep_s=0.2, max_freeze_s=0.5, adaptive=True, duration_s=30.0)
    profiler, freezer, _ = make_profiler(host, config, sampler=sampler, clock=clock, freezer_clock=clock.now)
    result = profiler.run()
    freezer.close()
    steady, jumpy = result.vms["steady"], result.vms["jumpy"]
    assert steady.t_m_s < config.t_m_s < jumpy.t_m_s
    assert len(steady.zeta_b) > len(jumpy.zeta_b)
    # each VM's frozen share stays about the configured t_m / round
    overhead = result.overhead()
    assert overhead["measured"] == pytest.approx(overhead["formula"], rel=0.35)
