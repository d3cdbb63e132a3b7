"""Freeze'nSense on real libvirt and real QEMU guests (the testbed's host 1).

Degradation is checked twice, independently: by the profiler (cpu sampler,
libvirt scheduler statistics) and by the guests' own progress counters read
from their serial consoles. Guests run vCPUs on pCPU 1 and QEMU's emulator
threads on pCPU 0 where the test does not say otherwise, like the testbed's
own tests; the profiler's scope is limited to this test's guests so that
guests of other tests running at the same time are never frozen.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import libvirt
import pytest

from vmplacer.adapters.libvirt_freeze import LibvirtFreezableHost
from vmplacer.adapters.samplers import local_pmu, choose_metric, detect_perf_counters
from vmplacer.adapters.samplers.cpu import CpuShareSampler
from vmplacer.app.observe.profiler import ProfilerConfig, SensitiveSelector
from vmplacer.bootstrap import Container
from vmplacer.bootstrap.profiler import build_profiler
from vmplacer.config import settings_from_mapping
from vmplacer.testbed.guests import rate, read_progress, wait_for_progress

pytestmark = pytest.mark.integration

# Long enough for CFS time slices of a few ms to average out within one window; the
# CLI default stays 10 ms (see docs/profiler.md for both measured on this testbed).
TEST_T_M_S = 0.05
SAMPLES = 30
TOLERANCE = 0.10
# Guests' counters measure throughput, not CPU time: sharing a pCPU also costs each
# guest what the switches between two QEMU processes cost (caches, TLB, TCG's code
# cache). Measured here: 0.89-0.97 of the work per vCPU-second (test_testbed), so a
# guest among one spinning neighbour loses 0.51-0.58 by its counters, not 0.50.
SWITCH_COST = 0.10


def container_for(testbed, tmp_path: Path, **profiler: float) -> Container:
    settings = settings_from_mapping(
        {
            "database_url": f"sqlite:///{tmp_path / 'vmplacer.db'}",
            "hosts": [{"name": "host1", "uri": testbed.host1_uri, "domain_type": "qemu"}],
            "profiler": profiler or None,
        },
        "integration test",
        {},
    )
    container = Container(settings)
    container.upgrade_database()
    return container


def profile(container: Container, names: list[str], **overrides) -> dict:
    config = ProfilerConfig(**{
        "t_m_s": TEST_T_M_S, "t_sleep_s": 0.15, "max_freeze_s": 0.5, "samples": SAMPLES,
        # A run takes seconds; one that cannot collect its samples ends here and says why.
        "duration_s": 180.0,
        "scope": tuple(names), "sensitive": SensitiveSelector(frozenset(names)), **overrides,
    })
    profiler, freezer = build_profiler(container, "host1", config)
    try:
        return profiler.run().to_dict()
    finally:
        freezer.close()


def _counter_rate(handle, window_s: float) -> float:
    first = read_progress(handle.console)[-1]
    time.sleep(window_s)
    return rate(first, wait_for_progress(handle.console, after_seq=first.seq)[-1])


def counter_ratios(conn, handles, pairs: int = 8, window_s: float = 0.5) -> list[float]:
    """Each guest's rate with the other running over its rate with the other suspended,
    from the guests' own progress counters (printed every 50 ms).

    Many short adjacent pairs, their order alternating so that load drifting in from
    other work on the machine cancels out; the median pair ratio per guest.
    """
    ratios = []
    for me, other in ((handles[0], handles[1]), (handles[1], handles[0])):
        other_dom = conn.lookupByName(other.name)
        values = []
        for index in range(pairs):
            measured = {}
            for phase in (("alone", "shared") if index % 2 == 0 else ("shared", "alone")):
                if phase == "alone":
                    other_dom.suspend()
                    try:
                        time.sleep(0.05)
                        measured[phase] = _counter_rate(me, window_s)
                    finally:
                        other_dom.resume()
                    time.sleep(0.2)  # let the resumed guest's wake-up credit pass
                else:
                    measured[phase] = _counter_rate(me, window_s)
            values.append(measured["shared"] / measured["alone"])
        ratios.append(statistics.median(values))
    return ratios


def settled_counter_ratios(conn, handles, within, attempts: int = 3) -> tuple[list[float], list[list[float]]]:
    """`counter_ratios`, measured again (up to `attempts` times) until every ratio is `within` bounds.

    The guests' counters are ground truth only on an otherwise quiet machine: each
    window is 0.5 s, long enough for the kernel to move unpinned host work onto the
    pCPU a suspended guest frees and off the one the measured guest runs on, which the
    profiler's millisecond freezes never allow. A burst of such work (seen in CI as a
    0.2 loss on one guest for one measurement) makes one measurement wrong, not the
    profiler. Returns the last measurement and all of them, for the failure message.
    """
    history: list[list[float]] = []
    for _ in range(attempts):
        ratios = counter_ratios(conn, handles)
        history.append([round(r, 3) for r in ratios])
        if all(within(r) for r in ratios):
            break
    return ratios, history


def foreign_guests(conn, mine: list[str]) -> str:
    """For failure messages: other load on the machine. Guests of other test runs share
    these pCPUs and are never frozen by this test (its scope is its own guests), and
    other processes move between pCPUs: both skew the measurements (the expected
    values hold on a host running only this test, as in CI)."""
    import os

    names = sorted(d.name() for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_RUNNING)
                   if d.name() not in mine)
    guests_note = f"; other running guests on the host: {', '.join(names)}" if names else ""
    # Other CPU load couples pCPUs too (docs/profiler.md): say how busy the machine was.
    return f" (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs{guests_note})"


def boot(make_guest, *specs):
    """Start guests and wait until each has reported for 1.5 s (past boot and TCG warm-up)."""
    handles = [make_guest(label, **kwargs) for label, kwargs in specs]
    for handle, (_label, kwargs) in zip(handles, specs):
        lines = max(2, round(1500 / kwargs.get("report_ms", 250)))
        wait_for_progress(handle.console, samples=lines, timeout_s=90)
    return handles


def half_lost(ratio: float) -> bool:
    """Half of a guest's throughput lost, give or take, plus the cost of switching."""
    return 0.5 - TOLERANCE <= 1 - ratio <= 0.5 + TOLERANCE + SWITCH_COST


