"""CPU bandwidth of a guest: the CFS period and quota that cap each vCPU's run time.

libvirt exposes the kernel's CFS bandwidth control per domain as
`vcpu_period`/`vcpu_quota` (each vCPU thread may run `quota` µs in every
`period` µs) and `emulator_period`/`emulator_quota` for QEMU's own threads.
A quota of -1 (or none) means unlimited. vmplacer speaks of a *share*: the
fraction of one pCPU each vCPU may use, quota/period (1.0 = unthrottled).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_PERIOD_US = 100_000
# The kernel's limits for cpu.cfs_period_us / cfs_quota_us (libvirt refuses values outside them).
PERIOD_RANGE_US = (1_000, 1_000_000)
MIN_QUOTA_US = 1_000
UNLIMITED = -1


class BandwidthError(ValueError):
    """A period or quota the kernel would refuse; the message names the field and the rule."""


@dataclass(frozen=True)
class CpuBandwidth:
    """vCPU (and optionally emulator) CFS bandwidth. `vcpu_quota_us` -1: unlimited."""

    vcpu_period_us: int = DEFAULT_PERIOD_US
    vcpu_quota_us: int = UNLIMITED
    emulator_period_us: int | None = None  # None: not read / not to be changed
    emulator_quota_us: int | None = None

    def __post_init__(self) -> None:
        for name in ("vcpu_period_us", "emulator_period_us"):
            value = getattr(self, name)
            if value is not None and not PERIOD_RANGE_US[0] <= value <= PERIOD_RANGE_US[1]:
                raise BandwidthError(f"field '{name}' must be {PERIOD_RANGE_US[0]}..{PERIOD_RANGE_US[1]} µs, "
                                     f"got {value!r}")
        for name in ("vcpu_quota_us", "emulator_quota_us"):
            value = getattr(self, name)
            if value is not None and value != UNLIMITED and value < MIN_QUOTA_US:
                raise BandwidthError(f"field '{name}' must be -1 (unlimited) or at least {MIN_QUOTA_US} µs, "
                                     f"got {value!r}")

    @property
    def limited(self) -> bool:
        return self.vcpu_quota_us != UNLIMITED and self.vcpu_quota_us < self.vcpu_period_us

    @property
    def share(self) -> float:
        """Fraction of one pCPU each vCPU may use (1.0 when unlimited)."""
        if self.vcpu_quota_us == UNLIMITED:
            return 1.0
        return min(1.0, self.vcpu_quota_us / self.vcpu_period_us)

    def same_limits(self, other: CpuBandwidth) -> bool:
        """Equal as far as both sides say (an emulator value None on either side is not compared)."""
        if self.share != other.share:
            return False
        if self.limited and (self.vcpu_quota_us, self.vcpu_period_us) != (other.vcpu_quota_us, other.vcpu_period_us):
            return False
        if self.emulator_quota_us is not None and other.emulator_quota_us is not None:
            return _emulator_share(self) == _emulator_share(other)
        return True

    def describe(self) -> str:
        if not self.limited:
            return "unthrottled"
        return f"share {self.share:.2f} ({self.vcpu_quota_us}/{self.vcpu_period_us} µs)"

    def to_dict(self) -> dict[str, Any]:
        return {"vcpu_period_us": self.vcpu_period_us, "vcpu_quota_us": self.vcpu_quota_us,
                "emulator_period_us": self.emulator_period_us, "emulator_quota_us": self.emulator_quota_us}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CpuBandwidth:
        def opt(key: str) -> int | None:
            return None if data.get(key) is None else int(data[key])

        return cls(int(data.get("vcpu_period_us", DEFAULT_PERIOD_US)), int(data.get("vcpu_quota_us", UNLIMITED)),
                   opt("emulator_period_us"), opt("emulator_quota_us"))


def _emulator_share(bandwidth: CpuBandwidth) -> float:
    quota, period = bandwidth.emulator_quota_us, bandwidth.emulator_period_us or DEFAULT_PERIOD_US
    if quota is None or quota == UNLIMITED:
        return 1.0
    return min(1.0, quota / period)


def throttled_to(share: float, period_us: int = DEFAULT_PERIOD_US) -> CpuBandwidth:
    """The bandwidth giving each vCPU (and QEMU's emulator threads, which work for the guest
    and would otherwise escape the limit) `share` of a pCPU; share >= 1 is unlimited."""
    if not 0.0 < share:
        raise BandwidthError(f"field 'share' must be above 0, got {share!r}")
    if share >= 1.0:
        return CpuBandwidth(period_us, UNLIMITED, period_us, UNLIMITED)
    quota = max(MIN_QUOTA_US, round(share * period_us))
    return CpuBandwidth(period_us, quota, period_us, quota)
