"""Samplers on recorded libvirt stats: the cpu sampler on a sequence recorded from the
testbed, the ipc sampler on a sequence in libvirt's exact shape with perf counters
(this machine has none), and the probe sampler on real commands, HTTP and files."""

from __future__ import annotations

import json
import statistics
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from vmplacer.adapters.samplers import CounterSupport, local_pmu, choose_metric
from vmplacer.adapters.samplers.cpu import COARSE_MIN_WINDOW_S, CpuShareSampler
from vmplacer.adapters.samplers.ipc import MAX_IPC, PerfIpcSampler
from vmplacer.adapters.samplers.probe import (
    PROGRESS_LINE,
    CommandProbe,
    ConsoleCounterProbe,
    HttpProbe,
    ProbeSampler,
)
from vmplacer.adapters.samplers.stats import DomainStats, RecordedStatsReader, StatsSnapshot

DATA = Path(__file__).resolve().parents[1] / "data" / "libvirt_stats"
CPU_FILE = DATA / "cpu_two_spin_guests_one_pcpu.json"
IPC_FILE = DATA / "ipc_two_guests.json"


def windows(path: Path, sampler_class):
    """Replay a recorded file window by window: [(index, {guest: Sample})]."""
    data = json.loads(path.read_text())
    reader = RecordedStatsReader(data["frames"])
    sampler = sampler_class(reader)
    result = []
    for index in range(len(data["frames"]) - 1):
        reader.position = index
        token = sampler.begin(data["guests"])
        result.append((index, sampler.end(token)))
    return data, sampler, result


def within(phase: list[int], index: int) -> bool:
    """Window `index` (frame index -> index+1) lies entirely inside the phase's frames."""
    return phase[0] <= index and index + 1 < phase[1]


# ----- ipc -----------------------------------------------------------------------------------


def test_ipc_sampler_reproduces_the_recorded_ipc_and_rejects_ragged_windows():
    data, sampler, result = windows(IPC_FILE, PerfIpcSampler)
    ragged = {(e["window"], e["guest"]): e["kind"] for e in data["ragged"]}
    jitter = data["ipc"]["jitter"]
    isolated = data["isolated_guest"]
    alone, shared = [], []
    for index, samples in result:
        for guest, sample in samples.items():
            if (index, guest) in ragged:
                assert not sample.valid
                assert sample.reason.startswith(ragged[(index, guest)]), sample.reason
                continue
            if within(data["phases"]["isolated"], index) and guest == isolated:
                assert sample.valid, sample.reason
                alone.append(sample.value)
            elif within(data["phases"]["isolated"], index):
                assert not sample.valid and sample.reason.startswith("not running")
            elif within(data["phases"]["shared"], index) or within(data["phases"]["shared_again"], index):
                assert sample.valid, sample.reason
                shared.append(sample.value)
    assert alone and shared
    for values, expected in ((alone, data["ipc"]["alone"]), (shared, data["ipc"]["shared"])):
        assert all(abs(v / expected - 1) <= jitter + 0.01 for v in values), (values, expected)
    assert sampler.dropped["outside physical bounds"] == 1
    assert sampler.dropped["counter reset"] >= 1
    assert sampler.dropped["domain restarted"] == 1


def test_ipc_sample_equals_instruction_and_cycle_increments():
    data, _sampler, result = windows(IPC_FILE, PerfIpcSampler)
    index, samples = result[2]
    before = data["frames"][index]["domains"]["web-a"]["stats"]
    after = data["frames"][index + 1]["domains"]["web-a"]["stats"]
    expected = (after["perf.instructions"] - before["perf.instructions"]) / (
        after["perf.cpu_cycles"] - before["perf.cpu_cycles"])
    assert samples["web-a"].value == pytest.approx(expected)
    assert samples["web-a"].metric == "ipc"


def _snapshot(values: dict, started: float, run_id: int = 1) -> StatsSnapshot:
    return StatsSnapshot({"g": DomainStats("g", run_id, values)}, started, started + 0.001)


