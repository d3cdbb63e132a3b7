"""The testbed itself on real daemons: guests boot and report progress, live
migration between the two hosts keeps a guest running, and the progress
counter measures CPU share independently of vmplacer."""

from __future__ import annotations

import statistics
import subprocess
import time
from dataclasses import dataclass

import libvirt
import pytest

from tests.support import require
from vmplacer.testbed import cgroups, daemons, guests, runtime_fs
from vmplacer.testbed.guests import ProgressSample, rate, read_progress, wait_for_progress
from vmplacer.testbed.image import build_image

pytestmark = pytest.mark.integration

MIGRATE_FLAGS = libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE


def virsh_names(uri: str, *extra: str) -> set[str]:
    """Domain names as an independent client (virsh) sees them."""
    out = subprocess.run([daemons.binary("virsh"), "-c", uri, "list", "--name", *extra],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    return {line.strip() for line in out.splitlines() if line.strip()}


def assert_never_backwards(samples: list[ProgressSample]) -> None:
    for before, after in zip(samples, samples[1:]):
        assert after.seq == before.seq + 1, f"progress lines missing or repeated: {before} -> {after}"
        assert after.units >= before.units, f"work counter went backwards: {before} -> {after}"
        assert after.uptime_s >= before.uptime_s, f"guest clock went backwards: {before} -> {after}"


def test_up_is_idempotent(testbed):
    again = daemons.up(testbed.dirs)
    assert again.started == []
    assert daemons.answers(testbed.host1_uri) and daemons.answers(testbed.host2_uri)
    rows = {row["daemon"]: row for row in daemons.status(testbed.dirs)}
    assert rows["host2/libvirtd"]["started_by_testbed"]


def test_runtime_directories_are_on_tmpfs_like_a_systemd_host(testbed):
    """libvirtd fsyncs status XML on every suspend/resume: on disk that would skew freeze timings."""
    assert runtime_fs.on_tmpfs(testbed.dirs.host2_dir / "run")
    started = daemons._load_started(testbed.dirs)
    if "host1/libvirtd" in started:
        assert runtime_fs.on_tmpfs(daemons.HOST1_RUN_DIR)
        assert (daemons.HOST1_RUN_DIR / "qemu").is_dir()


def test_down_spares_daemons_with_guests_in_use_and_stops_only_recorded_ones(testbed, host2_conn):
    host2_keys = ["host2/libvirtd", "host2/virtlogd"]
    recorded = daemons.recorded(testbed.dirs)
    assert all(key in recorded for key in host2_keys), "host2 is always started by the testbed"
    host1_pid = daemons.daemon_pid(daemons.host1(testbed.dirs), "libvirtd")

    # A guest some other live process owns (pid 1 always runs) keeps host2 up.
    busy = guests.define_guest(host2_conn, guests.owned_name("in-use", pid=1), image=testbed.image,
                               dirs=testbed.dirs)
    try:
        guests.start(host2_conn, busy)
        spared = daemons.down(testbed.dirs, only=host2_keys)
        assert spared.stopped == [] and set(spared.left_running) == set(host2_keys)
        assert busy.name in spared.left_running["host2/libvirtd"]
        assert daemons.answers(testbed.host2_uri)
    finally:
        guests.destroy_and_undefine(host2_conn, busy.name)
        busy.console.unlink(missing_ok=True)

    old_pid = recorded["host2/libvirtd"]["pid"]
    stopped = daemons.down(testbed.dirs, only=host2_keys)
    require(not stopped.left_running, f"another test run uses host2 right now: {stopped.left_running}")
    assert sorted(stopped.stopped) == sorted(host2_keys)
    assert not daemons.process_alive(old_pid, "libvirtd")
    assert not any((h / cgroups.SUBTREE).exists() for h in cgroups.v1_hierarchies())
    assert daemons.daemon_pid(daemons.host1(testbed.dirs), "libvirtd") == host1_pid, "host1 was not ours to stop"

    again = daemons.up(testbed.dirs)  # and back, for the tests that follow
    assert sorted(again.started) == sorted(host2_keys)
    assert daemons.answers(testbed.host2_uri)


def test_image_is_cached(testbed):
    image = build_image(testbed.dirs)
    assert not image.built
    assert image.inputs_hash == testbed.image.inputs_hash
    for path in (image.kernel, image.initrd):
        assert path.stat().st_mode & 0o444 == 0o444, f"{path} must be readable by QEMU's user"


def test_guest_live_migrates_to_host2_and_keeps_running(testbed, host1_conn, host2_conn, make_guest, record_property):
    booted = time.monotonic()
    mover = make_guest("mover", vcpus=1, workload="spin")
    stayer = make_guest("stayer", vcpus=2, workload="mem")
    first = wait_for_progress(mover.console, timeout_s=60)
    boot_s = time.monotonic() - booted
    wait_for_progress(stayer.console, timeout_s=60)
    assert "workload=mem cpus=2" in stayer.console.read_text(), "a 2-vCPU guest runs one worker per vCPU"

    # Both counters advance on host 1.
    for handle in (mover, stayer):
        start = read_progress(handle.console)[-1]
        later = wait_for_progress(handle.console, after_seq=start.seq, samples=4, timeout_s=30)[-1]
        assert later.units > start.units, f"{handle.name} makes no progress on host 1"

    before = read_progress(mover.console)[-1]
    began = time.monotonic()
    host1_conn.lookupByName(mover.name).migrate3(
        host2_conn, {libvirt.VIR_MIGRATE_PARAM_URI: daemons.MIGRATE_URI}, MIGRATE_FLAGS)
    migrate_s = time.monotonic() - began

    moved = host2_conn.lookupByName(mover.name)
    assert moved.isActive() and moved.isPersistent()
    after = wait_for_progress(mover.console, after_seq=before.seq, samples=6, timeout_s=30)
    assert after[-1].units > before.units, "the migrated guest does not progress on host 2"
    assert_never_backwards(read_progress(mover.console))
    assert moved.state()[0] == libvirt.VIR_DOMAIN_RUNNING

    # An independent client sees each guest on the right host.
    assert mover.name in virsh_names(testbed.host2_uri)
    assert mover.name not in virsh_names(testbed.host1_uri, "--all")
    assert stayer.name in virsh_names(testbed.host1_uri)
    assert stayer.name not in virsh_names(testbed.host2_uri, "--all")
    last = read_progress(stayer.console)[-1]
    assert wait_for_progress(stayer.console, after_seq=last.seq, samples=2)[-1].units > last.units

    record_property("boot_to_first_progress_s", round(boot_s, 2))
    record_property("guest_uptime_at_first_progress_s", first[0].uptime_s)
    record_property("migration_s", round(migrate_s, 2))
    print(f"\nboot to first progress {boot_s:.2f} s (guest uptime {first[0].uptime_s:.2f} s), "
          f"live migration host1 -> host2 {migrate_s:.2f} s")


@dataclass(frozen=True)
class Mark:
    """A fresh progress sample and the vCPU time libvirt reports right after it."""

    sample: ProgressSample
    vcpu_s: float
    wall_s: float


def mark(conn, handle) -> Mark:
    last = read_progress(handle.console)[-1]
    # The next line, caught as it appears, so the console and libvirt are read together.
    fresh = wait_for_progress(handle.console, after_seq=last.seq, timeout_s=10, poll_s=0.005)[-1]
    dom = conn.lookupByName(handle.name)
    stats = conn.domainListGetStats([dom], libvirt.VIR_DOMAIN_STATS_VCPU)[0][1]
    vcpu_ns = sum(v for k, v in stats.items() if k.startswith("vcpu.") and k.endswith(".time"))
    return Mark(fresh, vcpu_ns / 1e9, time.monotonic())


@dataclass(frozen=True)
class Window:
    units_per_s: float  # from the console alone
    cpu_share: float  # the vCPU's share of one pCPU, from libvirt
    units: int  # work done in the window
    cpu_s: float  # vCPU time the window took, from libvirt

    @property
    def units_per_cpu_s(self) -> float:
        return self.units / self.cpu_s


def measure(conn, handles, seconds: float) -> list[Window]:
    """Several guests over (about) the same wall-clock window."""
    starts = [mark(conn, h) for h in handles]
    time.sleep(seconds)
    ends = [mark(conn, h) for h in handles]
    windows = []
    for begin, end in zip(starts, ends):
        cpu_s = end.vcpu_s - begin.vcpu_s
        windows.append(Window(rate(begin.sample, end.sample), cpu_s / (end.wall_s - begin.wall_s),
                              end.sample.units - begin.sample.units, cpu_s))
    return windows


def pooled_units_per_cpu_s(windows: list[Window]) -> float:
    return sum(w.units for w in windows) / sum(w.cpu_s for w in windows)


def test_two_spin_guests_on_one_pcpu_each_get_half(testbed, host1_conn, make_guest, record_property):
    """Work units follow CPU time: two spin guests sharing a pCPU each run at about
    half the rate it has alone (the other one suspended). Each guest is compared
    with itself: two guests' absolute rates may differ (printed as a's share)."""
    pcpu = "1"  # leave pCPU 0 to the daemons, QEMU's emulator threads and pytest
    a = make_guest("a", pin=pcpu, emulator_pin="0")
    b = make_guest("b", pin=pcpu, emulator_pin="0")
    dom_a, dom_b = host1_conn.lookupByName(a.name), host1_conn.lookupByName(b.name)
    for handle in (a, b):
        wait_for_progress(handle.console, samples=8, timeout_s=60)  # past boot and TCG warm-up

    # The halving needs the pCPU to itself: with CPU-bound work from outside the
    # test there, a guest alone gets a fraction of it and two guests together get
    # more than that fraction. libvirt's vCPU times show when that happens: such
    # rounds are dropped. Short windows, interleaved and repeated; medians.
    window, wanted_rounds, max_rounds, free = 1.0, 4, 20, 0.7
    ratios, fairness, per_cpu_s, busy, alone_rates = [], [], [], [], []
    alone_windows, shared_windows = [], []
    for _ in range(max_rounds):
        dom_b.suspend()
        alone_a, = measure(host1_conn, [a], window)
        dom_b.resume()
        dom_a.suspend()
        alone_b, = measure(host1_conn, [b], window)
        dom_a.resume()
        shared_a, shared_b = measure(host1_conn, [a, b], window)
        shares = (alone_a.cpu_share, alone_b.cpu_share, shared_a.cpu_share + shared_b.cpu_share)
        if min(shares) < free:
            busy.append(round(min(shares), 2))
            continue
        ratios.append((shared_a.units_per_s / alone_a.units_per_s, shared_b.units_per_s / alone_b.units_per_s))
        alone_rates.append(round(alone_a.units_per_s))
        fairness.append(shared_a.units_per_s / (shared_a.units_per_s + shared_b.units_per_s))
        per_cpu_s.append(shared_a.units_per_cpu_s / alone_a.units_per_cpu_s)
        alone_windows.append(alone_a)
        shared_windows.append(shared_a)
        if len(ratios) == wanted_rounds:
            break
    print(f"\nalone rates (units/s) {alone_rates}; "
          f"shared/alone rate per round: {[(round(x, 3), round(y, 3)) for x, y in ratios]}; "
          f"a's share of the pair {[round(f, 3) for f in fairness]}; "
          f"units per vCPU-second shared/alone {[round(e, 3) for e in per_cpu_s]}; "
          f"rounds dropped (pCPU {pcpu} share seen) {busy}")
    require(len(ratios) >= 3, f"pCPU {pcpu} is busy with work outside this test: in {len(busy)} of "
                              f"{len(busy) + len(ratios)} rounds the test's guests got only {busy} of it")
    ratio_a = statistics.median(r[0] for r in ratios)
    ratio_b = statistics.median(r[1] for r in ratios)
    # Work per vCPU-second over all of a's shared windows against all of its alone windows: a
    # guest's own rate can swing between two 1 s windows (x1.7 seen from one round to the next
    # with nothing else on the pCPU), which a ratio of single windows would take for the cost of
    # sharing; pooled, the swings of the rounds average out.
    efficiency = pooled_units_per_cpu_s(shared_windows) / pooled_units_per_cpu_s(alone_windows)
    print(f"pooled units per vCPU-second shared/alone {efficiency:.3f}")
    record_property("shared_over_alone", [round(ratio_a, 3), round(ratio_b, 3)])

    assert 0.35 <= ratio_a <= 0.65 and 0.35 <= ratio_b <= 0.65, (
        f"two guests on one pCPU should each run at ~0.5 of alone: got {ratio_a:.3f}, {ratio_b:.3f}")
    # The counter measures CPU time: about the same work per vCPU-second, shared or alone, less
    # what switching between two QEMU processes on one pCPU costs (caches, TLB, TCG's code
    # cache). That cost is the machine's: 0.89-0.97 of the work measured on one machine of this
    # kind, 0.64-0.87 on another (CI); never more work than alone.
    assert 0.6 <= efficiency <= 1.15, f"work per vCPU-second changed when sharing: x{efficiency:.3f}"
