"""The protection loop's decisions: throttle whoever hurts a protected guest, release when it has headroom.

One round sees, per guest on one host, its policy (core.protect.policy), its
current CPU bandwidth and — for protected guests — its measured Freeze'nSense
ratio ζ/ζb. The interference model says *who* costs a protected guest what:
for each throttleable neighbour, the predicted gain of the protected guest if
that neighbour got one step less CPU (`attribute`). Then, per protected guest:

* ratio below the floor → throttle the neighbour whose step helps most, one
  step (never below its minimum share, never a guest that is not
  throttleable); no such neighbour left → the floor cannot be held by
  throttling: say so (the caller proposes a rebalance instead);
* ratio above floor + margin for `release_after` rounds in a row → release
  one step of the throttles set for it, unless the model predicts that step
  would take it below floor + margin (hysteresis: the band between floor and
  floor + margin holds still, so the loop does not oscillate);
* protected guest gone, stopped, idle, or no longer protected → release
  every throttle set for it at once; a throttled guest that is no longer
  throttleable is released at once too. Idle means running but using almost
  no CPU (`cpu_busy`, `idle_now`): it gives no valid ζ/ζb and needs no
  protection; when it gets busy again it is measured and throttled again.

Pure: no clock, no I/O; the app layer measures, applies and remembers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vmplacer.core.placement.bandwidth import CpuBandwidth, throttled_to
from vmplacer.core.model.interference import InterferenceModel, Tenant
from vmplacer.core.rebalance.plan import Action, Plan, initial_state
from vmplacer.core.protect.policy import Protection
from vmplacer.core.topology.host import HostTopology

SHARE_EPSILON = 1e-6


@dataclass(frozen=True)
class LoopSettings:
    step: float = 0.1  # share moved per throttle or release step
    release_margin: float = 0.05  # ratio above floor + margin counts as headroom
    release_after: int = 2  # rounds of headroom in a row before a release step
    min_gain: float = 0.005  # a neighbour whose step is predicted to help less is not an antagonist

    def __post_init__(self) -> None:
        if not 0.0 < self.step <= 0.5:
            raise ValueError(f"protect: field 'step' must be in (0, 0.5], got {self.step!r}")
        if not 0.0 <= self.release_margin <= 0.5:
            raise ValueError(f"protect: field 'release_margin' must be in [0, 0.5], got {self.release_margin!r}")
        if self.release_after < 1:
            raise ValueError(f"protect: field 'release_after' must be at least 1, got {self.release_after!r}")


@dataclass(frozen=True)
class GuestView:
    """One guest as a round saw it."""

    name: str
    protection: Protection
    running: bool
    bandwidth: CpuBandwidth
    cpus: Mapping[int, frozenset[int]] | None = None  # vCPU -> pCPUs; None: unknown
    ratio: float | None = None  # ζ/ζb, protected guests only; None: not measured this round
    demand: float = 1.0  # share of a pCPU each vCPU asks for (1.0 when not measured)
    key: str = ""  # workload key for the model (default: the name)
    workload_class: str = "unknown"
    idle: bool = False  # running but using almost no CPU (see idle_now)


@dataclass(frozen=True)
class Throttle:
    """A throttle in force that vmplacer set (from the ledger)."""

    guest: str
    bandwidth: CpuBandwidth
    original: CpuBandwidth
    protects: str


@dataclass(frozen=True)
class Step:
    """One throttle or release the loop decided."""

    kind: str  # "throttle" | "release"
    guest: str
    before: CpuBandwidth
    after: CpuBandwidth
    original: CpuBandwidth
    protects: str
    reason: str
    gain: float = 0.0  # predicted gain of the protected guest's performance


@dataclass(frozen=True)
class Verdict:
    """What one round found for one protected guest."""

    guest: str
    floor: float
    ratio: float | None
    state: str  # "below" | "held" | "headroom" | "unmeasured" | "cannot-hold" | "idle"
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"guest": self.guest, "floor": self.floor, "ratio": self.ratio, "state": self.state,
                "message": self.message}


@dataclass(frozen=True)
class Decision:
    steps: tuple[Step, ...] = ()
    verdicts: tuple[Verdict, ...] = ()
    calm: Mapping[str, int] = field(default_factory=dict)  # rounds of headroom in a row, per protected guest

    @property
    def cannot_hold(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.state == "cannot-hold")


def attribute(topology: HostTopology, model: InterferenceModel, guests: Sequence[GuestView], victim: str,
              step: float) -> dict[str, float]:
    """Per throttleable running neighbour: the predicted gain of `victim`'s performance if that
    neighbour's share went down one step (time sharing and learned interference together)."""
    tenants = {g.name: _tenant(g, g.bandwidth.share) for g in guests if g.running and g.cpus}
    if victim not in tenants:
        return {}
    base = model.predict(topology, tenants.values())[victim].perf
    gains: dict[str, float] = {}
    for guest in guests:
        if guest.name == victim or guest.name not in tenants or not guest.protection.throttleable:
            continue
        lower = max(guest.protection.min_share or 0.0, guest.bandwidth.share - step)
        if lower >= guest.bandwidth.share - SHARE_EPSILON:
            continue
        what_if = {**tenants, guest.name: _tenant(guest, lower)}
        gains[guest.name] = model.predict(topology, what_if.values())[victim].perf - base
    return gains


