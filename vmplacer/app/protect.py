"""The protection loop on one host: measure, attribute, decide, apply — every round.

A round reads the host's guests (policy from their labels, CPU bandwidth,
pinning), measures the protected ones with short Freeze'nSense rounds
(`measure`: ζ/ζb per guest), asks the interference model who costs each
protected guest what (`core.protect.attribute`), decides throttle/release
steps (`core.protect.decide`) and applies them as a stored plan through the
rebalancer's executor (`apply`: lease, precheck, execute, verify, revert,
audit, throttle ledger). When throttling cannot hold a floor it says so and,
with `propose`, stores a rebalance plan (repin/migrate) for review instead of
throttling further — at most once per `propose_every_s` per host.

Throttles persist in libvirt beyond this process by design; the ledger keeps
their reasons, and the first round after a start releases those whose
reason is gone (the protected guest stopped, left, or lost its label).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vmplacer.core.bandwidth import CpuBandwidth
from vmplacer.core.interference import InterferenceModel
from vmplacer.core.plan import Plan
from vmplacer.core.protect import (
    Decision,
    GuestView,
    LoopSettings,
    Throttle,
    attribute,
    decide,
    plan_of,
    release_costs,
)
from vmplacer.core.protection import ProtectionDefaults, protection_of
from vmplacer.core.topology import HostTopology
from vmplacer.ports import (
    WORKLOAD_CLASS_LABEL,
    Clock,
    DomainFacts,
    HypervisorError,
    PlanStore,
    ThrottleLedger,
    ThrottleRecord,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Measurement:
    """What one Freeze'nSense round gave: ζ/ζb per protected guest and the freeze overhead."""

    ratios: Mapping[str, float]
    frozen_s: float = 0.0  # how long the neighbours were frozen in this round
    wall_s: float = 0.0  # how long the measurement took


@dataclass
class RoundReport:
    host: str
    at: float
    decision: Decision
    plan: dict[str, Any] | None = None  # the applied plan (id, state, actions), None when nothing to do
    proposed_plan: int | None = None  # a rebalance plan stored because a floor cannot be held
    measurement: Measurement | None = None
    notes: list[str] = field(default_factory=list)
    shares: dict[str, float] = field(default_factory=dict)  # throttleable guest -> share after the round
    overhead: float = 0.0  # neighbours' frozen time over the loop's wall time since it started

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host, "at": self.at,
            "verdicts": [v.to_dict() for v in self.decision.verdicts],
            "steps": [{"kind": s.kind, "guest": s.guest, "share_before": round(s.before.share, 4),
                       "share_after": round(s.after.share, 4), "protects": s.protects, "reason": s.reason}
                      for s in self.decision.steps],
            "plan": self.plan, "proposed_plan": self.proposed_plan,
            "frozen_ms": 0.0 if self.measurement is None else round(self.measurement.frozen_s * 1e3, 2),
            "freeze_overhead": round(self.overhead, 5),
            "shares": {k: round(v, 4) for k, v in self.shares.items()},
            "notes": list(self.notes),
        }


