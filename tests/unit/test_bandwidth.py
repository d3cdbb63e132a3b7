"""CPU bandwidth values: shares, the kernel's limits, comparison and round trips."""

from __future__ import annotations

import re

import pytest

from vmplacer.core.placement.bandwidth import BandwidthError, CpuBandwidth, throttled_to


def test_unlimited_is_share_one_and_not_limited():
    assert CpuBandwidth().share == 1.0 and not CpuBandwidth().limited
    assert CpuBandwidth(100_000, 200_000).share == 1.0  # a quota above the period does not limit one vCPU


def test_throttled_to_sets_vcpu_and_emulator_quota():
    bandwidth = throttled_to(0.25)
    assert (bandwidth.vcpu_quota_us, bandwidth.emulator_quota_us) == (25_000, 25_000)
    assert bandwidth.limited and bandwidth.share == 0.25
    assert throttled_to(1.0) == CpuBandwidth(100_000, -1, 100_000, -1)
    assert throttled_to(0.001).vcpu_quota_us == 1_000  # the kernel's smallest quota


@pytest.mark.parametrize(("fields", "message"), [
    ({"vcpu_period_us": 500}, "field 'vcpu_period_us' must be 1000..1000000"),
    ({"vcpu_quota_us": 10}, "field 'vcpu_quota_us' must be -1 (unlimited) or at least 1000"),
    ({"emulator_quota_us": 0}, "field 'emulator_quota_us'"),
])
def test_values_the_kernel_refuses_are_refused_naming_the_field(fields, message):
    with pytest.raises(BandwidthError, match=re.escape(message)):
        CpuBandwidth(**fields)
    with pytest.raises(BandwidthError, match="field 'share' must be above 0"):
        throttled_to(0.0)


def test_same_limits_ignores_emulator_values_one_side_does_not_know():
    assert CpuBandwidth(100_000, 30_000).same_limits(throttled_to(0.3))
    assert not throttled_to(0.3).same_limits(throttled_to(0.4))
    assert not throttled_to(0.3).same_limits(CpuBandwidth(100_000, 30_000, 100_000, -1))
    assert CpuBandwidth(100_000, -1).same_limits(CpuBandwidth(50_000, -1, 100_000, -1))


def test_round_trip_and_description():
    bandwidth = throttled_to(0.4)
    assert CpuBandwidth.from_dict(bandwidth.to_dict()) == bandwidth
    assert bandwidth.describe() == "share 0.40 (40000/100000 µs)" and CpuBandwidth().describe() == "unthrottled"