def release_costs(topology: HostTopology, model: InterferenceModel, guests: Sequence[GuestView], victim: str,
                  step: float) -> dict[str, float]:
    """Per throttled running neighbour: the predicted loss of `victim`'s performance if that
    neighbour's share went up one step — what a release would cost it."""
    tenants = {g.name: _tenant(g, g.bandwidth.share) for g in guests if g.running and g.cpus}
    if victim not in tenants:
        return {}
    base = model.predict(topology, tenants.values())[victim].perf
    costs: dict[str, float] = {}
    for guest in guests:
        if guest.name == victim or guest.name not in tenants or not guest.bandwidth.limited:
            continue
        what_if = {**tenants, guest.name: _tenant(guest, min(1.0, guest.bandwidth.share + step))}
        costs[guest.name] = max(0.0, base - model.predict(topology, what_if.values())[victim].perf)
    return costs


def _tenant(guest: GuestView, share: float) -> Tenant:
    assert guest.cpus is not None
    load = max(0.01, min(1.0, guest.demand, share))
    return Tenant(guest.name, dict(guest.cpus), guest.key or guest.name, guest.workload_class, load)


def decide(guests: Sequence[GuestView], throttles: Iterable[Throttle], gains: Mapping[str, Mapping[str, float]],
           settings: LoopSettings, calm: Mapping[str, int] | None = None,
           costs: Mapping[str, Mapping[str, float]] | None = None) -> Decision:
    """The steps of one round on one host (see the module docstring for the rules).

    `gains[victim][neighbour]` comes from `attribute`; `costs[victim][neighbour]` from
    `release_costs` (a release predicted to take the victim below floor + margin waits; without
    costs, headroom alone decides); `calm` is the previous round's count of rounds with headroom
    per protected guest.
    """
    costs = costs or {}
    calm = dict(calm or {})
    by_name = {g.name: g for g in guests}
    ledger = {t.guest: t for t in throttles}
    steps: dict[str, Step] = {}
    verdicts: list[Verdict] = []
    new_calm: dict[str, int] = {}

    # Throttles whose reason is gone, or on guests that may no longer be throttled: release now.
    for record in ledger.values():
        victim, guest = by_name.get(record.protects), by_name.get(record.guest)
        if guest is None:
            continue  # the throttled guest left the host: nothing to release here
        why = _reason_gone(victim, record.protects) or (
            "" if guest.protection.throttleable else f"{guest.name} is no longer throttleable")
        if why:
            steps[guest.name] = _release_step(guest, record, record.original, f"{why}: release")

    for victim in sorted((g for g in guests if g.protection.protected and g.running), key=lambda g: g.name):
        floor = victim.protection.floor
        assert floor is not None
        if victim.idle:
            verdicts.append(Verdict(victim.name, floor, None, "idle", "idle (almost no CPU used): nothing to "
                                    "protect, its throttles released"))
            new_calm[victim.name] = 0
            continue
        if victim.ratio is None:
            verdicts.append(Verdict(victim.name, floor, None, "unmeasured", "no ζ/ζb this round: holding"))
            new_calm[victim.name] = 0
            continue
        ratio = victim.ratio
        if ratio < floor:
            new_calm[victim.name] = 0
            verdicts.append(_throttle_for(victim, floor, ratio, by_name, ledger, gains.get(victim.name, {}),
                                          settings, steps))
        elif ratio > floor + settings.release_margin:
            count = calm.get(victim.name, 0) + 1
            step = _release_for(victim, ratio, count, by_name, ledger, settings, steps) \
                if count >= settings.release_after else None
            message = f"ζ/ζb {ratio:.2f} above floor {floor:.2f}"
            cost = costs.get(victim.name, {}).get(step.guest) if step is not None else None
            if step is not None and cost is not None and ratio - cost < floor + settings.release_margin:
                message += (f"; releasing {step.guest} a step would cost about {cost:.2f} "
                            f"(below {floor + settings.release_margin:.2f}): holding")
                step = None
            if step is not None:
                steps[step.guest] = step
                count = 0  # the next release waits for `release_after` more rounds of headroom
                message += f"; releasing {step.guest} to share {step.after.share:.2f}"
            new_calm[victim.name] = count
            verdicts.append(Verdict(victim.name, floor, ratio, "headroom", message))
        else:
            new_calm[victim.name] = 0
            verdicts.append(Verdict(victim.name, floor, ratio, "held", f"ζ/ζb {ratio:.2f} within "
                                    f"{floor:.2f}..{floor + settings.release_margin:.2f}: holding"))
    return Decision(tuple(steps[name] for name in sorted(steps)), tuple(verdicts), new_calm)