class _Frames:
    def __init__(self, *snapshots: StatsSnapshot):
        self.snapshots = list(snapshots)

    def read(self, names):
        return self.snapshots.pop(0)


def test_ipc_rejects_idle_windows_and_missing_counters():
    idle = PerfIpcSampler(_Frames(
        _snapshot({"perf.cpu_cycles": 1_000, "perf.instructions": 1_000, "vcpu.current": 1}, 0.0),
        _snapshot({"perf.cpu_cycles": 2_000, "perf.instructions": 2_500, "vcpu.current": 1}, 0.05),
    ))
    sample = idle.end(idle.begin(["g"]))["g"]
    assert not sample.valid and sample.reason.startswith("idle")
    missing = PerfIpcSampler(_Frames(_snapshot({"vcpu.current": 1}, 0.0), _snapshot({"vcpu.current": 1}, 0.05)))
    sample = missing.end(missing.begin(["g"]))["g"]
    assert not sample.valid and sample.reason.startswith("missing counter: perf.cpu_cycles")
    too_wide = PerfIpcSampler(_Frames(
        _snapshot({"perf.cpu_cycles": 0, "perf.instructions": 0, "vcpu.current": 1}, 0.0),
        _snapshot({"perf.cpu_cycles": 10_000_000, "perf.instructions": int(10_000_000 * (MAX_IPC + 1)),
                   "vcpu.current": 1}, 0.05),
    ))
    sample = too_wide.end(too_wide.begin(["g"]))["g"]
    assert not sample.valid and sample.reason.startswith("outside physical bounds")


# ----- cpu (recorded on the testbed) ------------------------------------------------------------


def test_cpu_sampler_on_recorded_testbed_stats():
    data, sampler, result = windows(CPU_FILE, CpuShareSampler)
    first, second = data["guests"]
    phases = data["phases"]
    shared = [s[first].value for i, s in result
              if within(phases["shared"], i) or within(phases["shared_again"], i)]
    alone = [s[first].value for i, s in result if within(phases["second_suspended"], i)]
    assert all(0.0 <= v <= 1.0 for v in shared + alone)
    # Two spin guests on one pCPU: each runs a smaller share of its runnable time than
    # the same guest does while its neighbour is suspended.
    assert statistics.median(alone) > statistics.median(shared)
    for index, samples in result:
        if within(phases["second_suspended"], index):
            assert not samples[second].valid and samples[second].reason.startswith("not running")
    restart = phases["first_restarted"][0]
    straddling = dict(result)[restart - 1][first]
    assert not straddling.valid
    assert straddling.reason.startswith(("domain restarted", "counter reset")), straddling.reason
    after = [s[first] for i, s in result if within(phases["first_restarted"], i)]
    assert after and all(s.valid for s in after)


def test_cpu_sample_is_run_time_over_run_time_plus_delay():
    data, _sampler, result = windows(CPU_FILE, CpuShareSampler)
    name = data["guests"][0]
    index, samples = result[3]
    before = data["frames"][index]["domains"][name]["stats"]
    after = data["frames"][index + 1]["domains"][name]["stats"]
    ran = after["cpu.time"] - before["cpu.time"]
    waited = after["vcpu.0.delay"] - before["vcpu.0.delay"]
    assert samples[name].value == pytest.approx(ran / (ran + waited))
    frames = data["frames"]
    expected_window = ((frames[index + 1]["started"] + frames[index + 1]["finished"])
                       - (frames[index]["started"] + frames[index]["finished"])) / 2
    assert samples[name].window_s == pytest.approx(expected_window)


