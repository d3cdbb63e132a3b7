"""Protocols between the application layer and the outside world.

`app/` depends only on these; libvirt, the simulator and the database are
adapters injected by `bootstrap.py`, so the same profiler, executor and
rebalancer run against real hosts and simulated ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from vmplacer.core.placement import Placement
from vmplacer.core.topology import HostTopology


class HypervisorError(RuntimeError):
    """A host operation failed. `retriable` tells the executor whether to try again."""

    def __init__(self, message: str, *, host: str = "", domain: str = "", retriable: bool = False):
        super().__init__(message)
        self.host = host
        self.domain = domain
        self.retriable = retriable


class DomainGone(HypervisorError):
    """The domain disappeared (undefined, migrated away) while we worked on it."""


@dataclass(frozen=True)
class DomainInfo:
    name: str
    uuid: str
    state: str  # "running", "paused", "shutoff", ...
    pause_reason: str | None  # libvirt reason when paused ("user", "migration", ...)
    vcpus: int
    memory_kib: int
    placement: Placement | None = None
    labels: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Hypervisor(Protocol):
    """One host: what runs there and the few operations vmplacer performs."""

    name: str

    def topology(self) -> HostTopology: ...
    def domains(self) -> list[DomainInfo]: ...
    def domain(self, name: str) -> DomainInfo: ...
    def suspend(self, name: str) -> None: ...
    def resume(self, name: str) -> None: ...
    def pin_vcpu(self, name: str, vcpu: int, cpus: frozenset[int]) -> None: ...
    def pin_emulator(self, name: str, cpus: frozenset[int]) -> None: ...
    def migrate(self, name: str, destination: Hypervisor, *, bandwidth_mib_s: int | None = None,
                timeout_s: float | None = None) -> None: ...


@dataclass(frozen=True)
class Sample:
    """One measurement of a domain's performance over a window."""

    domain: str
    metric: str  # "ipc", "cpu", "probe"
    value: float
    window_s: float
    valid: bool = True
    reason: str = ""


@runtime_checkable
class Sampler(Protocol):
    """Measures domains' performance: start a window, then read it."""

    metric: str

    def begin(self, domains: list[str]) -> object: ...
    def end(self, token: object) -> dict[str, Sample]: ...


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...
