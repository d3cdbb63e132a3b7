"""The protection loop on one host: measure, attribute, decide, apply — every round.

A round reads the host's guests (policy from their labels, CPU bandwidth,
pinning), measures the protected ones with short Freeze'nSense rounds
(`measure`: ζ/ζb per guest), asks the interference model who costs each
protected guest what (`core.protect.decisions.attribute`), decides throttle/release
steps (`core.protect.decisions.decide`) and applies them as a stored plan through the
rebalancer's executor (`apply`: lease, precheck, execute, verify, revert,
audit, throttle ledger). When throttling cannot hold a floor it says so and,
with `propose`, stores a rebalance plan (repin/migrate) for review instead of
throttling further — at most once per `propose_every_s` per host.

Throttles persist in libvirt beyond this process by design; the ledger keeps
their reasons, and the first round after a start releases those whose
reason is gone (the protected guest stopped, left, or lost its label).

Cadence and cost (core.protect.cadence): decisions use a smoothed ζ/ζb; the
next round comes sooner while acting or near a floor and later while every
floor holds with margin; a measurement that would take the neighbours'
frozen time over the budget is skipped (the round still watches stops and
idleness, which cost no freezing). A protected guest's own CPU time tells
whether it is idle; an idle one releases the throttles set for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vmplacer.core.placement.bandwidth import CpuBandwidth
from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.rebalance.plan import Plan
from vmplacer.core.protect.decisions import (
    Decision,
    GuestView,
    Step,
    IdleSettings,
    LoopSettings,
    Throttle,
    attribute,
    cpu_busy,
    decide,
    idle_now,
    plan_of,
    release_costs,
)
from vmplacer.core.protect.cadence import (
    CadenceSettings,
    FreezeBudget,
    Pace,
    RatioSmoother,
    expected_freeze_s,
    next_pace,
    steady_spacing_s,
)
from vmplacer.core.protect.policy import ProtectionDefaults, protection_of
from vmplacer.core.topology.host import HostTopology
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
    guests: dict[str, dict[str, Any]] = field(default_factory=dict)  # per protected guest: ratios, counters
    pace: Pace | None = None  # when the next round comes and with how many samples
    budget: dict[str, float] = field(default_factory=dict)  # the freeze budget: limit, spend, share

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host, "at": self.at,
            "guests": {k: dict(v) for k, v in self.guests.items()},
            "pace": None if self.pace is None else {"interval_s": self.pace.interval_s, "samples": self.pace.samples,
                                                    "reason": self.pace.reason},
            "budget": dict(self.budget),
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
        measure: Callable[[list[str], int], Measurement],  # (guests, samples)
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
        cadence: CadenceSettings | None = None,
        idle: IdleSettings | None = None,
        t_m_s: float = 0.01,
        history: Callable[[dict[str, Any]], None] | None = None,
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
        self.cadence = cadence or CadenceSettings()
        self.idle_settings = idle or IdleSettings()
        self.t_m_s = t_m_s
        self.history = history
        self.budget = FreezeBudget(self.cadence.budget, self.cadence.window_s, self.cadence.allowance_s)
        self.smoother = RatioSmoother(self.cadence.smooth_k)
        self.pace = Pace(self.cadence.fast_interval_s, self.cadence.fast_samples, 0, "first round", urgent=True)
        self._measured_at: float | None = None  # when the last measurement started
        self._per_sample_s = t_m_s  # the longest frozen time per sample seen lately (the budget's estimate)
        self._cpu_reads: dict[str, tuple[float, float]] = {}  # guest -> (clock, CPU seconds)
        self._idle: dict[str, bool] = {}
        self._counters: dict[str, dict[str, float]] = {}  # guest -> throttles_applied, below_floor_s
        self._below_since: dict[str, float] = {}  # guest -> clock of the last round that found it below

    # ----- one round --------------------------------------------------------------------------
    def round(self) -> RoundReport:
        if self._started is None:
            self._started = self.clock.now()
            self.budget.start(self._started)
        notes: list[str] = []
        guests = self._mark_idle(self._observe(notes), notes)
        protected = [g.name for g in guests if g.protection.protected and g.running and not g.idle]
        urgent = self.pace.urgent
        samples = self.pace.samples
        measurement = None
        blocked_until: float | None = None
        if protected:
            expected = expected_freeze_s(samples, len(protected), self._per_sample_s)
            now = self.clock.now()
            spacing = steady_spacing_s(self.cadence, expected)
            if not urgent and self._measured_at is not None and now - self._measured_at < spacing:
                notes.append(f"steady pace: measuring every {spacing:.0f} s while not acting "
                             f"({self.cadence.steady_share:.0%} of the freeze budget)")
            elif self.budget.allows(now, expected):
                self._measured_at = now
                measurement = self.measure(protected, samples)
            else:
                blocked_until = self.budget.ready_at(now, expected)
                limit, span = self.budget.limit_at(now), self.budget.span(now, self._started)
                starting = (f" ({self.budget.max_share:.2%} of {span:.0f} s running + "
                            f"{self.budget.startup_allowance_s:g} s start-up allowance)"
                            if self.budget.starting(now) else "")
                notes.append(f"freeze budget: {self.budget.spent(now):.2f} s of {limit:.2f} s{starting} spent in "
                             f"the last {span:.0f} s; this round's ~{expected:.2f} s would exceed it: "
                             "not measured")
        raw = dict(measurement.ratios) if measurement is not None else {}
        smoothed = {name: self.smoother.add(name, raw.get(name)) for name in protected}
        self.smoother.forget_except(protected)
        if measurement is not None:  # decide on the smoothed ratio, and only in rounds that measured
            guests = [_with_ratio(g, smoothed.get(g.name)) for g in guests]
        records = self._forget_lifted(self.ledger.current(self.host.name), guests)
        throttles = [Throttle(r.guest, r.bandwidth, r.original, r.protects) for r in records]
        gains, costs = self._gains(guests)
        decision = decide(guests, throttles, gains, self.settings, self.calm, costs)
        self.calm = dict(decision.calm)
        report = RoundReport(self.host.name, self.wall(), decision, measurement=measurement, notes=notes)
        report.plan = self._carry_out(decision, report.at)
        if decision.cannot_hold:
            report.proposed_plan = self._propose(notes)
        report.shares = self._shares(guests, notes)
        now = self.clock.now()
        if measurement is not None:
            self._frozen_s += measurement.frozen_s
            self.budget.record(now, measurement.frozen_s)
            taken = samples * max(1, len(measurement.ratios) or len(protected))
            if measurement.frozen_s > 0:  # the estimate follows what freezing really costs here
                self._per_sample_s = max(self.t_m_s, 0.5 * self._per_sample_s + 0.5 * measurement.frozen_s / taken,
                                         measurement.frozen_s / taken)
        elapsed = now - self._started
        report.overhead = self._frozen_s / elapsed if elapsed > 0 else 0.0
        report.budget = {"max_share": self.budget.max_share, "window_s": self.budget.window_s,
                         "span_s": round(self.budget.span(now, self._started), 3),
                         "spent_s": round(self.budget.spent(now), 4),
                         "limit_s": round(self.budget.limit_at(now), 4),
                         "startup_allowance_s": self.budget.startup_allowance_s if self.budget.starting(now) else 0.0,
                         "share": round(self.budget.share(now, self._started), 5)}
        changed = {s.protects for s in decision.steps}
        self.smoother.reset(changed)
        report.guests = self._guest_stats(guests, decision, raw, report.plan, now)
        # the smoothed estimate stands in rounds that did not measure (steady pace, budget)
        margins = [None if smoothed.get(g.name) is None or g.protection.floor is None
                   else smoothed[g.name] - g.protection.floor - self.settings.release_margin  # type: ignore[operator]
                   for g in guests if g.name in protected]
        if blocked_until is not None and not decision.steps:  # wait for the budget, not for a fast pace
            wait = min(self.cadence.slow_interval_s, max(self.cadence.fast_interval_s, blocked_until - now))
            self.pace = Pace(wait, self.pace.samples, self.pace.calm, "waiting for the freeze budget",
                             urgent=self.pace.urgent)
        else:
            below = any(smoothed.get(g.name) is not None and g.protection.floor is not None
                        and smoothed[g.name] < g.protection.floor  # type: ignore[operator]
                        for g in guests if g.name in protected)
            self.pace = next_pace(self.cadence, acted=bool(decision.steps), margins=margins, calm=self.pace.calm,
                                  below=below)
        report.pace = self.pace
        if self.history is not None:
            try:
                self.history(report.to_dict())
            except OSError as exc:  # history is for looking back; the loop goes on without it
                notes.append(f"round history not recorded: {exc}")
        return report

    def run(self, *, rounds: int | None = None, on_round: Callable[[RoundReport], None] | None = None,
            stop: Callable[[], bool] | None = None, poll_s: float = 1.0) -> int:
        """Rounds at the cadence's pace until `stop()` (or `rounds` rounds); returns how many ran.
        `stop` is asked at least every `poll_s` while waiting for the next round."""
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
            due = started + self.pace.interval_s
            while (left := due - self.clock.now()) > 0:
                if stop is not None and stop():
                    return done
                self.clock.sleep(min(left, poll_s))
        return done

    def release_all(self, reason: str) -> RoundReport:
        """Release every throttle in the ledger on this host (within scope) at once: the loop is
        being stopped for good and its throttles have no reason left."""
        notes: list[str] = []
        guests = self._observe(notes)
        by_name = {g.name: g for g in guests}
        records = self._forget_lifted(self.ledger.current(self.host.name), guests)
        steps = tuple(Step("release", r.guest, by_name[r.guest].bandwidth, r.original, r.original, r.protects,
                           f"{reason}: release") for r in records if r.guest in by_name and by_name[r.guest].running)
        decision = Decision(steps, ())
        report = RoundReport(self.host.name, self.wall(), decision, notes=notes)
        report.plan = self._carry_out(decision, report.at)
        report.shares = self._shares(guests, notes)
        return report

    def _carry_out(self, decision: Decision, at: float) -> dict[str, Any] | None:
        """Store the decision's steps as a plan and apply it; what was done, or None with no step."""
        plan = plan_of(self.host.name, decision, created_at=at)
        if not plan.actions:
            return None
        stored = self.plans.save(plan, created_by="protect")
        assert stored.id is not None
        done = self.apply(stored.id)
        return {"id": done.id, "state": done.state,
                "actions": [{"kind": a.kind, "guest": a.guest, "state": a.state, "message": a.message}
                            for a in done.actions]}

    # ----- idleness and per-guest bookkeeping ------------------------------------------------------
    def _mark_idle(self, guests: list[GuestView], notes: list[str]) -> list[GuestView]:
        """Mark running protected guests idle from their own CPU time (read without freezing anyone)."""
        read = getattr(self.host, "cpu_time_s", None)
        if not callable(read):
            return guests
        now = self.clock.now()
        marked = []
        for guest in guests:
            if not (guest.protection.protected and guest.running):
                self._cpu_reads.pop(guest.name, None)
                self._idle.pop(guest.name, None)
                marked.append(guest)
                continue
            try:
                after = (now, float(read(guest.name)))
            except HypervisorError as exc:
                notes.append(f"{guest.name}: CPU time unreadable ({exc}): idleness not judged")
                marked.append(guest)
                continue
            before = self._cpu_reads.get(guest.name)
            vcpus = len(guest.cpus) if guest.cpus else 1
            busy = cpu_busy(before, after, vcpus)
            span = after[0] - before[0] if before is not None else 0.0
            was = self._idle.get(guest.name, False)
            idle = idle_now(was, busy, span, self.idle_settings)
            if busy is None or span >= self.idle_settings.min_span_s:
                self._cpu_reads[guest.name] = after  # short spans accumulate into the next read
            if idle != was:
                notes.append(f"{guest.name}: {'idle' if idle else 'busy again'} "
                             f"({busy:.2f} of a pCPU per vCPU over {span:.1f} s)")
                self.smoother.reset([guest.name])
            self._idle[guest.name] = idle
            marked.append(replace(guest, idle=idle))
        return marked

    def _guest_stats(self, guests: Sequence[GuestView], decision: Decision, raw: Mapping[str, float],
                     plan: dict[str, Any] | None, now: float) -> dict[str, dict[str, Any]]:
        """Per protected guest: raw and smoothed ζ/ζb, floor, state, throttles applied and time below
        its floor so far (the span since the previous round counts as below when that round was)."""
        applied: dict[str, int] = {}
        if plan is not None:
            done = {a["guest"] for a in plan["actions"] if a["kind"] == "throttle" and a["state"] == "succeeded"}
            for step in decision.steps:
                if step.kind == "throttle" and step.guest in done:
                    applied[step.protects] = applied.get(step.protects, 0) + 1
        stats = {}
        for verdict in decision.verdicts:
            counters = self._counters.setdefault(verdict.guest, {"throttles_applied": 0, "below_floor_s": 0.0})
            below_at = self._below_since.pop(verdict.guest, None)
            if below_at is not None:
                counters["below_floor_s"] += max(0.0, now - below_at)
            if verdict.state in ("below", "cannot-hold"):
                self._below_since[verdict.guest] = now
            counters["throttles_applied"] += applied.get(verdict.guest, 0)
            stats[verdict.guest] = {
                "floor": verdict.floor, "state": verdict.state,
                "ratio": None if verdict.ratio is None else round(verdict.ratio, 4),
                "ratio_raw": None if verdict.guest not in raw else round(raw[verdict.guest], 4),
                "throttles_applied": int(counters["throttles_applied"]),
                "below_floor_s": round(counters["below_floor_s"], 3),
            }
        seen = {g.name for g in guests if g.protection.protected and g.running}
        for name in [n for n in self._below_since if n not in seen]:
            del self._below_since[name]
        return stats

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