def test_two_spin_guests_on_one_pcpu_each_lose_half(testbed, host1_conn, make_guest, tmp_path, record_property):
    a, b = boot(make_guest, ("a", {"pin": "1", "emulator_pin": "0", "report_ms": 50}),
                ("b", {"pin": "1", "emulator_pin": "0", "report_ms": 50}))
    result = profile(container_for(testbed, tmp_path), [a.name, b.name])
    losses = {n: vm["degradation"]["estimate"] for n, vm in result["vms"].items()}
    counters, history = settled_counter_ratios(host1_conn, [a, b], half_lost)
    record_property("profiler_degradation", {n: round(v, 3) for n, v in losses.items()})
    record_property("counter_degradation", [round(1 - r, 3) for r in counters])
    record_property("freeze_ms", result["freeze_ms"])
    print(f"\nprofiler degradation {losses}; guest counters say {[round(1 - r, 3) for r in counters]}; "
          f"freeze {result['freeze_ms']}")
    others = foreign_guests(host1_conn, [a.name, b.name])
    for name, loss in losses.items():
        assert abs(loss - 0.5) <= TOLERANCE, (
            f"{name}: degradation {loss:.3f}, expected 0.5 ± {TOLERANCE}{others}")
        vm = result["vms"][name]
        assert vm["zeta"]["n"] >= SAMPLES and vm["zeta_b"]["n"] >= SAMPLES
        assert [n["distance"] for n in vm["neighbours"] if n["name"] in (a.name, b.name)] == ["same-cpu"]
    for ratio in counters:
        assert half_lost(ratio), (
            f"guest counters: degradation {1 - ratio:.3f}; ratios measured {history}{others}")
    assert host1_conn.lookupByName(a.name).state()[0] == libvirt.VIR_DOMAIN_RUNNING
    assert host1_conn.lookupByName(b.name).state()[0] == libvirt.VIR_DOMAIN_RUNNING


