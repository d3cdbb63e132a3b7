"""The /proc reader of local vCPU threads for the `cpu` sampler, on a fake /proc tree."""

from __future__ import annotations

from pathlib import Path

from vmplacer.adapters.samplers.cpu import CpuShareSampler
from vmplacer.adapters.samplers.schedstat import DomainIdentity, ProcSchedstatReader
from vmplacer.adapters.samplers.stats import DomainStats, StatsSnapshot


def qemu(proc: Path, pid: int, uuid: str, vcpus: dict[int, tuple[int, int]], start: int = 4242,
         names: bool = True) -> None:
    """A QEMU process: main thread plus one thread per vCPU with (run ns, wait ns)."""
    root = proc / str(pid)
    (root / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / "cmdline").write_bytes(b"\0".join([b"/usr/bin/qemu-system-x86_64", b"-name",
                                               b"guest=x,debug-threads=on", b"-uuid", uuid.encode(), b""]))
    stat_fields = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 10
    (root / "stat").write_text(f"{pid} (qemu-system-x86) " + " ".join(stat_fields) + "\n")
    (root / "task" / str(pid) / "comm").write_text("qemu-system-x86\n")
    for vcpu, (ran, waited) in vcpus.items():
        task = root / "task" / str(pid + 1 + vcpu)
        task.mkdir(parents=True, exist_ok=True)
        (task / "comm").write_text(f"CPU {vcpu}/TCG\n" if names else "qemu-system-x86\n")
        (task / "schedstat").write_text(f"{ran} {waited} 17\n")


class Fallback:
    def __init__(self):
        self.asked: list[list[str]] = []

    def read(self, names):
        self.asked.append(list(names))
        return StatsSnapshot({n: DomainStats(n, 9, {"via": "libvirt"}) for n in names}, 1.0, 1.003)


def reader(proc: Path, identities: dict[str, DomainIdentity], fallback: Fallback | None = None,
           cpu: dict[int, int] | None = None) -> ProcSchedstatReader:
    """`cpu`: each process's CPU-time clock in ns (what the kernel's process clock would say)."""
    ticks = iter(x * 0.001 for x in range(10_000))
    clocks = cpu if cpu is not None else {}
    return ProcSchedstatReader(identities.get, fallback or Fallback(), proc=proc, clock=lambda: next(ticks),
                               process_cpu_time=lambda pid: clocks.get(pid, 0) if (proc / str(pid)).exists() else None)


def test_reads_each_vcpu_thread_under_libvirt_key_names(tmp_path):
    qemu(tmp_path, 100, "uuid-a", {0: (5_000_000, 2_000_000), 1: (3_000_000, 1_000_000)})
    qemu(tmp_path, 200, "uuid-other", {0: (1, 1)})
    snap = reader(tmp_path, {"a": DomainIdentity("a", "uuid-a", 7)}, cpu={100: 9_500_000}).read(["a"])
    stats = snap.domains["a"]
    assert stats.run_id == 7
    assert stats.values["vcpu.0.time"] == 5_000_000 and stats.values["vcpu.1.delay"] == 1_000_000
    assert stats.values["cpu.time"] == 9_500_000 and stats.values["vcpu.current"] == 2
    assert snap.finished - snap.started < 0.01


def test_domains_not_found_here_are_read_through_libvirt(tmp_path):
    qemu(tmp_path, 100, "uuid-a", {0: (1, 1)})
    qemu(tmp_path, 300, "uuid-c", {0: (1, 1)}, names=False)  # QEMU without thread names
    fallback = Fallback()
    identities = {"a": DomainIdentity("a", "uuid-a", 7), "b": DomainIdentity("b", "uuid-b", 8),
                  "c": DomainIdentity("c", "uuid-c", 3), "off": DomainIdentity("off", "uuid-off", -1)}
    snap = reader(tmp_path, identities, fallback, cpu={100: 1}).read(["a", "b", "c", "off"])
    assert fallback.asked == [["b", "c", "off"]]
    assert snap.domains["a"].values["cpu.time"] == 1 and snap.domains["b"].values == {"via": "libvirt"}


def test_a_restarted_domain_is_found_again_with_its_new_run_id(tmp_path):
    qemu(tmp_path, 100, "uuid-a", {0: (10, 1)}, start=1000)
    identities = {"a": DomainIdentity("a", "uuid-a", 7)}
    procs = reader(tmp_path, identities)
    assert procs.read(["a"]).domains["a"].run_id == 7
    qemu(tmp_path, 100, "uuid-a", {0: (2, 0)}, start=2000)  # same pid, another process
    identities["a"] = DomainIdentity("a", "uuid-a", 8)
    assert procs.read(["a"]).domains["a"].run_id == 8


def test_a_vanished_process_leaves_the_domain_out_of_the_snapshot(tmp_path):
    import shutil

    qemu(tmp_path, 100, "uuid-a", {0: (10, 1)})
    procs = reader(tmp_path, {"a": DomainIdentity("a", "uuid-a", 7)})
    assert "a" in procs.read(["a"]).domains
    shutil.rmtree(tmp_path / "100" / "task" / "101")
    assert "a" not in procs.read(["a"]).domains


def test_the_cpu_sampler_measures_zeta_from_proc_counters(tmp_path):
    qemu(tmp_path, 100, "uuid-a", {0: (0, 0)})
    cpu = {100: 0}
    procs = reader(tmp_path, {"a": DomainIdentity("a", "uuid-a", 7)}, cpu=cpu)
    sampler = CpuShareSampler(procs)
    token = sampler.begin(["a"])
    qemu(tmp_path, 100, "uuid-a", {0: (4_000_000, 5_000_000)})  # schedstat lags a tick behind...
    cpu[100] = 5_000_000  # ...the process clock does not: 5 ms ran, 5 ms waited
    sample = sampler.end(token)["a"]
    assert sample.valid, sample.reason
    assert abs(sample.value - 0.5) < 1e-9


def test_runs_here_only_for_local_qemu_uris():
    from vmplacer.adapters.samplers import runs_here

    assert runs_here("qemu:///system") and runs_here("qemu+tcp://127.0.0.1:16510/system")
    assert not runs_here("qemu+ssh://root@compute-7/system") and not runs_here("test:///default")


def test_the_process_clock_of_a_real_process_counts_its_running_slice():
    import subprocess
    import sys
    import time

    from vmplacer.adapters.samplers.schedstat import process_cpu_ns

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        first = process_cpu_ns(spinner.pid)
        time.sleep(0.05)
        second = process_cpu_ns(spinner.pid)
        assert first is not None and second is not None and second > first
    finally:
        spinner.kill()
        spinner.wait()
    assert process_cpu_ns(spinner.pid) is None


def test_prepare_finds_new_domains_before_any_sample(tmp_path):
    qemu(tmp_path, 100, "uuid-a", {0: (10, 1)})
    looked_up: list[str] = []
    identities = {"a": DomainIdentity("a", "uuid-a", 7)}

    def identify(name):
        looked_up.append(name)
        return identities.get(name)

    procs = ProcSchedstatReader(identify, Fallback(), proc=tmp_path, process_cpu_time=lambda pid: 5)
    CpuShareSampler(procs).prepare(["a"])
    assert looked_up == ["a"]
    procs.read(["a"])
    assert looked_up == ["a"], "the read uses what prepare found"
