"""Make the placement records agree with the domains libvirt really runs.

For each host: take its lease (so no rebalance applies a plan there
meanwhile), list its domains, then read its records — in that order, so a
record old enough to act on was already unchanged while the domains were
listed — let `core.reconcile` judge them, and apply the verdicts: forget the
records of domains that are gone (their pCPU claims go with them), fix the
recorded state of the rest, and put drifted pinning back as recorded (or,
with `drift="adopt"`, record what libvirt has, unless that breaks isolation).
Every write is audited. A host that does not
answer, or whose lease another run holds, is reported and left alone; the
other hosts are still reconciled.

Before any host, rebalancing plans a stopped process left `running` (no live
lease on any of their hosts) are closed as `failed` — the records of the
guests they were moving are then reconciled like any other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vmplacer.core.protect.decisions import Throttle, ThrottleFinding, throttle_findings
from vmplacer.core.reconcile import (
    DEFAULT_PLANNED_GRACE_S,
    DEFAULT_SETTLE_S,
    DRIFT_POLICIES,
    FOLLOW,
    ADOPT,
    RELEASE,
    RESTORE,
    SET_STATE,
    Finding,
    count_by_kind,
    describe_drift,
    followed_placement,
    isolation_findings,
    moved,
    reconcile_host,
)
from vmplacer.core.placement.isolation import isolation_violations
from vmplacer.ports import (
    ClaimConflict,
    DomainInfo,
    Hypervisor,
    HypervisorError,
    LeaseStore,
    PlacementStore,
    PlacementUpdates,
    PlanStore,
    RecordedPlacement,
    ThrottleLedger,
)

HOST_STATUSES = ("reconciled", "busy", "unreachable")
DEFAULT_LEASE_TTL_S = 120.0


class ReconcileError(RuntimeError):
    """A run that cannot start; `bad_input` marks the operator's mistakes (an unknown host)."""

    def __init__(self, message: str, *, bad_input: bool = False):
        super().__init__(message)
        self.bad_input = bad_input


@dataclass(frozen=True)
class Outcome:
    """A finding and what became of it: applied, would-apply (dry run), reported, or skipped."""

    finding: Finding
    outcome: str
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**self.finding.to_dict(), "outcome": self.outcome, "outcome_message": self.message}


@dataclass
class HostResult:
    host: str
    status: str  # reconciled | busy | unreachable
    message: str = ""
    outcomes: list[Outcome] = field(default_factory=list)
    throttles: list[ThrottleFinding] = field(default_factory=list)  # reported only

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "status": self.status,
            "message": self.message,
            "counts": count_by_kind([o.finding for o in self.outcomes]),
            "findings": [o.to_dict() for o in self.outcomes],
            "throttles": [t.to_dict() for t in self.throttles],
        }


@dataclass
class ReconcileReport:
    dry_run: bool
    at: float  # epoch seconds when the run started
    hosts: list[HostResult] = field(default_factory=list)
    closed_plans: list[dict[str, Any]] = field(default_factory=list)  # {id, message}: interrupted plans

    @property
    def complete(self) -> bool:
        """Every host was reconciled (none busy or unreachable) and no repair failed."""
        return all(h.status == "reconciled" for h in self.hosts) and not self.failed

    @property
    def failed(self) -> list[Outcome]:
        return [o for h in self.hosts for o in h.outcomes if o.outcome == "failed"]

    @property
    def problems(self) -> list[str]:
        return ([h.message for h in self.hosts if h.status != "reconciled"]
                + [f"guest {o.finding.guest} on host {o.finding.host}: {o.message}" for o in self.failed])

    def count(self, outcome: str, action: str | None = None) -> int:
        return sum(1 for h in self.hosts for o in h.outcomes
                   if o.outcome == outcome and (action is None or o.finding.action == action))

    def to_dict(self) -> dict[str, Any]:
        done = "would-apply" if self.dry_run else "applied"
        return {
            "status": "complete" if self.complete else "incomplete",
            "dry_run": self.dry_run,
            "at": self.at,
            "released": self.count(done, RELEASE),
            "followed": self.count(done, FOLLOW),
            "updated": self.count(done, SET_STATE),
            "restored": self.count(done, RESTORE),
            "adopted": self.count(done, ADOPT),
            "counts": count_by_kind([o.finding for h in self.hosts for o in h.outcomes]),
            "hosts": [h.to_dict() for h in self.hosts],
            "problems": self.problems,
            "closed_plans": list(self.closed_plans),
        }