CGROUP_ROOT = Path("/sys/fs/cgroup")


def _partition_dirs(partition: str) -> list[Path]:
    """The partition's directory in every cgroup hierarchy libvirt places guests in."""
    from vmplacer.testbed.cgroups import v1_hierarchies

    roots = list(v1_hierarchies())
    if (CGROUP_ROOT / "unified" / "cgroup.procs").exists():
        roots.append(CGROUP_ROOT / "unified")
    elif (CGROUP_ROOT / "cgroup.controllers").exists():
        roots.append(CGROUP_ROOT)
    return [root / f"{partition.strip('/')}.partition" for root in roots]


@pytest.fixture
def own_group_guest(testbed, host1_conn, request):
    """`own_group_guest(label, **define_args)`: a testbed guest in a cgroup partition of its own.

    Libvirt puts every guest under one parent group (/machine). On cgroup v1 the
    scheduler splits that group's CPU weight across pCPUs by load, so when other
    processes load a pCPU, freezing a guest on another pCPU really speeds up a guest
    on this one (the guests' own counters show it too). Guests that should not
    interact at all get separate groups, with 4x the default CPU weight: unpinned
    host processes also migrate to the pCPU a frozen guest frees, and the extra
    weight keeps what they take from the other guest small.
    """
    import xml.etree.ElementTree as ET

    from vmplacer.testbed import guests

    made: list[tuple[str, list[Path]]] = []

    def factory(label: str, **kwargs):
        name = guests.owned_name(f"{request.node.name[:24]}-{label}")
        partition = f"/vmplacer-{name}"
        dirs = _partition_dirs(partition)
        for directory in dirs:
            directory.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset group needs both to take tasks
                if (directory.parent / knob).exists() and not (directory / knob).read_text().strip():
                    (directory / knob).write_text((directory.parent / knob).read_text())
            for knob, value in (("cpu.shares", "4096"), ("cpu.weight", "400")):  # v1 / v2; default 1024 / 100
                if (directory / knob).exists():
                    (directory / knob).write_text(value)
        made.append((name, dirs))
        console = guests.console_path(name, testbed.dirs)
        console.unlink(missing_ok=True)
        root = ET.fromstring(guests.domain_xml(name, testbed.image, console, **kwargs))
        ET.SubElement(ET.SubElement(root, "resource"), "partition").text = partition
        host1_conn.defineXML(ET.tostring(root, encoding="unicode"))
        guests.start(host1_conn, name)
        return guests.GuestHandle(name, console, kwargs.get("vcpus", 1), kwargs.get("memory_mib", 96),
                                  kwargs.get("workload", "spin"))

    yield factory
    for name, dirs in made:
        guests.destroy_and_undefine(host1_conn, name)
        for directory in dirs:
            for _ in range(50):  # libvirt removes the guest's own group asynchronously
                leftovers = sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
                try:
                    for sub in leftovers:
                        sub.rmdir()
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def test_spin_guests_on_different_pcpus_lose_nothing(testbed, host1_conn, own_group_guest, tmp_path,
                                                     record_property):
    """The profiler sees no loss between guests on different pCPUs; the guests' own counters agree,
    judged against what sharing one pCPU costs the same guests, measured in this test.

    The counters' 0.5 s windows are not isolated from the rest of the machine: on 2 CPUs,
    outside work moves onto the pCPU a suspended neighbour frees, so a guest on its own pCPU
    shows a real loss of a few % up to 12 % (seen in CI at load ~2) that no placement can
    remove. The bound is therefore causal: moving the neighbour onto the guest's pCPU costs
    about half; on separate pCPUs the neighbour must cost less than half of that (measured
    here at load ~3: 0.14-0.34 apart against 0.58-0.64 sharing).
    """
    a, b = boot(own_group_guest, ("a", {"pin": "0", "emulator_pin": "0", "report_ms": 50}),
                ("b", {"pin": "1", "emulator_pin": "1", "report_ms": 50}))
    # A burst of outside work during one profile run is the machine's, not the profiler's: a run
    # over the bound is repeated (at most twice); a profiler that sees a loss here sees it every time.
    container = container_for(testbed, tmp_path)
    runs: list[dict[str, float]] = []
    for _ in range(3):
        result = profile(container, [a.name, b.name])
        losses = {n: vm["degradation"]["estimate"] for n, vm in result["vms"].items()}
        runs.append({n: round(v, 3) for n, v in losses.items()})
        if all(loss <= TOLERANCE for loss in losses.values()):
            break
    # Baseline: b's vCPU live on a's pCPU, then back — as the guests' counters and as the
    # profiler see it, under whatever load the machine has right now.
    b_dom = host1_conn.lookupByName(b.name)
    b_dom.pinVcpuFlags(0, (True, False), libvirt.VIR_DOMAIN_AFFECT_LIVE)
    try:
        time.sleep(0.5)
        shared = counter_ratios(host1_conn, [a, b])
        profiled_shared = {}
        if any(loss > TOLERANCE for loss in losses.values()):
            shared_run = profile(container, [a.name, b.name])
            profiled_shared = {n: vm["degradation"]["estimate"] for n, vm in shared_run["vms"].items()}
    finally:
        b_dom.pinVcpuFlags(0, (False, True), libvirt.VIR_DOMAIN_AFFECT_LIVE)
    time.sleep(0.5)
    bound = min(1 - r for r in shared) / 2
    counters, history = settled_counter_ratios(host1_conn, [a, b], lambda r: 1 - r <= bound)
    record_property("profiler_degradation", {n: round(v, 3) for n, v in losses.items()})
    record_property("counter_degradation", [round(1 - r, 3) for r in counters])
    record_property("counter_degradation_sharing_one_pcpu", [round(1 - r, 3) for r in shared])
    print(f"\nprofiler degradation {losses}; guest counter ratios measured {history}; "
          f"sharing one pCPU {[round(r, 3) for r in shared]}")
    others = foreign_guests(host1_conn, [a.name, b.name])
    # On a quiet machine the profiler sees at most TOLERANCE apart. Outside work on the 2 pCPUs
    # (seen: 0.14-0.17 at load 3) is a real loss no placement removes; then the bound is causal,
    # as for the counters: apart must cost less than half of what sharing one pCPU costs, as the
    # profiler measured it here meanwhile.
    profiler_bound = max(TOLERANCE, min(profiled_shared.values(), default=0.0) / 2)
    for name, loss in losses.items():
        assert loss <= profiler_bound, (
            f"{name}: degradation {loss:.3f} on its own pCPU, expected <= {profiler_bound:.3f} (at most "
            f"{TOLERANCE}, or half of what sharing one pCPU measured: {profiled_shared}); profile runs {runs}{others}")
        assert result["vms"][name]["neighbours"][0]["distance"] != "same-cpu"
    for ratio in counters:
        assert 1 - ratio <= bound, (
            f"guest counters: degradation {1 - ratio:.3f} on separate pCPUs, more than half of the "
            f"{2 * bound:.3f} sharing one pCPU costs; ratios measured {history}{others}")


