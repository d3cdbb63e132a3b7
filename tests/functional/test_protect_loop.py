"""The protection loop on a simulated host with a real database (SQLite and PostgreSQL): throttles
the neighbour that costs a protected guest its floor, in steps, never below the neighbour's minimum
share and never an unlabelled guest; releases when the protected guest stops; reports a floor
throttling cannot hold; a loop restarted after a crash releases throttles whose reason is gone."""

from __future__ import annotations

import pytest

from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlanStore
from vmplacer.adapters.db.throttles import SqlThrottleLedger
from vmplacer.lab.simulator import SimCluster
from vmplacer.app.protect.loop import Measurement, ProtectLoop
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer
from vmplacer.core.protect.decisions import LoopSettings
from vmplacer.core.protect.policy import MIN_SHARE_LABEL, PROTECT_LABEL
from vmplacer.core.topology.host import uniform_topology


def cluster(*neighbours: tuple[str, dict[str, str]]) -> SimCluster:
    sim = SimCluster(seed=3, noise=0.0)
    host = sim.add_host("h1", uniform_topology(nodes=1, cores_per_node=2, name="h1"))
    host.define_domain("web", workload="spin", vcpupin=[0], labels={PROTECT_LABEL: "0.8"})
    for name, labels in neighbours:
        host.define_domain(name, workload="spin", vcpupin=[0], labels=labels)
    return sim


def loop(sim, db, **kwargs) -> ProtectLoop:
    host = sim.hosts["h1"]
    plans = SqlPlanStore(db)
    rebalancer = Rebalancer(
        RebalancePorts(hosts=dict(sim.hosts), plans=plans, leases=SqlLeaseStore(db), clock=sim.clock,
                       audit=SqlPlacementStore(db), throttles=SqlThrottleLedger(db)),
        holder="protect",
    )

    def measure(names: list[str], samples: int) -> Measurement:
        # The simulator's noise-free performance stands in for Freeze'nSense here; the real
        # profiler drives the loop in the integration test.
        return Measurement({n: host.true_performance(n) for n in names})

    return ProtectLoop(host, measure=measure, ledger=SqlThrottleLedger(db), plans=plans,
                       apply=lambda plan_id: rebalancer.apply(plan_id), clock=sim.clock,
                       wall=lambda: sim.clock.now(), settings=LoopSettings(step=0.1, release_after=2), **kwargs)


def test_throttles_the_antagonist_until_the_floor_holds_then_releases_when_the_victim_stops(db):
    sim = cluster(("batch", {MIN_SHARE_LABEL: "0.2"}))
    host = sim.hosts["h1"]
    protect = loop(sim, db)
    assert host.true_performance("web") == pytest.approx(0.5)
    reports = [protect.round() for _ in range(10)]
    assert host.true_performance("web") >= 0.8
    assert 0.2 <= host.cpu_bandwidth("batch").share < 1.0
    throttled_rounds = [r for r in reports if r.plan]
    assert throttled_rounds and all(r.plan["state"] == "succeeded" for r in throttled_rounds)
    # once the floor holds the loop measures at its steady pace, so judge the last measured round
    measured = [r for r in reports if r.measurement is not None]
    assert measured[-1].decision.verdicts[0].state in ("held", "headroom")
    assert reports[-1].decision.verdicts[0].state in ("held", "headroom", "unmeasured")
    stored = SqlPlanStore(db).get(throttled_rounds[0].plan["id"])
    assert stored.actions[0].kind == "throttle" and stored.actions[0].parameters["protects"] == "web"
    (record,) = SqlThrottleLedger(db).current("h1")
    assert record.protects == "web"

    host.suspend("web")  # the protected guest stops
    report = protect.round()
    assert [s.kind for s in report.decision.steps] == ["release"] and "is not running" in report.decision.steps[0].reason
    assert not host.cpu_bandwidth("batch").limited and SqlThrottleLedger(db).current() == []


def test_an_unlabelled_neighbour_is_never_throttled_and_the_floor_is_reported_with_a_proposal(db):
    sim = cluster(("plain", {}))
    proposals: list[str] = []

    def propose(host_name: str):
        from vmplacer.core.rebalance.plan import Plan

        proposals.append(host_name)
        return SqlPlanStore(db).save(Plan(actions=(), hosts=(host_name,), state="empty", summary="nothing"))

    protect = loop(sim, db, propose=propose)
    first, second = protect.round(), protect.round()
    assert not sim.hosts["h1"].cpu_bandwidth("plain").limited
    assert first.decision.cannot_hold and "cannot hold the floor" in first.decision.cannot_hold[0].message
    assert first.proposed_plan is not None and second.proposed_plan is None  # proposed once, not every round
    assert proposals == ["h1"] and SqlThrottleLedger(db).current() == []