def _release_for(victim: GuestView, ratio: float, rounds: int, by_name: Mapping[str, GuestView],
                 ledger: Mapping[str, Throttle], settings: LoopSettings, steps: Mapping[str, Step]) -> Step | None:
    """One release step of the deepest throttle set for `victim` (None when it set none)."""
    mine = [r for r in ledger.values() if r.protects == victim.name and r.guest in by_name and r.guest not in steps]
    if not mine:
        return None
    record = max(mine, key=lambda r: r.original.share - r.bandwidth.share)
    guest = by_name[record.guest]
    target = min(record.original.share, guest.bandwidth.share + settings.step)
    after = record.original if target >= record.original.share - SHARE_EPSILON else \
        throttled_to(target, guest.bandwidth.vcpu_period_us)
    floor = victim.protection.floor or 0.0
    return _release_step(guest, record, after, f"{victim.name} at ζ/ζb {ratio:.2f}, above its floor {floor:.2f} + "
                                               f"{settings.release_margin:.2f} for {rounds} rounds: release a step")


def _reason_gone(victim: GuestView | None, name: str) -> str:
    if victim is None:
        return f"{name}, which it protected, is no longer on this host"
    if not victim.running:
        return f"{name}, which it protected, is not running"
    if not victim.protection.protected:
        return f"{name}, which it protected, is no longer protected"
    if victim.idle:
        return f"{name}, which it protected, is idle"
    return ""


@dataclass(frozen=True)
class IdleSettings:
    idle_below: float = 0.1  # CPU used per vCPU (share of a pCPU) under which a guest counts as idle
    busy_above: float = 0.2  # ... and over which an idle guest counts as busy again (hysteresis)
    min_span_s: float = 1.0  # shorter spans between two reads decide nothing

    def __post_init__(self) -> None:
        if not 0.0 < self.idle_below <= self.busy_above <= 1.0:
            raise ValueError(f"protect: fields 'idle_below' and 'busy_above' must satisfy 0 < idle_below <= "
                             f"busy_above <= 1, got {self.idle_below!r}, {self.busy_above!r}")


def cpu_busy(before: tuple[float, float] | None, after: tuple[float, float], vcpus: int) -> float | None:
    """Share of a pCPU each vCPU used between two (wall time, CPU time) reads; None when it cannot
    be told (no earlier read, no time passed, or the counter went back: the guest restarted)."""
    if before is None or vcpus < 1:
        return None
    span, used = after[0] - before[0], after[1] - before[1]
    if span <= 0 or used < 0:
        return None
    return used / span / vcpus


def idle_now(was_idle: bool, busy: float | None, span_s: float, settings: IdleSettings) -> bool:
    """Idle after this read? Below `idle_below` → idle; above `busy_above` → busy; in between,
    unknown, or a span too short to judge → as it was."""
    if busy is None or span_s < settings.min_span_s:
        return was_idle
    if busy < settings.idle_below:
        return True
    if busy > settings.busy_above:
        return False
    return was_idle