def test_counters_are_detected_missing_on_this_host_and_auto_picks_cpu(testbed, host1_conn, make_guest):
    guest = make_guest("probe", pin="1", emulator_pin="0", workload="idle")
    wait_for_progress(guest.console, timeout_s=90)
    support = detect_perf_counters(host1_conn, testbed.host1_uri)
    kernel_pmu = local_pmu()  # independent evidence: does the kernel register a hardware PMU?
    assert support.available == kernel_pmu.available, (support, kernel_pmu)
    metric, why = choose_metric("auto", lambda: support)
    assert metric == ("ipc" if kernel_pmu.available else "cpu"), why
    # detection leaves the guest's perf events as they were
    events = host1_conn.lookupByName(guest.name).perfEvents()
    assert not events.get("instructions") and not events.get("cpu_cycles")


def test_freezable_host_reads_states_and_pinning_cheaply(testbed, host1_conn, make_guest, tmp_path):
    pinned, held = boot(make_guest, ("pinned", {"pin": "1", "emulator_pin": "0", "workload": "idle"}),
                        ("held", {"workload": "idle"}))
    container = container_for(testbed, tmp_path)
    host = LibvirtFreezableHost(container.hypervisor("host1"))
    host1_conn.lookupByName(held.name).suspend()
    try:
        states = host.domain_states()
        assert states[pinned.name].running and states[pinned.name].uuid == host1_conn.lookupByName(
            pinned.name).UUIDString()
        assert (states[held.name].state, states[held.name].pause_reason) == ("paused", "user")
        facts = host.domain_facts([pinned.name, held.name])
        assert facts[pinned.name].pcpus == frozenset({1})
        assert facts[held.name].pcpus is None  # may run on every pCPU: unpinned
        host.suspend(pinned.name)
        assert host.domain_states()[pinned.name].pause_reason == "user"
        host.resume(pinned.name)
        host.resume(pinned.name)  # resuming a running domain is not an error
        assert host.domain_states()[pinned.name].running
    finally:
        host1_conn.lookupByName(held.name).resume()
        container.close()


