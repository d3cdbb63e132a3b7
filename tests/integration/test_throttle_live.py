"""CPU bandwidth throttles on a real QEMU guest (the testbed's host 1): set through the libvirt
adapter, read back live and from the persistent definition, and seen in the guest's own progress
counter — its rate falls to about the quota's share of an unthrottled baseline measured in the
same test, and comes back after the release."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import libvirt
import pytest

from vmplacer.adapters.libvirt_host import LibvirtHost
from vmplacer.config import HostSettings
from vmplacer.core.placement.bandwidth import CpuBandwidth, throttled_to
from vmplacer.testbed.guests import rate, wait_for_progress

pytestmark = pytest.mark.integration

UNLIMITED = CpuBandwidth(100_000, -1, 100_000, -1)

SHARE = 0.15
WINDOW_S = 2.0
# The machine is shared: an unthrottled guest may itself get well under a whole pCPU. So the
# expected effect is derived from what the guest's vCPU actually ran in the same test: under the
# quota it can run at most SHARE of each period (the causal bound, read from libvirt's vCPU time),
# and its own counter falls with the CPU time it gets: at most TOLERANCE above that (the quota
# binds), and at most OVERHEAD below it (TCG pays for every wake-up after a throttled period, more
# when the machine is busy: 0.10 for a share of 0.15 was seen once, three windows in a row).
TOLERANCE = 0.25
OVERHEAD = 0.5


@dataclass
class Window:
    rate: float  # work units per second, the guest's own counter
    cpu_share: float  # vCPU time per wall second, from libvirt


def _window(guest, dom) -> Window:
    first = wait_for_progress(guest.console)[-1]
    cpu0, t0 = dom.vcpus()[0][0][2], time.monotonic()
    time.sleep(WINDOW_S)
    cpu1, t1 = dom.vcpus()[0][0][2], time.monotonic()
    last = wait_for_progress(guest.console, after_seq=first.seq)[-1]
    return Window(rate(first, last), (cpu1 - cpu0) / 1e9 / (t1 - t0))


def _measure(guest, host: LibvirtHost, dom) -> tuple[Window, Window]:
    """Unthrottled, throttled, unthrottled, throttled: medians, so load drifting in cancels out."""
    free, held = [], []
    for index in range(4):
        throttle = index % 2 == 1
        host.set_cpu_bandwidth(guest.name, throttled_to(SHARE) if throttle else UNLIMITED)
        wait_for_progress(guest.console, samples=2, after_seq=wait_for_progress(guest.console)[-1].seq)
        (held if throttle else free).append(_window(guest, dom))
    med = statistics.median
    return (Window(med(w.rate for w in free), med(w.cpu_share for w in free)),
            Window(med(w.rate for w in held), med(w.cpu_share for w in held)))


def _follows(ratio: float, expected: float) -> bool:
    """The counter slowed with the CPU time the quota left: never faster than that allows (within
    TOLERANCE), and not much slower (within OVERHEAD: the wake-up cost of a throttled TCG vCPU)."""
    return (1 - OVERHEAD) * expected <= ratio <= (1 + TOLERANCE) * expected


def test_quota_is_read_back_persisted_and_slows_the_guest_by_its_share(testbed, make_guest, host1_conn):
    guest = make_guest("prot-bw", workload="spin", pin=1, emulator_pin=0)
    wait_for_progress(guest.console, samples=3, timeout_s=60)
    host = LibvirtHost(HostSettings("host1", testbed.host1_uri))
    try:
        before = host.cpu_bandwidth(guest.name)
        assert not before.limited, f"a fresh guest starts unthrottled, got {before}"
        host.set_cpu_bandwidth(guest.name, throttled_to(SHARE))
        live = host.cpu_bandwidth(guest.name)
        assert live.same_limits(throttled_to(SHARE)) and live.vcpu_quota_us == 15_000
        assert live.emulator_quota_us == 15_000
        dom = host1_conn.lookupByName(guest.name)
        config = dom.schedulerParametersFlags(libvirt.VIR_DOMAIN_AFFECT_CONFIG)
        assert config["vcpu_quota"] == 15_000, f"the limit must survive a restart: {config}"

        history = []
        for _attempt in range(3):  # a burst of other work on the machine: measure again before failing
            free, held = _measure(guest, host, dom)
            expected = held.cpu_share / free.cpu_share
            ratio = held.rate / free.rate
            history.append({"free": free, "held": held, "rate_ratio": round(ratio, 3),
                            "expected": round(expected, 3)})
            binds = free.cpu_share > SHARE * 1.5  # the quota must cap less than the guest got without it
            if binds and held.cpu_share <= SHARE * 1.1 and _follows(ratio, expected):
                break
        assert free.cpu_share > SHARE * 1.5, f"unthrottled the guest got too little CPU to test a quota: {history}"
        assert held.cpu_share <= SHARE * 1.1, f"the quota did not cap the vCPU: {history}"
        assert _follows(ratio, expected), f"counter rate did not follow the quota: {history}"
        assert ratio < 0.8, f"throttling did not slow the guest's own counter: {history}"

        host.set_cpu_bandwidth(guest.name, before)
        assert not host.cpu_bandwidth(guest.name).limited
        assert dom.schedulerParametersFlags(libvirt.VIR_DOMAIN_AFFECT_CONFIG)["vcpu_quota"] in (-1, 0) or \
            dom.schedulerParametersFlags(libvirt.VIR_DOMAIN_AFFECT_CONFIG)["vcpu_quota"] >= 17_592_186_044_415
    finally:
        host.close()