def test_a_restarted_loop_releases_throttles_whose_reason_is_gone(db):
    sim = cluster(("batch", {MIN_SHARE_LABEL: "0.2"}))
    host = sim.hosts["h1"]
    first = loop(sim, db)
    for _ in range(3):
        first.round()
    assert host.cpu_bandwidth("batch").limited  # throttled, and the process "dies" here
    host.undefine("web")  # while no loop ran, the protected guest went away
    restarted = loop(sim, db)
    report = restarted.round()
    assert "no longer on this host" in report.decision.steps[0].reason
    assert not host.cpu_bandwidth("batch").limited and SqlThrottleLedger(db).current() == []


class Killed(BaseException):
    """Stands in for SIGKILL: nothing after the raise runs (no except clause catches it)."""


@pytest.mark.parametrize("landed", [False, True], ids=["before-libvirt-changed", "after-libvirt-changed"])
def test_a_loop_killed_mid_throttle_leaves_no_throttle_without_a_reason(db, landed):
    sim = cluster(("batch", {MIN_SHARE_LABEL: "0.2"}))
    host = sim.hosts["h1"]
    real_set = host.set_cpu_bandwidth

    def dies(name, bandwidth):
        if landed:
            real_set(name, bandwidth)
        raise Killed()

    host.set_cpu_bandwidth = dies  # type: ignore[method-assign]
    with pytest.raises(Killed):
        loop(sim, db).round()
    host.set_cpu_bandwidth = real_set  # type: ignore[method-assign]
    (record,) = SqlThrottleLedger(db).current()  # the intent was recorded before libvirt was asked
    assert record.protects == "web" and host.cpu_bandwidth("batch").limited == landed
    host.suspend("web")  # the reason goes away while no loop runs
    loop(sim, db).round()  # the restarted loop
    assert not host.cpu_bandwidth("batch").limited and SqlThrottleLedger(db).current() == []


def paced_loop(sim, db, *, t_m_s=0.05, **kwargs) -> ProtectLoop:
    """A loop whose measurement freezes neighbours `t_m_s` per sample on the virtual clock."""
    from vmplacer.core.protect.cadence import CadenceSettings

    host = sim.hosts["h1"]
    plans = SqlPlanStore(db)
    rebalancer = Rebalancer(
        RebalancePorts(hosts=dict(sim.hosts), plans=plans, leases=SqlLeaseStore(db), clock=sim.clock,
                       audit=SqlPlacementStore(db), throttles=SqlThrottleLedger(db)),
        holder="protect",
    )

    def measure(names: list[str], samples: int) -> Measurement:
        ratios = {n: host.true_performance(n) for n in names}
        frozen = samples * len(names) * t_m_s
        sim.clock.sleep(2 * frozen)  # ζ windows and ζb windows
        return Measurement(ratios, frozen, 2 * frozen)

    cadence = kwargs.pop("cadence", CadenceSettings(fast_interval_s=2.0, slow_interval_s=10.0, fast_samples=5,
                                                    slow_samples=2, budget=0.02, window_s=120.0))
    return ProtectLoop(host, measure=measure, ledger=SqlThrottleLedger(db), plans=plans,
                       apply=lambda plan_id: rebalancer.apply(plan_id), clock=sim.clock,
                       wall=lambda: sim.clock.now(), settings=LoopSettings(step=0.1, release_after=2),
                       cadence=cadence, t_m_s=t_m_s, **kwargs)