@pytest.mark.parametrize(
    ("before", "after", "window", "reason"),
    [
        ({"cpu.time": 5e9, "vcpu.0.delay": 1e9}, {"cpu.time": 4e9, "vcpu.0.delay": 1e9}, 0.05, "counter reset"),
        ({"cpu.time": 0, "vcpu.0.delay": 0}, {"cpu.time": 0.5e9, "vcpu.0.delay": 0}, 0.05,
         "outside physical bounds"),
        ({"cpu.time": 0, "vcpu.0.delay": 0}, {"cpu.time": 0, "vcpu.0.delay": 0}, 0.05, "idle"),
        ({"cpu.time": 0}, {"cpu.time": 1e7}, 0.05, "no run-queue delay"),
        ({"vcpu.0.time": 0, "vcpu.0.delay": 0}, {"vcpu.0.time": 1e7, "vcpu.0.delay": 1e7}, 0.05,
         "window too short"),
    ],
)
def test_cpu_sampler_rejects_ragged_windows(before, after, window, reason):
    sampler = CpuShareSampler(_Frames(_snapshot({**before, "vcpu.current": 1}, 0.0),
                                      _snapshot({**after, "vcpu.current": 1}, window)))
    sample = sampler.end(sampler.begin(["g"]))["g"]
    assert not sample.valid
    assert sample.reason.startswith(reason), sample.reason
    assert sampler.dropped[reason] == 1


def test_cpu_sampler_uses_tick_resolution_vcpu_time_only_over_long_windows():
    window = COARSE_MIN_WINDOW_S * 2
    sampler = CpuShareSampler(_Frames(
        _snapshot({"vcpu.0.time": 0, "vcpu.0.delay": 0, "vcpu.current": 1}, 0.0),
        _snapshot({"vcpu.0.time": 0.3e9, "vcpu.0.delay": 0.1e9, "vcpu.current": 1}, window),
    ))
    sample = sampler.end(sampler.begin(["g"]))["g"]
    assert sample.valid and sample.value == pytest.approx(0.75)


def test_counter_samplers_report_gone_and_restarted_domains():
    gone = CpuShareSampler(_Frames(_snapshot({"cpu.time": 0, "vcpu.0.delay": 0}, 0.0),
                                   StatsSnapshot({}, 0.05, 0.051)))
    assert gone.end(gone.begin(["g"]))["g"].reason.startswith("domain gone")
    restarted = CpuShareSampler(_Frames(_snapshot({"cpu.time": 0, "vcpu.0.delay": 0}, 0.0, run_id=4),
                                        _snapshot({"cpu.time": 1e7, "vcpu.0.delay": 0}, 0.05, run_id=5)))
    assert restarted.end(restarted.begin(["g"]))["g"].reason.startswith("domain restarted")


# ----- probe ----------------------------------------------------------------------------------


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_command_probe_rate_over_the_window(tmp_path):
    counter = tmp_path / "counter"
    counter.write_text("1000\n")
    clock = _Clock()
    probe = CommandProbe(("cat", str(counter)), clock=clock)
    sampler = ProbeSampler({"web": probe}, clock=clock)
    token = sampler.begin(["web"])
    counter.write_text("1500\n")
    clock.t += 2.0
    sample = sampler.end(token)["web"]
    assert sample.valid and sample.value == pytest.approx(250.0) and sample.metric == "probe"


def test_command_probe_failures_are_invalid_samples(tmp_path):
    sampler = ProbeSampler({"a": CommandProbe(("false",)), "b": CommandProbe(("echo", "many")),
                            "c": CommandProbe(("/nonexistent/probe",))})
    samples = sampler.end(sampler.begin(["a", "b", "c", "d"]))
    assert samples["a"].reason.startswith("probe failed") and "exit status 1" in samples["a"].reason
    assert "not a number" in samples["b"].reason
    assert samples["c"].reason.startswith("probe failed")
    assert samples["d"].reason.startswith("no probe")
    assert sum(sampler.dropped.values()) == 4


