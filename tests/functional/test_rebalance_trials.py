"""Measured trials end to end on simulated hosts with a real database (SQLite and PostgreSQL):
the executor keeps or undoes moves as Freeze'nSense measures them, stores the outcome (and, applied
by the API, counts it in /metrics), and the next plan follows what was measured instead of trying
the same layouts again."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlacementUpdates, SqlPlanStore
from vmplacer.lab.simulator import SimCluster
from vmplacer.api.metrics import ApiMetrics, trial_outcome_gauges
from vmplacer.api.services import ApiServices
from vmplacer.app.apply.actions.probe import OnVerdict
from vmplacer.app.jobs import JobContext
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.topology.host import uniform_topology
from vmplacer.core.rebalance.trial import Measured, Verdict
from vmplacer.ports import JobRecord

WEIGHTS = {"a": 1.0, "b": 1.0, "c": 1.0}


@pytest.fixture
def sim():
    cluster = SimCluster(seed=1, noise=0.0)
    cluster.add_host("h1", uniform_topology(nodes=1, cores_per_node=4, name="h1"))
    for name in "abc":
        cluster.hosts["h1"].define_domain(name, workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    return cluster


class ScriptedProbe:
    """Freeze'nSense stand-in for the executor's probe: hands out the given measurements in turn."""

    def __init__(self, *measurements: dict[str, float]):
        self.left = list(measurements)
        self.calls: list[str] = []

    def __call__(self, host: str, seconds: float) -> Measured:
        self.calls.append(host)
        return Measured(host, self.left.pop(0), {g: 3 for g in WEIGHTS})


def rebalancer(sim, db, probe, epoch: float = 1_700_000_000.0, holder: str = "run",
               on_trial: OnVerdict | None = None, settings: RebalanceSettings | None = None,
               **extra) -> Rebalancer:
    ports = RebalancePorts(hosts=dict(sim.hosts), plans=SqlPlanStore(db), leases=SqlLeaseStore(db), clock=sim.clock,
                           wall=lambda: epoch + sim.clock.now(),
                           placements=SqlPlacementUpdates(db, {"h1": "sim://h1"}),
                           audit=SqlPlacementStore(db), probe=probe, on_trial=on_trial, **extra)
    return Rebalancer(ports, holder=holder, settings=settings or RebalanceSettings())


def pin(guest: str, cpu: int) -> Placement:
    return Placement(guest, "h1", {0: frozenset({cpu})}, memory_kib=256 * 1024)


def trial(kind: str, from_key: str, to_key: str) -> dict:
    return {"kind": kind, "weights": WEIGHTS, "fairness": 0.0, "min_gain": 0.01, "tolerance": 0.02,
            "from_key": from_key, "to_key": to_key}


def two_stage_plan(db) -> Plan:
    """b: 0 → 1 (planned, confirmed by a probe), then c: 0 → 2 (tried, kept only if measured better)."""
    actions = (
        Action(0, "repin", "h1", "b", before=pin("b", 0), after=pin("b", 1), reason="spread b"),
        Action(1, "probe", "h1", depends_on=(0,), parameters={"seconds": 1.0, "trial": trial("confirm", "x", "t")}),
        Action(2, "repin", "h1", "c", before=pin("c", 0), after=pin("c", 2), depends_on=(1,),
               parameters={"tried": "model"}),
        Action(3, "probe", "h1", depends_on=(2,), parameters={"seconds": 1.0, "trial": trial("explore", "t", "f")}),
    )
    return SqlPlanStore(db).save(Plan(actions=actions, hosts=("h1",)))


def cpu_of(sim, guest: str) -> int:
    return next(iter(sim.hosts["h1"].domain(guest).placement.vcpupin[0]))


def test_a_tried_layout_that_measures_worse_is_undone_and_remembered(sim, db):
    probe = ScriptedProbe({"a": 0.33, "b": 0.33, "c": 0.33},  # before the plan (measured by apply)
                          {"a": 0.5, "b": 1.0, "c": 0.5},     # after b moved: better, kept
                          {"a": 0.4, "b": 0.9, "c": 0.4})     # after c moved: worse, undone
    run = rebalancer(sim, db, probe)
    plan = two_stage_plan(db)
    done = run.apply(plan.id)
    assert probe.calls == ["h1"] * 3
    assert [a.state for a in done.actions] == ["succeeded", "succeeded", "rolled_back", "rolled_back"]
    assert done.state == "succeeded", "a trial undone on measurement is an outcome, not a failure"
    assert cpu_of(sim, "b") == 1 and cpu_of(sim, "c") == 0
    assert "0.667 → 0.567" in done.actions[3].message and "undone" in done.actions[3].message
    assert done.actions[2].message.startswith("undone: measured")
    stored = SqlPlanStore(db).get(plan.id)
    assert stored.state == "succeeded" and stored.actions[2].state == "rolled_back"
    # the diff shows what the plan left: b moved, c not
    assert {d.guest for d in stored.diff()} == {"b"}
    outcomes = SqlPlanStore(db).trial_outcomes(0.0)
    assert [(o.kind, o.from_key, o.to_key, o.kept) for o in outcomes] == [("confirm", "x", "t", True),
                                                                         ("explore", "t", "f", False)]
    assert run.measured_better(RebalanceSettings()) == {("t", "f")}
    assert run.measured_better(RebalanceSettings(trials=False)) == set()
    audit = SqlPlanStore(db).audit_rows(plan.id)
    assert [r["outcome"] for r in audit if r["action"] == "rebalance-repin" and r["guest"] == "c"] == [
        "ok", "rolled_back"]


def test_planned_moves_that_measure_clearly_worse_are_undone_and_the_trial_after_them_skipped(sim, db):
    probe = ScriptedProbe({"a": 0.6, "b": 0.6, "c": 0.6}, {"a": 0.5, "b": 0.5, "c": 0.5})
    run = rebalancer(sim, db, probe)
    done = run.apply(two_stage_plan(db).id)
    assert [a.state for a in done.actions] == ["rolled_back", "rolled_back", "skipped", "skipped"]
    assert done.state == "succeeded"
    assert cpu_of(sim, "b") == 0 and cpu_of(sim, "c") == 0
    assert run.measured_better(RebalanceSettings()) == {("x", "t")}
    assert SqlPlanStore(db).trial_outcomes(time.time() + 3600) == []  # finished before the time asked for


def test_without_a_profiler_the_trials_keep_only_what_was_planned_for_sure(sim, db):
    run = rebalancer(sim, db, None)
    done = run.apply(two_stage_plan(db).id)
    assert [a.state for a in done.actions] == ["succeeded", "skipped", "skipped", "skipped"]
    assert cpu_of(sim, "b") == 1 and cpu_of(sim, "c") == 0


def tried_plan(db, recheck: float) -> Plan:
    """c: 0 → 2 (tried: kept only if measured better by 0.01 per guest; a close call measured again)."""
    actions = (
        Action(0, "repin", "h1", "c", before=pin("c", 0), after=pin("c", 2), parameters={"tried": "model"}),
        Action(1, "probe", "h1", depends_on=(0,),
               parameters={"seconds": 1.0, "trial": {**trial("explore", "x", "t"), "recheck": recheck}}),
    )
    return SqlPlanStore(db).save(Plan(actions=actions, hosts=("h1",)))


def test_a_close_call_is_measured_again_and_judged_on_both_measurements(sim, db):
    before = {"a": 0.5, "b": 0.5, "c": 0.5}
    lucky = {"a": 0.5, "b": 0.5, "c": 0.536}    # +0.012 per guest: above the bar of 0.01, by less than 0.006
    sober = {"a": 0.5, "b": 0.5, "c": 0.47}     # the second look: pooled, +0.001 per guest
    probe = ScriptedProbe(before, lucky, sober)
    done = rebalancer(sim, db, probe).apply(tried_plan(db, recheck=0.006).id)
    assert probe.calls == ["h1"] * 3, "the close call was probed a second time"
    assert [a.state for a in done.actions] == ["rolled_back", "rolled_back"]
    assert cpu_of(sim, "c") == 0
    assert "0.500 → 0.501" in done.actions[1].message and "close call, measured twice" in done.actions[1].message
    # without the margin the one lucky measurement decides
    sim.hosts["h1"].pin_vcpu("c", 0, frozenset({0}))
    probe = ScriptedProbe(before, lucky)
    done = rebalancer(sim, db, probe).apply(tried_plan(db, recheck=0.0).id)
    assert probe.calls == ["h1"] * 2 and [a.state for a in done.actions] == ["succeeded", "succeeded"]
    assert cpu_of(sim, "c") == 2


def test_a_close_call_whose_second_probe_fails_rests_on_the_first_and_says_so(sim, db):
    before, lucky = {"a": 0.5, "b": 0.5, "c": 0.5}, {"a": 0.5, "b": 0.5, "c": 0.536}
    answers = [Measured("h1", before, {g: 3 for g in WEIGHTS}), Measured("h1", lucky, {g: 3 for g in WEIGHTS}),
               "profiler unavailable: libvirt connection lost"]
    calls = []

    def probe(host: str, seconds: float):
        calls.append(host)
        return answers.pop(0)

    done = rebalancer(sim, db, probe).apply(tried_plan(db, recheck=0.006).id)
    assert len(calls) == 3
    assert [a.state for a in done.actions] == ["succeeded", "succeeded"], "judged on the first measurement"
    message = done.actions[1].message
    assert "0.500 → 0.512" in message and "the second probe failed on h1" in message
    assert "measured twice" not in message


def test_a_clear_verdict_is_not_measured_again(sim, db):
    probe = ScriptedProbe({"a": 0.5, "b": 0.5, "c": 0.5}, {"a": 0.5, "b": 0.5, "c": 0.8})  # +0.1 per guest
    done = rebalancer(sim, db, probe).apply(tried_plan(db, recheck=0.006).id)
    assert probe.calls == ["h1"] * 2
    assert [a.state for a in done.actions] == ["succeeded", "succeeded"] and cpu_of(sim, "c") == 2
    assert "measured twice" not in done.actions[1].message


def test_a_verdict_listener_that_fails_changes_nothing(sim, db):
    def broken(host: str, kind: str, verdict: Verdict) -> None:
        raise RuntimeError("metrics unavailable")

    probe = ScriptedProbe({"a": 0.5, "b": 0.5, "c": 0.5}, {"a": 0.5, "b": 0.5, "c": 0.8})
    done = rebalancer(sim, db, probe, on_trial=broken).apply(tried_plan(db, recheck=0.006).id)
    assert [a.state for a in done.actions] == ["succeeded", "succeeded"] and cpu_of(sim, "c") == 2
    assert done.actions[1].message.startswith("measured 0.500 → 0.600")


def confirm_plan(db, from_key: str, to_key: str, recheck: float = 0.0) -> Plan:
    """b: 0 → 1, confirmed by a probe (undone when measured worse; a close call measured again)."""
    actions = (
        Action(0, "repin", "h1", "b", before=pin("b", 0), after=pin("b", 1), reason="spread b"),
        Action(1, "probe", "h1", depends_on=(0,),
               parameters={"seconds": 1.0, "trial": {**trial("confirm", from_key, to_key), "recheck": recheck}}),
    )
    return SqlPlanStore(db).save(Plan(actions=actions, hosts=("h1",)))


def test_a_host_whose_planned_layouts_keep_measuring_worse_backs_off_for_a_while(sim, db):
    worse = [{"a": 0.6, "b": 0.6, "c": 0.6}, {"a": 0.5, "b": 0.5, "c": 0.5}]  # before, after: undone
    # the store stamps outcomes with the real time, so this run's wall clock starts now
    settings = RebalanceSettings(backoff_s=600.0)  # off by default
    run = rebalancer(sim, db, ScriptedProbe(*worse, *worse), epoch=time.time(), settings=settings)
    for n, keys in enumerate((("x", "t1"), ("x", "t2"))):
        done = run.apply(confirm_plan(db, *keys).id)
        assert [a.state for a in done.actions] == ["rolled_back", "rolled_back"]
        assert cpu_of(sim, "b") == 0
        if n == 0:  # one layout measured worse: the next run may plan again at once
            assert run.held_hosts(settings) == {}
    held = run.held_hosts(settings)
    last = max(o.at for o in SqlPlanStore(db).trial_outcomes(0.0))
    assert list(held) == ["h1"] and held["h1"].streak == 2
    assert held["h1"].until == pytest.approx(last + settings.backoff_s)
    plan = run.make_plan(["h1"])
    [why] = plan.settings["notes"]["held"]
    assert why.startswith("host h1: its last 2 planned layouts measured worse and were undone; for ")
    # three guests on one pCPU: spreading them is time sharing, arithmetic the back-off does not hold
    assert plan.state == "proposed" and [a.kind for a in plan.actions if a.kind == "repin"]
    assert run.held_hosts(RebalanceSettings()) == {}  # off: the default
    sim.clock.sleep(held["h1"].until - run.wall() + 1)
    assert run.held_hosts(settings) == {}
    assert run.make_plan(["h1"]).settings["notes"]["held"] == []  # the back-off is over


def test_the_api_apply_job_counts_each_trial_verdict_in_its_metrics(sim, db, monkeypatch):
    """Plans applied by the API's job count their trials' verdicts in vmplacer_rebalance_trials_total,
    labelled from the verdicts themselves (host, kind, kept/undone/unmeasured, close call)."""
    import vmplacer.bootstrap.rebalance as bootstrap
    from vmplacer.api.routes.plans import APPLY_JOB, apply_handler

    before = {"a": 0.5, "b": 0.5, "c": 0.5}
    lost = "profiler unavailable: libvirt connection lost"
    answers: list[dict[str, float] | str] = [
        before, {**before, "c": 0.45}, {**before, "c": 0.41},  # confirm: -0.017 close to -0.02, pooled -0.023
        lost, {**before, "c": 0.8},                             # explore with nothing measured before
        before, {**before, "c": 0.536}, lost,                   # explore: +0.012 close to +0.01, no second look
        before, {**before, "c": 0.8},                           # confirm: clearly better
    ]

    def probe(host: str, seconds: float) -> Measured | str:
        answer = answers.pop(0)
        return answer if isinstance(answer, str) else Measured(host, answer, {g: 3 for g in WEIGHTS})

    services = SimpleNamespace(
        metrics=ApiMetrics(), instance="api-1", options=SimpleNamespace(lease_ttl_s=30.0),
        container=SimpleNamespace(placement_store_as=lambda actor, detail: SqlPlacementStore(
            db, actor=actor, actor_detail=detail)),
        snapshots=SimpleNamespace(invalidate=lambda host: None))

    def compose(container, *, holder: str, on_trial: OnVerdict | None = None) -> Rebalancer:
        assert container is services.container
        return rebalancer(sim, db, probe, holder=holder, on_trial=on_trial)

    monkeypatch.setattr(bootstrap, "build_rebalancer", compose)
    services.rebalancer = lambda holder: ApiServices.rebalancer(services, holder)  # type: ignore[arg-type]
    handler = apply_handler(services)

    def apply(plan: Plan) -> list[str]:
        job = JobRecord(f"job-{plan.id}", APPLY_JOB, ("h1",), "running", 0.0, "", {"plan_id": plan.id},
                        created_by="tester")
        done = handler({"plan_id": plan.id}, JobContext(job, lambda fraction, message: None, threading.Event()))
        return [action["state"] for action in done["actions"]]

    assert apply(confirm_plan(db, "x", "t1", recheck=0.006)) == ["rolled_back", "rolled_back"]
    assert apply(tried_plan(db, recheck=0.006)) == ["rolled_back", "rolled_back"]
    assert apply(tried_plan(db, recheck=0.006)) == ["succeeded", "succeeded"]
    assert apply(confirm_plan(db, "x", "t2", recheck=0.006)) == ["succeeded", "succeeded"]
    assert answers == [], "every scripted probe was used"

    [family] = [m for m in services.metrics.registry.collect() if m.name == "vmplacer_rebalance_trials"]
    counted = {(s.labels["host"], s.labels["kind"], s.labels["verdict"], s.labels["close_call"]): s.value
               for s in family.samples if s.name == "vmplacer_rebalance_trials_total"}
    assert counted == {("h1", "confirm", "undone", "measured_twice"): 1.0,
                       ("h1", "explore", "unmeasured", "no"): 1.0,
                       ("h1", "explore", "kept", "second_probe_failed"): 1.0,
                       ("h1", "confirm", "kept", "no"): 1.0}
    assert ('vmplacer_rebalance_trials_total{close_call="measured_twice",host="h1",kind="confirm",verdict="undone"} '
            '1.0') in services.metrics.render().decode()
    # a kind outside the closed set (a stored plan edited by hand) is not counted
    services.metrics.rebalance_trial("h1", "guess", Verdict(True, 0.5, 0.6, 0.1, 3, "measured"))
    assert "guess" not in services.metrics.render().decode()


def test_metrics_count_the_stored_trials_of_every_process_over_the_last_day(sim, db):
    """Trials of runs outside the API (the timer's, an operator's) reach /metrics from the stored plans."""
    worse = [{"a": 0.6, "b": 0.6, "c": 0.6}, {"a": 0.5, "b": 0.5, "c": 0.5}]
    better = [{"a": 0.5, "b": 0.5, "c": 0.5}, {"a": 0.6, "b": 0.6, "c": 0.6}]
    run = rebalancer(sim, db, ScriptedProbe(*worse, *worse, *better), epoch=time.time())
    for keys in (("x", "t1"), ("x", "t2"), ("x", "t3")):
        run.apply(confirm_plan(db, *keys).id)
    clock = [time.time()]
    metrics = ApiMetrics()
    metrics.add_database_gauges(trial_outcome_gauges(SqlPlanStore(db).trial_counts, lambda: clock[0], 86400.0))
    text = metrics.render().decode()
    assert 'vmplacer_rebalance_trial_outcomes{host="h1",kind="confirm",verdict="undone"} 2.0' in text
    assert 'vmplacer_rebalance_trial_outcomes{host="h1",kind="confirm",verdict="kept"} 1.0' in text
    clock[0] += 86400.0 + 60.0  # a day later they are out of the window
    assert "vmplacer_rebalance_trial_outcomes{" not in metrics.render().decode()
