"""Judge a host's placement records against the domains libvirt really has there.

A record outlives its domain when an operator undefines or migrates it by hand
(`virsh undefine`, `virsh migrate`); its exclusive pCPU claims then block
capacity for good. This module decides, record by record, what is true and
what to do about it; `app/observe/reconcile.py` reads both sides and applies the
decisions. Pure: the caller supplies every age, so a decision can be replayed.

Two windows keep it from tearing down work in progress:

* ``settle_s`` — a record changed this recently is never written to. `place`
  commits its record before libvirt defines the domain and updates it after;
  between the two the record and libvirt disagree on purpose.
* ``planned_grace_s`` — a reservation (state ``planned``, made without a domain
  so the orchestrator can define it from our XML) waits this long for its domain
  before its pCPUs are released.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.placement.isolation import isolation_violations
from vmplacer.core.placement.occupancy import exclusive_of
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import HostTopology

RECORD_STATES = ("planned", "defined", "running")
# libvirt states in which the domain's QEMU process exists (and holds its pCPUs and memory).
ACTIVE_LIVE_STATES = frozenset({"running", "paused", "blocked", "pmsuspended"})

RELEASE = "release"
SET_STATE = "set_state"
FOLLOW = "follow"  # the record moves to the host the domain now runs on
RESTORE = "restore"  # drifted pins are put back as recorded
ADOPT = "adopt"  # the record takes the drifted pins libvirt has
NONE = "none"
ACTIONS = (RELEASE, FOLLOW, SET_STATE, RESTORE, ADOPT, NONE)
# What reconciling does with drifted pinning: back to the record (default), the record follows
# libvirt, or only reported.
DRIFT_POLICIES = ("restore", "adopt", "report")

# Order of kinds in a report: what frees capacity first, information last.
KINDS = ("gone", "moved", "replaced", "stale-reservation", "adopted", "state", "settling", "pending", "drifted",
         "isolation", "unmanaged")

DEFAULT_PLANNED_GRACE_S = 3600.0
DEFAULT_SETTLE_S = 60.0


class RecordView(Protocol):
    """A recorded placement as the store reads it (`ports.RecordedPlacement`)."""

    @property
    def guest(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def domain_uuid(self) -> str | None: ...
    @property
    def placement(self) -> Placement: ...
    @property
    def age_s(self) -> float: ...


class LiveView(Protocol):
    """A domain as libvirt lists it (`ports.DomainInfo`)."""

    @property
    def name(self) -> str: ...
    @property
    def uuid(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def placement(self) -> Placement | None: ...


@dataclass(frozen=True)
class Finding:
    """One disagreement (or the lack of a record) and what reconciling does about it.

    `state` and `domain_uuid` are what a ``set_state`` writes; `deferred` names the
    kind a ``settling`` finding will be judged as once the record has settled.
    """

    guest: str
    host: str
    kind: str
    action: str
    detail: str
    recorded_state: str | None = None
    live_state: str | None = None
    state: str | None = None
    domain_uuid: str | None = None
    age_s: float | None = None
    deferred: str | None = None
    target_host: str | None = None  # `moved`: where the domain runs now

    @property
    def writes(self) -> bool:
        return self.action != NONE

    def to_dict(self) -> dict[str, Any]:
        return {
            "guest": self.guest,
            "host": self.host,
            "kind": self.kind,
            "action": self.action,
            "detail": self.detail,
            "recorded_state": self.recorded_state,
            "live_state": self.live_state,
            "state": self.state,
            "domain_uuid": self.domain_uuid,
            "age_s": None if self.age_s is None else round(self.age_s, 3),
            "deferred": self.deferred,
            "target_host": self.target_host,
        }


def record_state_of(live_state: str) -> str:
    """The record state a libvirt state stands for: a live process is "running", else "defined"."""
    return "running" if live_state in ACTIVE_LIVE_STATES else "defined"


def reconcile_host(
    host: str,
    records: Iterable[RecordView],
    live: Iterable[LiveView],
    *,
    planned_grace_s: float = DEFAULT_PLANNED_GRACE_S,
    settle_s: float = DEFAULT_SETTLE_S,
    drift: str = "report",
) -> list[Finding]:
    """Findings for every record of `host` that disagrees with libvirt, and every unrecorded domain.

    Records that agree with their domain produce nothing. `drift` (one of DRIFT_POLICIES) is
    what a drifted pinning's finding does. Raises ValueError for a negative window, a record
    in a state other than planned/defined/running, a guest recorded twice, or an unknown policy.
    """
    if drift not in DRIFT_POLICIES:
        raise ValueError(f"drift: one of {', '.join(DRIFT_POLICIES)}, got {drift!r}")
    _check_window("planned_grace_s", planned_grace_s)
    _check_window("settle_s", settle_s)
    domains = {domain.name: domain for domain in live}
    findings: list[Finding] = []
    seen: set[str] = set()
    for record in records:
        if record.state not in RECORD_STATES:
            raise ValueError(f"guest {record.guest} on host {host}: record state {record.state!r} is not one of "
                             f"{', '.join(RECORD_STATES)}")
        if record.guest in seen:
            raise ValueError(f"guest {record.guest} on host {host}: recorded twice")
        seen.add(record.guest)
        for finding in _judge(host, record, domains.get(record.guest), planned_grace_s, drift):
            findings.append(_settled(finding, record, settle_s))
    for name, domain in domains.items():
        if name not in seen:
            findings.append(Finding(
                name, host, "unmanaged", NONE,
                f"domain {name} ({domain.state}) on host {host} has no placement record; it still counts as "
                "occupied through its live pinning",
                live_state=domain.state, domain_uuid=domain.uuid))
    return sorted(findings, key=lambda f: (f.guest, KINDS.index(f.kind)))


def isolation_findings(host: str, topology: HostTopology, records: Iterable[RecordView], live: Iterable[LiveView],
                       *, emulator_cpus: frozenset[int] = frozenset()) -> list[Finding]:
    """The isolation invariant (core/placement/isolation.py) on the host as it runs: each domain's live
    pins, and the records of reservations not yet defined (pass only the records that stay:
    not those reconciling releases). Reported, never repaired here: who is in the wrong (the
    hand-pinned domain, or the owner's record) is the operator's call."""
    domains = {d.name: d for d in live}
    layout = [d.placement for d in domains.values() if d.placement is not None]
    layout += [r.placement for r in records if r.guest not in domains and r.state == "planned"]
    return [Finding(v.guest, host, "isolation", NONE, v.describe(),
                    live_state=domains[v.guest].state if v.guest in domains else None)
            for v in isolation_violations(topology, layout, emulator_cpus=emulator_cpus)]


def moved(finding: Finding, to_host: str, domain: LiveView) -> Finding:
    """A `gone` finding whose domain (same name and UUID) runs on `to_host`: the record follows it.

    Only the caller sees every host, so it turns `gone` into `moved` once it
    has found the domain elsewhere (migrated with `virsh migrate`, say).
    """
    if finding.kind != "gone":
        raise ValueError(f"guest {finding.guest}: only a gone record can have moved, not a {finding.kind} one")
    state = record_state_of(domain.state)
    return Finding(finding.guest, finding.host, "moved", FOLLOW,
                   f"recorded on host {finding.host}, but domain {finding.guest} (uuid {domain.uuid}) runs on host "
                   f"{to_host} ({domain.state}): the record follows it there with its live pinning",
                   recorded_state=finding.recorded_state, live_state=domain.state, state=state,
                   domain_uuid=domain.uuid, age_s=finding.age_s, target_host=to_host)


def followed_placement(recorded: Placement, live: Placement, host: str) -> Placement:
    """The record of a domain moved by hand, rewritten for the host it runs on now.

    Pins come from the live domain. What the guest owned exclusively follows
    its vCPUs: a vCPU that owned its pCPU owns its new one (and an isolated
    emulator its new pCPU); the sibling threads an `isolate` guest kept idle
    are not known without the new host's topology, so only the live XML's own
    exclusive set (when it has one) adds them.
    """
    owned = exclusive_of(recorded)
    exclusive = set(live.exclusive_cpus)
    for vcpu, pins in recorded.vcpupin.items():
        if len(pins) == 1 and pins <= owned:
            exclusive |= live.vcpupin.get(vcpu, frozenset())
    if recorded.emulatorpin and recorded.emulatorpin <= owned:
        exclusive |= live.emulatorpin
    return replace(recorded, host=host, vcpupin=dict(live.vcpupin), emulatorpin=live.emulatorpin,
                   memory_nodes=live.memory_nodes, exclusive_cpus=frozenset(exclusive))


def count_by_kind(findings: Sequence[Finding]) -> dict[str, int]:
    """How many findings of each kind (kinds without findings left out), in report order."""
    counts = {kind: sum(1 for f in findings if f.kind == kind) for kind in KINDS}
    return {kind: n for kind, n in counts.items() if n}


def describe_drift(recorded: Placement, live: Placement) -> str:
    """What of the pinning differs between the record and the live domain; "" when nothing does."""
    parts = []
    vcpus = sorted(set(recorded.vcpupin) | set(live.vcpupin))
    moved = [v for v in vcpus if recorded.vcpupin.get(v) != live.vcpupin.get(v)]
    if moved:
        parts.append("vCPU pins " + ", ".join(
            f"{v}→{_cpus(live.vcpupin.get(v))} (recorded {_cpus(recorded.vcpupin.get(v))})" for v in moved))
    if recorded.emulatorpin != live.emulatorpin:
        parts.append(f"emulator pins {_cpus(live.emulatorpin)} (recorded {_cpus(recorded.emulatorpin)})")
    expected = recorded.emulatorpin  # IOThreads float with the emulator threads
    strays = [i for i, cpus in sorted(live.iothreadpin.items()) if expected and cpus != expected]
    if strays:
        parts.append("IOThread pins " + ", ".join(
            f"{i}→{_cpus(live.iothreadpin[i])} (with the emulator: {_cpus(expected)})" for i in strays))
    if recorded.memory_nodes != live.memory_nodes:
        parts.append(f"memory nodes {_cpus(live.memory_nodes, 'any')} "
                     f"(recorded {_cpus(recorded.memory_nodes, 'any')})")
    return "; ".join(parts)


def describe_age(seconds: float) -> str:
    """Short human form of a duration: "45 s", "12 min", "3.5 h"."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# ----- one record ------------------------------------------------------------------------------------
def _judge(host: str, record: RecordView, domain: LiveView | None, planned_grace_s: float,
           drift_policy: str = "report") -> list[Finding]:
    guest, state = record.guest, record.state
    claims = _claims_text(record.placement)
    common: dict[str, Any] = {"recorded_state": state, "age_s": record.age_s}
    if domain is None:
        if state == "planned":
            if record.age_s > planned_grace_s:
                return [Finding(guest, host, "stale-reservation", RELEASE,
                                f"reserved {describe_age(record.age_s)} ago, and no domain {guest} was defined on "
                                f"host {host} within the reservation grace of {describe_age(planned_grace_s)}: "
                                f"the record and {claims} are released", **common)]
            return [Finding(guest, host, "pending", NONE,
                            f"reserved {describe_age(record.age_s)} ago, no domain {guest} on host {host} yet; "
                            f"released if none is defined within {describe_age(planned_grace_s)} of reserving",
                            **common)]
        return [Finding(guest, host, "gone", RELEASE,
                        f"recorded {state}, but host {host} has no domain {guest} (undefined or moved away "
                        f"outside vmplacer): the record and {claims} are released", **common)]
    live_state = domain.state
    common["live_state"] = live_state
    if record.domain_uuid and record.domain_uuid != domain.uuid:
        return [Finding(guest, host, "replaced", RELEASE,
                        f"domain {guest} on host {host} has uuid {domain.uuid}, the record {record.domain_uuid}: "
                        f"the placed domain was undefined and another defined under its name; the record and "
                        f"{claims} are released (the new domain counts through its live pinning)", **common)]
    findings = []
    target = record_state_of(live_state)
    if state == "planned":
        findings.append(Finding(guest, host, "adopted", SET_STATE,
                                f"reserved, and domain {guest} now exists on host {host} ({live_state}): "
                                f"recorded as {target} with uuid {domain.uuid}",
                                state=target, domain_uuid=domain.uuid, **common))
    elif state != target or not record.domain_uuid:
        change = f"recorded {state}, libvirt says {live_state}" if state != target else \
            f"recorded {state} without its domain uuid"
        findings.append(Finding(guest, host, "state", SET_STATE,
                                f"{change}: recorded as {target} with uuid {domain.uuid}",
                                state=target, domain_uuid=domain.uuid, **common))
    drift = describe_drift(record.placement, domain.placement) if domain.placement is not None else ""
    if drift:
        action, then = {
            "restore": (RESTORE, "pinned back as recorded"),
            "adopt": (ADOPT, "the record takes libvirt's pins"),
            "report": (NONE, "left as it is; a rebalance plan prechecks the live pinning before acting"),
        }[drift_policy]
        findings.append(Finding(guest, host, "drifted", action,
                                f"live pinning differs from the record: {drift} ({then})", **common))
    return findings


def _settled(finding: Finding, record: RecordView, settle_s: float) -> Finding:
    """A write on a record changed within `settle_s` waits: its writer may be between two steps."""
    if not finding.writes or record.age_s >= settle_s:
        return finding
    return Finding(finding.guest, finding.host, "settling", NONE,
                   f"record changed {describe_age(max(record.age_s, 0.0))} ago, within the settle window of "
                   f"{describe_age(settle_s)}: not touched now, would be {finding.kind}: {finding.detail}",
                   recorded_state=finding.recorded_state, live_state=finding.live_state,
                   age_s=finding.age_s, deferred=finding.kind)


def _claims_text(placement: Placement) -> str:
    exclusive = exclusive_of(placement)
    return f"its exclusive pCPUs {format_cpuset(exclusive)}" if exclusive else "its (shared) pCPU load"


def _cpus(cpus: frozenset[int] | None, empty: str = "unpinned") -> str:
    if cpus is None:
        return "absent"
    return format_cpuset(cpus) if cpus else empty


def _check_window(name: str, seconds: float) -> None:
    if not isinstance(seconds, (int, float)) or math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{name}: must be a number of seconds >= 0, got {seconds!r}")