def test_http_probe_reads_a_number_from_a_real_server():
    values = iter(["10", "70"])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            body = next(values).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        clock = _Clock()
        probe = HttpProbe(f"http://127.0.0.1:{server.server_port}/metric", clock=clock)
        sampler = ProbeSampler({"web": probe}, clock=clock)
        token = sampler.begin(["web"])
        clock.t += 0.5
        sample = sampler.end(token)["web"]
        assert sample.valid and sample.value == pytest.approx(120.0)
    finally:
        server.shutdown()
    with pytest.raises(ValueError, match="http"):
        HttpProbe("file:///etc/passwd")


def test_console_probe_uses_the_guests_own_timestamps(tmp_path):
    console = tmp_path / "console.log"
    console.write_text("boot noise\nVMPLACER-PROGRESS 0 1.00 100\nVMPLACER-PROGRESS 1 1.25 600\n")
    sampler = ProbeSampler({"g": ConsoleCounterProbe(console, PROGRESS_LINE)})
    token = sampler.begin(["g"])
    with console.open("a") as out:
        out.write("VMPLACER-PROGRESS 2 1.50 1100\nVMPLACER-PROGRESS 3 1.75 1600\n")
    sample = sampler.end(token)["g"]
    assert sample.valid
    assert sample.value == pytest.approx((1600 - 600) / (1.75 - 1.25))
    stale = sampler.end(sampler.begin(["g"]))["g"]
    assert not stale.valid and stale.reason.startswith("no new reading")


def test_probe_counter_reset_and_gauges(tmp_path):
    value = tmp_path / "v"
    value.write_text("500")
    clock = _Clock()
    probe = CommandProbe(("cat", str(value)), clock=clock)
    counter = ProbeSampler({"g": probe}, clock=clock)
    token = counter.begin(["g"])
    value.write_text("20")
    clock.t += 1
    assert counter.end(token)["g"].reason.startswith("counter reset")
    gauge = ProbeSampler({"g": probe}, kind="gauge", clock=clock)
    token = gauge.begin(["g"])
    value.write_text("42.5")
    assert gauge.end(token)["g"].value == pytest.approx(42.5)
    with pytest.raises(ValueError, match="counter or gauge"):
        ProbeSampler({}, kind="histogram")


# ----- choosing a sampler --------------------------------------------------------------------


def test_auto_picks_ipc_only_with_counters_and_overrides_win():
    assert choose_metric("auto", lambda: CounterSupport(True, "pmu"))[0] == "ipc"
    metric, why = choose_metric("auto", lambda: CounterSupport(False, "no pmu"))
    assert metric == "cpu" and "no pmu" in why

    def never() -> CounterSupport:
        raise AssertionError("an explicit choice must not probe the host")

    assert choose_metric("probe", never) == ("probe", "configured")
    with pytest.raises(ValueError, match="sampler must be auto"):
        choose_metric("flops", never)


def test_local_pmu_detection_reads_the_event_source_devices(tmp_path):
    devices = tmp_path / "sys" / "bus" / "event_source" / "devices"
    for name in ("software", "tracepoint", "breakpoint"):
        (devices / name).mkdir(parents=True)
    assert not local_pmu(tmp_path).available
    (devices / "cpu").mkdir()
    assert local_pmu(tmp_path).available


# ----- domain facts from the XML metadata ------------------------------------------------------------


def test_labels_and_workload_class_come_from_vmplacer_metadata():
    from vmplacer.adapters.domain_xml import parse_metadata
    from vmplacer.adapters.libvirt_freeze import labels_from_xml
    from vmplacer.ports import WORKLOAD_CLASS_LABEL

    xml_dir = DATA.parent / "xml"

    class Host:
        def domain_xml(self, name: str) -> str:
            return (xml_dir / name).read_text()

    labels = labels_from_xml(Host())  # type: ignore[arg-type]
    placed = "fresh-kvm-latency-out.xml"
    meta = parse_metadata((xml_dir / placed).read_text())
    assert labels(placed) == {**meta.labels, WORKLOAD_CLASS_LABEL: meta.workload_class}
    assert labels("foreign-in.xml") == {}  # not placed by vmplacer: no labels, no class