def _throttle_for(victim: GuestView, floor: float, ratio: float, by_name: Mapping[str, GuestView],
                  ledger: Mapping[str, Throttle], gains: Mapping[str, float], settings: LoopSettings,
                  steps: dict[str, Step]) -> Verdict:
    candidates = sorted(((gain, name) for name, gain in gains.items()
                         if gain >= settings.min_gain and name in by_name and by_name[name].running
                         and by_name[name].protection.throttleable and not by_name[name].protection.protected),
                        reverse=True)
    for gain, name in candidates:
        if name in steps:
            continue  # one step per guest per round
        guest = by_name[name]
        current = guest.bandwidth
        min_share = guest.protection.min_share or 1.0
        target = max(min_share, current.share - settings.step)
        if target >= current.share - SHARE_EPSILON:
            continue  # at its minimum share already
        record = ledger.get(name)
        original = record.original if record is not None else guest.bandwidth
        after = throttled_to(target, guest.bandwidth.vcpu_period_us)
        steps[name] = Step("throttle", name, guest.bandwidth, after, original, victim.name,
                           f"{victim.name} at ζ/ζb {ratio:.2f}, below its floor {floor:.2f}; {name} costs it most "
                           f"(one step predicted +{gain:.3f})", gain)
        return Verdict(victim.name, floor, ratio, "below",
                       f"ζ/ζb {ratio:.2f} below floor {floor:.2f}: throttling {name} to share {target:.2f}")
    at_min = ", ".join(sorted(
        g.name for g in by_name.values() if g.name != victim.name and g.running and g.protection.throttleable
        and g.bandwidth.share <= (g.protection.min_share or 1.0) + SHARE_EPSILON)) or "none"
    return Verdict(victim.name, floor, ratio, "cannot-hold",
                   f"ζ/ζb {ratio:.2f} below floor {floor:.2f} and no throttleable neighbour left above its minimum "
                   f"share (at their minimum: {at_min}): throttling cannot hold the floor — "
                   "rebalance (repin or migrate) instead")


def _release_step(guest: GuestView, record: Throttle, after: CpuBandwidth, reason: str) -> Step:
    if not after.share > guest.bandwidth.share + SHARE_EPSILON:
        after = replace(record.original)  # already at/above target: make it the original exactly
    return Step("release", guest.name, guest.bandwidth, after, record.original, record.protects, reason)


def plan_of(host: str, decision: Decision, *, created_at: float | None = None) -> Plan:
    """The decision as a stored, reviewable plan of throttle/release actions (empty when nothing to do)."""
    actions: list[Action] = []
    for step in decision.steps:
        if step.kind == "release" and not step.after.share > step.before.share + SHARE_EPSILON:
            continue  # nothing to lift (libvirt already shows the original)
        actions.append(Action(
            index=len(actions), kind=step.kind, host=host, guest=step.guest, reason=step.reason,
            predicted_gain=step.gain,
            parameters={"bandwidth_before": step.before.to_dict(), "bandwidth_after": step.after.to_dict(),
                        "bandwidth_original": step.original.to_dict(), "protects": step.protects},
        ))
    verdicts = "; ".join(f"{v.guest}: {v.message}" for v in decision.verdicts) or "no protected guest running"
    return Plan(actions=tuple(actions), hosts=(host,), state=initial_state(actions), summary=f"protect {host}: "
                f"{verdicts}", settings={"protect": [v.to_dict() for v in decision.verdicts]}, created_at=created_at)


# ----- reconcile: the ledger against what libvirt shows ---------------------------------------------
THROTTLE_FINDINGS = ("throttle-gone", "throttle-unrecorded", "throttle-changed")


@dataclass(frozen=True)
class ThrottleFinding:
    """A disagreement between the throttle ledger and a host (reported, never acted on by reconcile)."""

    host: str
    guest: str
    kind: str  # one of THROTTLE_FINDINGS
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "guest": self.guest, "kind": self.kind, "detail": self.detail}


def throttle_findings(host: str, recorded: Iterable[Throttle], live: Mapping[str, CpuBandwidth | None]
                      ) -> list[ThrottleFinding]:
    """Throttles libvirt no longer shows, throttles vmplacer did not set, throttles changed by hand.

    `live` maps each domain on the host to the bandwidth libvirt reports (None: not readable).
    """
    findings: list[ThrottleFinding] = []
    ledger = {t.guest: t for t in recorded}
    for guest, record in sorted(ledger.items()):
        bandwidth = live.get(guest)
        if guest not in live:
            findings.append(ThrottleFinding(host, guest, "throttle-gone", f"recorded at {record.bandwidth.describe()} "
                                            f"for {record.protects}, but the domain is no longer on {host}"))
        elif bandwidth is not None and not bandwidth.limited:
            findings.append(ThrottleFinding(host, guest, "throttle-gone", f"recorded at {record.bandwidth.describe()} "
                                            f"for {record.protects}, but libvirt shows it unthrottled"))
        elif bandwidth is not None and not bandwidth.same_limits(record.bandwidth):
            findings.append(ThrottleFinding(host, guest, "throttle-changed", f"recorded at "
                                            f"{record.bandwidth.describe()} for {record.protects}, libvirt shows "
                                            f"{bandwidth.describe()}"))
    for guest, bandwidth in sorted(live.items()):
        if guest not in ledger and bandwidth is not None and bandwidth.limited:
            findings.append(ThrottleFinding(host, guest, "throttle-unrecorded", f"libvirt shows {bandwidth.describe()}, "
                                            "which vmplacer did not set (left alone)"))
    return findings