class _HangingSampler:
    """Wraps a real sampler; its first frozen sample hangs far beyond max_freeze."""

    def __init__(self, inner, hang_s: float):
        self.inner = inner
        self.metric = inner.metric
        self.hang_s = hang_s
        self.hung = False

    def begin(self, domains):
        return self.inner.begin(domains)

    def end(self, token):
        if not self.hung and len(token.domains) == 1:
            self.hung = True
            time.sleep(self.hang_s)
        return self.inner.end(token)


def test_a_hung_sampler_does_not_keep_real_neighbours_frozen(testbed, host1_conn, make_guest, tmp_path,
                                                             record_property):
    me, n1, n2 = boot(make_guest, ("me", {"pin": "1", "emulator_pin": "0"}),
                      ("n1", {"pin": "1", "emulator_pin": "0", "workload": "idle"}),
                      ("n2", {"pin": "1", "emulator_pin": "0", "workload": "idle"}))
    max_freeze = 0.2
    container = container_for(testbed, tmp_path)
    config = ProfilerConfig(t_m_s=0.02, t_sleep_s=0.05, max_freeze_s=max_freeze, samples=2,
                            scope=(me.name, n1.name, n2.name), sensitive=SensitiveSelector(frozenset({me.name})))
    profiler, freezer = build_profiler(container, "host1", config)
    profiler.sampler = _HangingSampler(profiler.sampler, hang_s=1.5)

    # An independent observer on its own connection: how long is each neighbour paused?
    observer = libvirt.open(testbed.host1_uri)
    watched = {n: observer.lookupByName(n) for n in (n1.name, n2.name)}
    paused_since: dict[str, float] = {}
    longest = {n: 0.0 for n in watched}
    done = threading.Event()

    def observe() -> None:
        while not done.is_set():
            now = time.perf_counter()
            for name, dom in watched.items():
                if dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
                    paused_since.setdefault(name, now)
                    longest[name] = max(longest[name], now - paused_since[name])
                else:
                    paused_since.pop(name, None)
            time.sleep(0.002)

    thread = threading.Thread(target=observe, daemon=True)
    thread.start()
    try:
        result = profiler.run()
    finally:
        done.set()
        thread.join()
        freezer.close()
        observer.close()
        container.close()
    resume_p50 = result.to_dict()["freeze_ms"]["resume_p50"] or 0.0
    record_property("longest_pause_s", {n: round(v, 3) for n, v in longest.items()})
    print(f"\nlongest observed pause {longest} with max_freeze {max_freeze} s, resume p50 {resume_p50} ms")
    # the hung sample; a daemon stalling for longer than max_freeze would add another
    assert result.watchdog_fired >= 1
    assert result.vms[me.name].dropped["watchdog"] == result.watchdog_fired
    assert len(result.vms[me.name].zeta_b) == 2  # later samples are fine again
    slack = 0.05 + 2 * resume_p50 / 1e3  # resume latency and the observer's polling
    for name, seconds in longest.items():
        assert 0 < seconds <= max_freeze + slack, f"{name} paused {seconds:.3f} s (cap {max_freeze} s)"
    for dom in watched.values():
        assert dom.state()[0] != libvirt.VIR_DOMAIN_PAUSED