def test_the_freeze_budget_bounds_frozen_time_while_the_floor_still_holds(db):
    sim = cluster(("batch", {MIN_SHARE_LABEL: "0.2"}))
    host = sim.hosts["h1"]
    history: list[dict] = []
    protect = paced_loop(sim, db, history=history.append)
    protect.run(rounds=150)
    assert host.true_performance("web") >= 0.8
    frozen = [(r["at"], r["frozen_ms"] / 1e3) for r in history]
    for end, _ in frozen:  # every 120 s window ending at a round: within 2 %
        assert sum(f for at, f in frozen if end - 120.0 < at <= end) <= 0.02 * 120.0 + 1e-9
    skipped = [r for r in history if any("freeze budget" in n for n in r["notes"])]
    assert skipped, "the budget had to hold some measurements back at the fast pace"
    later = history[len(history) // 2:]
    assert all(r["guests"]["web"]["state"] in ("held", "headroom", "unmeasured") for r in later)
    # it backed off while the floor held: longer rounds, or measurements spread at the steady pace
    assert (max(r["pace"]["interval_s"] for r in later) > 2.0
            or any("steady pace" in n for r in later for n in r["notes"]))
    assert later[-1]["budget"]["share"] <= 0.02
    for r in history:  # the share each round reports never exceeds the bound it names
        budget = r["budget"]
        assert budget["spent_s"] <= budget["limit_s"] + 1e-9
        assert budget["share"] <= budget["limit_s"] / budget["span_s"] + 1e-4


def test_an_idle_protected_guest_gets_its_antagonist_released_within_30_s_and_rethrottled_when_busy(db):
    from vmplacer.core.protect.cadence import CadenceSettings

    sim = cluster(("batch", {MIN_SHARE_LABEL: "0.2"}))
    host = sim.hosts["h1"]
    # the default 300 s window: the first burst must not leave the re-throttle waiting for budget
    protect = paced_loop(sim, db, cadence=CadenceSettings(fast_interval_s=2.0, slow_interval_s=10.0, fast_samples=5,
                                                          slow_samples=2, budget=0.02, window_s=300.0))
    protect.run(rounds=20)
    assert host.cpu_bandwidth("batch").limited
    host.set_load("web", 0.01)  # idle, still running
    went_idle = sim.clock.now()
    while host.cpu_bandwidth("batch").limited:
        sim.clock.sleep(protect.pace.interval_s)  # the loop's own pace between rounds
        protect.round()
        assert sim.clock.now() - went_idle <= 30.0, "the throttle outlived the protected guest's work"
    assert SqlThrottleLedger(db).current() == []
    report = protect.round()
    assert report.guests["web"]["state"] == "idle" and not report.decision.steps
    host.set_load("web", 1.0)  # busy again
    protect.run(rounds=15)
    assert host.cpu_bandwidth("batch").limited and host.true_performance("web") >= 0.8


def test_per_guest_counters_count_throttles_and_time_below_the_floor(db):
    sim = cluster(("batch", {MIN_SHARE_LABEL: "0.2"}))
    protect = paced_loop(sim, db)
    reports = [protect.round() for _ in range(8)]
    stats = reports[-1].guests["web"]
    throttled = sum(1 for r in reports for s in r.decision.steps if s.kind == "throttle")
    assert stats["throttles_applied"] == throttled >= 3
    below_rounds = [r for r in reports if r.guests["web"]["state"] == "below"]
    assert stats["below_floor_s"] > 0
    assert stats["below_floor_s"] <= reports[-1].at - reports[0].at
    assert len(below_rounds) == throttled


def test_metrics_show_each_protected_guest_from_the_recorded_rounds(db, tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from vmplacer.adapters.protect_history import ProtectHistory
    from vmplacer.api.metrics import DatabaseGauges, protect_metrics

    sim = cluster(("batch", {MIN_SHARE_LABEL: "0.2"}))
    history = ProtectHistory(tmp_path)
    protect = paced_loop(sim, db, history=history.append)
    reports = [protect.round() for _ in range(8)]
    last = history.latest("h1")
    assert last is not None and last["guests"] == reports[-1].to_dict()["guests"]
    assert len(history.read("h1")) == 8
    registry = CollectorRegistry()
    registry.register(DatabaseGauges([protect_metrics(lambda: [last], lambda: last["at"] + 1.0)]))
    text = generate_latest(registry).decode()
    stats = reports[-1].guests["web"]
    assert 'vmplacer_protect_floor{guest="web",host="h1"} 0.8' in text
    assert f'vmplacer_protect_throttles_applied_total{{guest="web",host="h1"}} {float(stats["throttles_applied"])}' \
        in text
    assert 'vmplacer_protect_below_floor_seconds_total{guest="web",host="h1"}' in text
    assert f'vmplacer_protect_ratio{{guest="web",host="h1"}} {stats["ratio"]}' in text
    assert 'vmplacer_protect_last_round_age_seconds{host="h1"} 1.0' in text
    stale = CollectorRegistry()
    stale.register(DatabaseGauges([protect_metrics(lambda: [last], lambda: last["at"] + 3600.0)]))
    assert 'guest="web"' not in generate_latest(stale).decode()  # a loop long gone shows nothing


def test_the_history_file_stays_bounded(tmp_path):
    from vmplacer.adapters.protect_history import ProtectHistory

    history = ProtectHistory(tmp_path, max_bytes=4096)
    for i in range(500):
        history.append({"host": "h1", "at": float(i), "guests": {"web": {"ratio": 0.8}}})
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["h1.jsonl", "h1.jsonl.1"]
    assert all(f.stat().st_size <= 4096 for f in files)
    rounds = history.read("h1")
    assert rounds[-1]["at"] == 499.0 and [r["at"] for r in rounds] == sorted(r["at"] for r in rounds)
    with pytest.raises(ValueError, match="cannot name a file"):
        history.path("../etc")


def test_once_the_floor_holds_the_loop_measures_at_a_steady_pace_with_few_samples(db):
    """A loop that is not acting spreads its measurements (half the freeze budget, slow samples)
    instead of spending the window's budget in a burst and then measuring nothing."""
    sim = cluster(("batch", {MIN_SHARE_LABEL: "0.2"}))
    protect = paced_loop(sim, db)
    reports = []
    for _ in range(40):
        reports.append(protect.round())
        sim.clock.sleep(protect.pace.interval_s)
    last_step = max(i for i, r in enumerate(reports) if r.plan)
    calm = reports[last_step + 2:]
    measured = [r for r in calm if r.measurement is not None]
    assert measured and len(measured) < len(calm)  # some rounds skip measuring: the steady pace
    assert all(r.measurement is None or r.measurement.frozen_s <= 2 * protect.cadence.slow_samples * 0.05 + 1e-9
               for r in calm)  # the slow samples: 2 per guest, 50 ms each
    assert all(r.decision.verdicts[0].state in ("held", "headroom", "unmeasured") for r in calm)
    assert any("steady pace" in note for r in calm for note in r.notes)