class ProtectLoop:
    def __init__(
        self,
        host: Any,  # Hypervisor + BandwidthControl (+ domain_facts for labels)
        *,
        measure: Callable[[list[str]], Measurement],
        ledger: ThrottleLedger,
        plans: PlanStore,
        apply: Callable[[int], Plan],
        clock: Clock,
        wall: Callable[[], float],
        defaults: ProtectionDefaults | None = None,
        settings: LoopSettings | None = None,
        model: Callable[[], InterferenceModel] | None = None,
        propose: Callable[[str], Plan] | None = None,
        propose_every_s: float = 300.0,
        scope: Callable[[str], bool] | None = None,
    ):
        self.host = host
        self.measure = measure
        self.ledger = ledger
        self.plans = plans
        self.apply = apply
        self.clock = clock
        self.wall = wall
        self.defaults = defaults or ProtectionDefaults()
        self.settings = settings or LoopSettings()
        self.model = model or InterferenceModel
        self.propose = propose
        self.propose_every_s = propose_every_s
        self.in_scope = scope or (lambda _name: True)
        self.calm: dict[str, int] = {}
        self._proposed_at: float | None = None
        self._topology: HostTopology | None = None
        self._frozen_s = 0.0
        self._started: float | None = None

    # ----- one round --------------------------------------------------------------------------
    def round(self) -> RoundReport:
        if self._started is None:
            self._started = self.clock.now()
        notes: list[str] = []
        guests = self._observe(notes)
        protected = [g.name for g in guests if g.protection.protected and g.running]
        measurement = self.measure(protected) if protected else None
        if measurement is not None:
            guests = [_with_ratio(g, measurement.ratios.get(g.name)) for g in guests]
        records = self._forget_lifted(self.ledger.current(self.host.name), guests)
        throttles = [Throttle(r.guest, r.bandwidth, r.original, r.protects) for r in records]
        gains, costs = self._gains(guests)
        decision = decide(guests, throttles, gains, self.settings, self.calm, costs)
        self.calm = dict(decision.calm)
        report = RoundReport(self.host.name, self.wall(), decision, measurement=measurement, notes=notes)
        plan = plan_of(self.host.name, decision, created_at=report.at)
        if plan.actions:
            stored = self.plans.save(plan, created_by="protect")
            assert stored.id is not None
            done = self.apply(stored.id)
            report.plan = {"id": done.id, "state": done.state,
                           "actions": [{"kind": a.kind, "guest": a.guest, "state": a.state, "message": a.message}
                                       for a in done.actions]}
        if decision.cannot_hold:
            report.proposed_plan = self._propose(notes)
        report.shares = self._shares(guests, notes)
        if measurement is not None:
            self._frozen_s += measurement.frozen_s
        elapsed = self.clock.now() - self._started
        report.overhead = self._frozen_s / elapsed if elapsed > 0 else 0.0
        return report

    def run(self, *, interval_s: float, rounds: int | None = None,
            on_round: Callable[[RoundReport], None] | None = None, stop: Callable[[], bool] | None = None) -> int:
        """Rounds every `interval_s` until `stop()` (or `rounds` rounds); returns how many ran."""
        done = 0
        while rounds is None or done < rounds:
            if stop is not None and stop():
                break
            started = self.clock.now()
            try:
                report = self.round()
            except HypervisorError as exc:  # a host hiccup skips a round, it does not end the loop
                log.warning("protect %s: round skipped: %s", self.host.name, exc)
                report = None
            done += 1
            if report is not None and on_round is not None:
                on_round(report)
            if rounds is not None and done >= rounds:
                break
            self.clock.sleep(max(0.0, interval_s - (self.clock.now() - started)))
        return done

    # ----- reading the host ---------------------------------------------------------------------
    def _observe(self, notes: list[str]) -> list[GuestView]:
        domains = [d for d in self.host.domains() if self.in_scope(d.name)]
        facts = self._facts([d.name for d in domains])
        guests = []
        for domain in domains:
            labels = facts[domain.name].labels if domain.name in facts else dict(domain.labels)
            running = domain.state == "running"
            bandwidth = CpuBandwidth()
            if running:
                try:
                    bandwidth = self.host.cpu_bandwidth(domain.name)
                except HypervisorError as exc:
                    notes.append(f"{domain.name}: CPU bandwidth unreadable ({exc}): left alone")
                    continue
            protection = protection_of(labels, self.defaults)
            if protection.source == "invalid labels":
                notes.append(f"{domain.name}: protection labels are invalid (edited by hand?): neither protected "
                             "nor throttled")
            cpus = dict(domain.placement.vcpupin) if domain.placement is not None else None
            guests.append(GuestView(domain.name, protection, running, bandwidth, cpus or None,
                                    workload_class=labels.get(WORKLOAD_CLASS_LABEL, "unknown")))
        return guests

    def _forget_lifted(self, records: list[ThrottleRecord], guests: Sequence[GuestView]) -> list[ThrottleRecord]:
        """Ledger rows of guests libvirt shows unthrottled (a throttle recorded before a process
        died, whose change never landed) are dropped: nothing is left to release."""
        live = {g.name: g.bandwidth for g in guests if g.running}
        kept = []
        for record in records:
            if record.guest in live and not live[record.guest].limited:
                self.ledger.note(self.host.name, record.guest, live[record.guest], record.original,
                                 protects=record.protects, reason="libvirt shows it unthrottled")
                continue
            kept.append(record)
        return kept

    def _facts(self, names: list[str]) -> Mapping[str, DomainFacts]:
        read = getattr(self.host, "domain_facts", None)
        return read(names) if callable(read) else {}

    def _gains(self, guests: Sequence[GuestView]) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
        """What one more throttle step would give each protected guest below its floor, and what
        one release step would cost each one with headroom (both from the model)."""
        measured = [g for g in guests if g.protection.protected and g.running and g.ratio is not None
                    and g.protection.floor is not None]
        below = [g for g in measured if g.ratio < g.protection.floor]  # type: ignore[operator]
        above = [g for g in measured if g not in below and any(o.bandwidth.limited for o in guests)]
        if not below and not above:
            return {}, {}
        if self._topology is None:
            self._topology = self.host.topology()
        model = self.model()
        step = self.settings.step
        return ({g.name: attribute(self._topology, model, guests, g.name, step) for g in below},
                {g.name: release_costs(self._topology, model, guests, g.name, step) for g in above})

    def _shares(self, guests: Sequence[GuestView], notes: list[str]) -> dict[str, float]:
        shares = {}
        for guest in guests:
            if guest.protection.throttleable and guest.running:
                try:
                    shares[guest.name] = self.host.cpu_bandwidth(guest.name).share
                except HypervisorError as exc:
                    notes.append(f"{guest.name}: share unreadable after the round: {exc}")
        return shares

    def _propose(self, notes: list[str]) -> int | None:
        if self.propose is None:
            notes.append("a floor cannot be held by throttling; run `vmplacer rebalance plan` to move guests")
            return None
        now = self.wall()
        if self._proposed_at is not None and now - self._proposed_at < self.propose_every_s:
            return None
        self._proposed_at = now
        try:
            plan = self.propose(self.host.name)
        except Exception as exc:  # noqa: BLE001 - a failed proposal is reported, the loop goes on
            notes.append(f"a floor cannot be held and no rebalance plan could be made: {exc}")
            return None
        notes.append(f"a floor cannot be held by throttling: rebalance plan {plan.id} ({plan.state}) proposed: "
                     f"{plan.summary}")
        return plan.id


def _with_ratio(guest: GuestView, ratio: float | None) -> GuestView:
    return replace(guest, ratio=ratio) if ratio is not None else guest