def test_profile_cli_runs_stores_and_plots(testbed, make_guest, tmp_path):
    import json
    import subprocess
    import sys

    a, b = boot(make_guest, ("a", {"pin": "1", "emulator_pin": "0"}), ("b", {"pin": "1", "emulator_pin": "0"}))
    config = tmp_path / "vmplacer.yaml"
    config.write_text(
        f"database_url: sqlite:///{tmp_path / 'cli.db'}\n"
        f"hosts:\n  - {{name: host1, uri: '{testbed.host1_uri}', domain_type: qemu}}\n"
        "profiler: {t_m_ms: 10, t_sleep_s: 10, max_freeze_ms: 500}\n"
    )
    vmplacer = str(Path(sys.executable).with_name("vmplacer"))

    def cli(*args):
        return subprocess.run([vmplacer, "--config", str(config), "profile", *args], capture_output=True,
                              text=True, timeout=300)

    ran = cli("--host", "host1", a.name, b.name, "--scope", a.name, "--scope", b.name,
              "--tm", "20ms", "--tsleep", "100ms", "--samples", "5", "--format", "json")
    assert ran.returncode == 0, ran.stderr
    data = json.loads(ran.stdout)
    assert set(data["vms"]) == {a.name, b.name} and data["metric"] == "cpu"
    shown = cli("show", a.name, "--format", "json", "--plot", str(tmp_path / "fig.png"))
    assert shown.returncode == 0, shown.stderr
    stored = json.loads(shown.stdout)
    assert stored["run"]["id"] == data["run_id"]
    assert len(stored["vms"][a.name]["values"]["zeta_b"]) >= 5
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = cli("--host", "host1", a.name, "--tsleep", "soon")
    assert bad.returncode == 2 and "--tsleep" in bad.stderr


def test_proc_reader_agrees_with_libvirt_on_a_real_guest(testbed, host1_conn, make_guest):
    """The /proc vCPU-thread reader (used for local hosts) reads the counters libvirt reads."""
    from vmplacer.adapters.samplers import libvirt_identity, runs_here
    from vmplacer.adapters.samplers.schedstat import ProcSchedstatReader
    from vmplacer.adapters.samplers.stats import LibvirtStatsReader

    assert runs_here(testbed.host1_uri) and runs_here(testbed.host2_uri)
    (guest,) = boot(make_guest, ("spin", {"pin": "1", "emulator_pin": "0", "vcpus": 2}))
    through_libvirt = LibvirtStatsReader(lambda: host1_conn, CpuShareSampler.groups)
    procs = ProcSchedstatReader(libvirt_identity(lambda: host1_conn), through_libvirt)
    for _ in range(3):
        by_libvirt = through_libvirt.read([guest.name]).domains[guest.name]
        by_proc = procs.read([guest.name]).domains[guest.name]
        assert by_proc.run_id == by_libvirt.run_id == host1_conn.lookupByName(guest.name).ID()
        assert by_proc.values["vcpu.current"] == 2
        for vcpu in (0, 1):
            delay_libvirt, delay_proc = by_libvirt.values[f"vcpu.{vcpu}.delay"], by_proc.values[f"vcpu.{vcpu}.delay"]
            # the same schedstat counter, read a moment later: never behind, and close
            assert 0 <= delay_proc - delay_libvirt < 0.5e9, (vcpu, delay_libvirt, delay_proc)
        # libvirt's cpu.time is the domain's cgroup, ours the QEMU process clock: the same threads
        assert 0 <= by_proc.values["cpu.time"] - by_libvirt.values["cpu.time"] < 0.5e9
        time.sleep(0.2)
    sampler = CpuShareSampler(procs)
    around = through_libvirt.read([guest.name]).domains[guest.name].values
    token = sampler.begin([guest.name])
    time.sleep(0.5)
    sample = sampler.end(token)[guest.name]
    after = through_libvirt.read([guest.name]).domains[guest.name].values
    # The same share from libvirt's counters over a window enclosing the sampler's. How much of
    # pCPU 1 the guest gets depends on other work on the machine; the two readings must agree,
    # and two spinning vCPUs pinned to one pCPU can never run more than about half their time.
    ran = (after["cpu.time"] - around["cpu.time"]) / 1e9
    waited = sum(after[f"vcpu.{i}.delay"] - around[f"vcpu.{i}.delay"] for i in (0, 1)) / 1e9
    by_libvirt = ran / (ran + waited)
    assert sample.valid, sample
    assert abs(sample.value - by_libvirt) < 0.1, (sample, by_libvirt)
    assert 0 < sample.value <= 0.6, sample