class Reconciler:
    def __init__(
        self,
        hosts: Mapping[str, Hypervisor],
        store: PlacementStore,
        leases: LeaseStore,
        holder: str,
        *,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        lease_holder: Callable[[str], str | None] | None = None,
        wall: Callable[[], float] = time.time,
        placements: PlacementUpdates | None = None,
        plans: PlanStore | None = None,
        throttles: ThrottleLedger | None = None,
        emulator_cpus: Callable[[str], frozenset[int]] = lambda _host: frozenset(),
    ):
        """`lease_holder(host)` names who holds a busy host's lease, for the report (optional);
        with `placements`, the record of a domain moved by hand to another configured host
        follows it there instead of being released; with `plans`, plans a stopped process
        left running are closed first."""
        self.hosts = dict(hosts)
        self.plans = plans
        self.throttles = throttles  # with it, throttles the ledger and libvirt disagree on are reported
        self.placements = placements
        self._elsewhere: dict[str, list[DomainInfo] | None] = {}
        self._live: dict[str, DomainInfo] = {}  # the host being reconciled, by domain name
        self.store = store
        self.leases = leases
        self.holder = holder
        self.lease_ttl_s = lease_ttl_s
        self.lease_holder = lease_holder
        self.wall = wall
        self.emulator_cpus = emulator_cpus  # where each host sends emulator threads (reserved pCPUs allowed)

    def run(
        self,
        host_names: Iterable[str] | None = None,
        *,
        dry_run: bool = False,
        planned_grace_s: float = DEFAULT_PLANNED_GRACE_S,
        settle_s: float = DEFAULT_SETTLE_S,
        now_wall: float | None = None,
        drift: str = "restore",
    ) -> ReconcileReport:
        """Reconcile `host_names` (default: every host) one after the other; `now_wall` stamps the report;
        `drift` says what becomes of drifted pinning (core.reconcile.DRIFT_POLICIES)."""
        if drift not in DRIFT_POLICIES:
            raise ReconcileError(f"drift: one of {', '.join(DRIFT_POLICIES)}, got {drift!r}", bad_input=True)
        names = list(dict.fromkeys(host_names)) if host_names is not None else sorted(self.hosts)
        unknown = [n for n in names if n not in self.hosts]
        if unknown:
            raise ReconcileError(f"unknown host(s) {', '.join(unknown)} (configured: {', '.join(sorted(self.hosts))})",
                                 bad_input=True)
        for name, value in (("planned_grace_s", planned_grace_s), ("settle_s", settle_s)):
            if value < 0:
                raise ReconcileError(f"{name}: must be >= 0 seconds, got {value}", bad_input=True)
        report = ReconcileReport(dry_run=dry_run, at=self.wall() if now_wall is None else now_wall)
        report.closed_plans = self._close_orphaned_plans(dry_run)  # before our leases, which would hide them
        self._elsewhere = {}
        for name in names:
            result = self._host(name, dry_run, planned_grace_s, settle_s, drift)
            if result.status == "reconciled":
                result.throttles = self._throttles(name)
            report.hosts.append(result)
        return report

    def _throttles(self, name: str) -> list[ThrottleFinding]:
        """The throttle ledger against the bandwidth libvirt shows on `name` (when both can be read)."""
        host = self.hosts[name]
        read = getattr(host, "cpu_bandwidth", None)
        if self.throttles is None or not callable(read):
            return []
        live: dict[str, Any] = {}
        for domain in self._elsewhere.get(name) or []:
            try:
                live[domain.name] = read(domain.name) if domain.state == "running" else None
            except HypervisorError:
                live[domain.name] = None  # no bandwidth control here (test driver), or it vanished
        recorded = [Throttle(r.guest, r.bandwidth, r.original, r.protects) for r in self.throttles.current(name)]
        return throttle_findings(name, recorded, live)

    def _close_orphaned_plans(self, dry_run: bool) -> list[dict[str, Any]]:
        if self.plans is None:
            return []
        closed = self.plans.close_orphaned(self.holder, dry_run=dry_run)
        if dry_run:
            return [{"id": plan_id, "message": "would be closed as failed: running, with no live lease on its hosts"}
                    for plan_id in closed]
        found = []
        for plan_id in closed:
            plan = self.plans.get(plan_id)
            found.append({"id": plan_id, "message": getattr(plan, "message", "") or "interrupted"})
        return found

    # ----- one host ---------------------------------------------------------------------------------
    def _host(self, name: str, dry_run: bool, planned_grace_s: float, settle_s: float,
              drift: str = "restore") -> HostResult:
        if not self.leases.acquire([name], self.holder, self.lease_ttl_s):
            return HostResult(name, "busy", self._busy_message(name))
        try:
            try:
                domains = self.hosts[name].domains()
            except HypervisorError as exc:
                return HostResult(name, "unreachable", f"host {name} unreachable: {exc}")
            self._elsewhere[name] = domains
            records = self.store.records(name)
            findings = reconcile_host(name, records, domains, planned_grace_s=planned_grace_s, settle_s=settle_s,
                                      drift=drift)
            released = {f.guest for f in findings if f.action == RELEASE}
            findings += isolation_findings(name, self.hosts[name].topology(),
                                           [r for r in records if r.guest not in released], domains,
                                           emulator_cpus=self.emulator_cpus(name))
            by_uuid = {r.guest: r.domain_uuid for r in records}
            findings = [self._followed(f, by_uuid.get(f.guest)) for f in findings]
            writes = [f for f in findings if f.writes]
            if dry_run or not writes:
                return HostResult(name, "reconciled", "", [self._unapplied(f, dry_run) for f in findings])
            if not self.leases.renew([name], self.holder, self.lease_ttl_s):
                return HostResult(name, "busy", f"host {name}: lease lost before writing (listing the domains "
                                                f"took longer than {self.lease_ttl_s:.0f} s); nothing changed")
            by_guest = {r.guest: r for r in records}
            self._live = {d.name: d for d in domains}
            return HostResult(name, "reconciled", "",
                              [self._apply(f, by_guest.get(f.guest)) if f.writes else self._unapplied(f, False)
                               for f in findings])
        finally:
            self.leases.release([name], self.holder)

    # ----- domains moved by hand -------------------------------------------------------------------
    def _followed(self, finding: Finding, uuid: str | None) -> Finding:
        """`gone` becomes `moved` when another configured host runs the domain (same name and UUID)."""
        if finding.kind != "gone" or not uuid or self.placements is None:
            return finding
        for other in sorted(self.hosts):
            if other == finding.host:
                continue
            for domain in self._domains_of(other):
                if domain.name == finding.guest and domain.uuid == uuid and domain.placement is not None:
                    return moved(finding, other, domain)
        return finding

    def _domains_of(self, host: str) -> list[DomainInfo]:
        """Each other host's domains, listed once per run (an unreachable host lists none)."""
        if host not in self._elsewhere:
            try:
                self._elsewhere[host] = self.hosts[host].domains()
            except HypervisorError:
                self._elsewhere[host] = None
        return self._elsewhere[host] or []

    def _follow(self, finding: Finding, record: RecordedPlacement) -> tuple[str, str]:
        """Move the record to the domain's new host with its live pinning; (outcome, message).

        Holds the new host's lease meanwhile. A pCPU there claimed by another
        record means the two cannot both be true: the moved record is released.
        """
        target = finding.target_host
        assert target is not None and self.placements is not None
        live = next((d for d in self._domains_of(target) if d.name == finding.guest), None)
        if live is None or live.placement is None:
            return "skipped", f"domain {finding.guest} no longer listed on host {target}"
        if not self.leases.acquire([target], self.holder, self.lease_ttl_s):
            return "skipped", f"{self._busy_message(target)}: the record stays until the next run"
        try:
            placement = followed_placement(record.placement, live.placement, target)
            try:
                self.placements.apply([placement])
            except ClaimConflict as exc:
                self.store.forget(finding.guest)
                return "applied", f"released instead: its live pCPUs on host {target} are claimed: {exc}"
            self.store.set_state(finding.guest, finding.state or "running", finding.domain_uuid)
            return "applied", ""
        finally:
            self.leases.release([target], self.holder)

    def _busy_message(self, name: str) -> str:
        who = None
        if self.lease_holder is not None:
            try:
                who = self.lease_holder(name)
            except Exception:  # noqa: BLE001 - naming the holder is a courtesy; "busy" stands without it
                who = None
        return f"host {name} busy: its lease is held by {who or 'another run'}; skipped"

    @staticmethod
    def _unapplied(finding: Finding, dry_run: bool) -> Outcome:
        if finding.writes and dry_run:
            return Outcome(finding, "would-apply")
        return Outcome(finding, "reported")

    def _restore(self, finding: Finding, record: RecordedPlacement) -> str:
        """Pin the domain back as recorded and read it back; "" when libvirt now agrees."""
        from vmplacer.app.apply.actions.pinning import apply_pins

        host = self.hosts[finding.host]
        wanted = record.placement
        try:
            apply_pins(host, finding.guest, wanted)
            live = host.domain(finding.guest).placement
            if live is not None and live.memory_nodes != wanted.memory_nodes and wanted.memory_nodes:
                set_nodes = getattr(host, "set_memory_nodes", None)
                if set_nodes is not None:
                    set_nodes(finding.guest, wanted.memory_nodes)
                    live = host.domain(finding.guest).placement
        except HypervisorError as exc:
            return f"pinning back as recorded failed: {exc}"
        left = describe_drift(wanted, live) if live is not None else "its pinning cannot be read back"
        return f"still differs after pinning back: {left}" if left else ""

    def _adopt(self, finding: Finding, record: RecordedPlacement) -> str:
        """The record takes libvirt's pins, unless they break isolation (then nothing changes)."""
        domain = self._live.get(finding.guest)
        if domain is None or domain.placement is None:
            return "its live pinning cannot be read"
        adopted = followed_placement(record.placement, domain.placement, finding.host)
        layout = [d.placement for d in self._live.values() if d.placement is not None and d.name != finding.guest]
        broken = [v for v in isolation_violations(self.hosts[finding.host].topology(), [*layout, adopted],
                                                  emulator_cpus=self.emulator_cpus(finding.host))
                  if finding.guest in (v.guest, v.owner)]
        if broken:
            return "not adopted, it would break isolation: " + "; ".join(v.describe() for v in broken)
        try:
            self.store.update_pins([adopted])
        except ClaimConflict as exc:
            return f"not adopted: {exc}"
        return ""

    def _apply(self, finding: Finding, record: RecordedPlacement | None) -> Outcome:
        detail: dict[str, Any] = {"kind": finding.kind, "recorded_state": finding.recorded_state,
                                  "live_state": finding.live_state, "age_s": finding.age_s}
        if record is not None:
            detail["placement"] = record.placement.to_dict()
            detail["domain_uuid"] = record.domain_uuid
        message = ""
        if finding.action == FOLLOW:
            if record is None:
                return Outcome(finding, "skipped", "the record was removed meanwhile")
            outcome, message = self._follow(finding, record)
            if outcome != "applied":
                return Outcome(finding, outcome, message)
            detail.update(target_host=finding.target_host, state=finding.state, note=message or None)
        elif finding.action in (RESTORE, ADOPT):
            if record is None:
                return Outcome(finding, "skipped", "the record was removed meanwhile")
            problem = (self._restore(finding, record) if finding.action == RESTORE
                       else self._adopt(finding, record))
            if problem:
                self.store.audit(action="reconcile", outcome="failed", host=finding.host, guest=finding.guest,
                                 message=f"{finding.kind}: {problem}", detail=detail)
                return Outcome(finding, "failed", problem)
        elif finding.action == RELEASE:
            self.store.forget(finding.guest)
        elif finding.action == SET_STATE:
            assert finding.state is not None
            try:
                self.store.set_state(finding.guest, finding.state, finding.domain_uuid)
            except KeyError:
                return Outcome(finding, "skipped", "the record was removed meanwhile")
            detail.update(state=finding.state, new_domain_uuid=finding.domain_uuid)
        self.store.audit(action="reconcile", outcome="ok", host=finding.host, guest=finding.guest,
                         message=f"{finding.kind}: {finding.detail}" + (f" ({message})" if message else ""),
                         detail=detail)
        return Outcome(finding, "applied", message)