def test_a_pair_probe_freezes_all_but_the_pair_and_isolates_one_neighbour(testbed, host1_conn, make_guest,
                                                                          tmp_path, record_property):
    """a and b time-share pCPU 1, c runs on pCPU 0. A probe of (a, c) freezes b: a then runs
    alone on its pCPU, so its ζp/ζb recovers the half its ζ/ζb loses to b; the probe's
    sample names c as the only neighbour it ran with. (a, b) is never probed (one pCPU)."""
    from vmplacer.app.learn.online import observations_from_samples

    a, b, c = boot(make_guest, ("a", {"pin": "1", "emulator_pin": "0", "report_ms": 50}),
                   ("b", {"pin": "1", "emulator_pin": "0", "report_ms": 50}),
                   ("c", {"pin": "0", "emulator_pin": "0", "report_ms": 50}))
    names = [a.name, b.name, c.name]
    container = container_for(testbed, tmp_path)
    runs: list[tuple[float, float]] = []
    # The recovery is a ratio of two medians over short windows; outside work on the 2 pCPUs
    # during one run can shave it (seen: 0.213 of the 0.232 needed, at load 3). A run that falls
    # short is repeated, at most twice: a probe that does not freeze b falls short every time.
    for _ in range(3):
        result = profile(container, names, samples=8, pair_probes=2)
        assert result["pair_freezes"] >= 8
        rows = container.profile_store.samples(result["run_id"])
        probes = [r for r in rows if r["kind"] == "zeta_p"]
        assert probes and {r["guest"] for r in probes} == set(names)
        for row in probes:
            ran_with = {n["name"] for n in row["neighbours"] if not n["frozen"]} & set(names)
            assert len(ran_with) == 1 and {row["guest"], *ran_with} != {a.name, b.name}, row
        observations = observations_from_samples(rows)
        alone_with_c = [o.zeta / o.zeta_b for o in observations
                        if o.key == a.name and [e.key for e in o.neighbours] == [c.name] and o.own_share == 1.0]
        shared = [o.zeta / o.zeta_b for o in observations if o.key == a.name and o.own_share == 0.5]
        assert alone_with_c and shared
        probe_ratio, shared_ratio = statistics.median(alone_with_c), statistics.median(shared)
        runs.append((round(probe_ratio, 3), round(shared_ratio, 3)))
        if probe_ratio - shared_ratio >= (1 - shared_ratio) / 3:
            break
    record_property("pair_probe_ratio", round(probe_ratio, 3))
    record_property("shared_ratio", round(shared_ratio, 3))
    # The probe takes back at least a third of what time sharing with b costs a, as measured here.
    assert probe_ratio - shared_ratio >= (1 - shared_ratio) / 3, (
        f"a: ζp/ζb {probe_ratio:.3f} with b frozen, ζ/ζb {shared_ratio:.3f} with b running; "
        f"(probe, shared) per run {runs}{foreign_guests(host1_conn, names)}")
    for name in names:
        assert host1_conn.lookupByName(name).state()[0] == libvirt.VIR_DOMAIN_RUNNING
