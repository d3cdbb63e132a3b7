"""A measured migration on simulated hosts with a real database (SQLite and PostgreSQL): the
confirm probe after migrations measures every host they link and judges them as one, so the
guest that moved counts on both sides; measured worse, the guest is migrated back and its
record follows it."""

from __future__ import annotations

from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.plans import SqlPlanStore
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.core.rebalance.trial import Measured
from tests.functional.test_executor_sim import rebalancer, sim  # noqa: F401 - fixtures


class ProbeByHost:
    """Freeze'nSense stand-in: hands out each host's given measurements in turn."""

    def __init__(self, **measurements: list[dict[str, float]]):
        self.left = {host: list(values) for host, values in measurements.items()}
        self.calls: list[str] = []

    def __call__(self, host: str, seconds: float) -> Measured:
        self.calls.append(host)
        values = self.left[host].pop(0)
        return Measured(host, values, {g: 10 for g in values})


def placed(guest: str, host: str, cpu: int) -> Placement:
    return Placement(guest, host, {0: frozenset({cpu})}, memory_kib=256 * 1024)


def migration_plan(db, kind: str = "confirm") -> Plan:
    """b: h1 → h2 and pinned there on pCPU 1, judged by one probe of h1 and h2 together."""
    trial = {"kind": kind, "hosts": ["h1", "h2"], "weights": {"a": 1.0, "b": 1.0, "c": 1.0},
             "fairness": 0.0, "min_gain": 0.005, "tolerance": 0.0, "from_key": "before", "to_key": "after"}
    actions = (
        Action(0, "migrate", "h1", "b", target_host="h2", before=placed("b", "h1", 0), after=placed("b", "h2", 0)),
        Action(1, "repin", "h2", "b", before=placed("b", "h2", 0), after=placed("b", "h2", 1), depends_on=(0,)),
        Action(2, "probe", "h1", depends_on=(0, 1), parameters={"seconds": 1.0, "trial": trial}),
    )
    return SqlPlanStore(db).save(Plan(actions=actions, hosts=("h1", "h2")))


def setup(sim, db) -> SqlPlacementStore:
    sim.hosts["h1"].define_domain("a", workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    sim.hosts["h1"].define_domain("b", workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    sim.hosts["h2"].define_domain("c", workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    store = SqlPlacementStore(db)
    for guest, host in (("a", "h1"), ("b", "h1"), ("c", "h2")):
        store.record(host, f"sim://{host}", placed(guest, host, 0), {})
    return store


def test_a_migration_that_helps_its_source_but_measures_worse_on_both_hosts_goes_back(sim, db):
    store = setup(sim, db)
    # Alone, h1 measures better after b left (a: 0.6 → 0.9); together the hosts measure worse:
    # b does poorly on h2 and c suffers from it ((0.6 + 0.6 + 0.9) / 3 = 0.7 → (0.9 + 0.4 + 0.5) / 3 = 0.6).
    probe = ProbeByHost(h1=[{"a": 0.6, "b": 0.6}, {"a": 0.9}], h2=[{"c": 0.9}, {"b": 0.4, "c": 0.5}])
    run = rebalancer(sim, db, probe=probe)
    plan = migration_plan(db)
    done = run.apply(plan.id)
    assert sorted(probe.calls[:2]) == ["h1", "h2"], "both hosts are measured before the moves"
    assert sorted(probe.calls[2:]) == ["h1", "h2"], "and both after them, by the one trial probe"
    assert [a.state for a in done.actions] == ["rolled_back"] * 3, [(a.describe(), a.message) for a in done.actions]
    assert "0.700 → 0.600" in done.actions[2].message and "3 guests" in done.actions[2].message
    assert done.state == "succeeded", "a trial undone on measurement is an outcome, not a failure"
    assert "b" in {d.name for d in sim.hosts["h1"].domains()}
    assert "b" not in {d.name for d in sim.hosts["h2"].domains()}
    assert store.get("b")["host"] == "h1", "the record follows the guest back"
    outcomes = SqlPlanStore(db).trial_outcomes(0.0)
    assert [(o.kind, o.from_key, o.to_key, o.kept, o.host) for o in outcomes] == [
        ("confirm", "before", "after", False, "h1")]


def test_a_migration_that_measures_better_on_both_hosts_stays(sim, db):
    store = setup(sim, db)
    probe = ProbeByHost(h1=[{"a": 0.6, "b": 0.6}, {"a": 0.9}], h2=[{"c": 0.9}, {"b": 0.85, "c": 0.85}])
    run = rebalancer(sim, db, probe=probe)
    done = run.apply(migration_plan(db).id)
    assert [a.state for a in done.actions] == ["succeeded"] * 3, [(a.describe(), a.message) for a in done.actions]
    assert "kept" in done.actions[2].message
    assert "b" in {d.name for d in sim.hosts["h2"].domains()}
    assert store.get("b")["host"] == "h2"
    assert run.measurements["h2"].performance == {"b": 0.85, "c": 0.85}, "the kept layout is the hosts' new measure"


def test_a_tried_joint_layout_that_measures_worse_migrates_back_and_is_remembered(sim, db):
    """Exploration of small hosts together: the same probe, of kind explore (kept only if better)."""
    store = setup(sim, db)
    probe = ProbeByHost(h1=[{"a": 0.6, "b": 0.6}, {"a": 0.9}], h2=[{"c": 0.9}, {"b": 0.4, "c": 0.5}])
    run = rebalancer(sim, db, probe=probe)
    done = run.apply(migration_plan(db, kind="explore").id)
    assert [a.state for a in done.actions] == ["rolled_back"] * 3, [(a.describe(), a.message) for a in done.actions]
    assert "b" in {d.name for d in sim.hosts["h1"].domains()} and store.get("b")["host"] == "h1"
    assert [(o.kind, o.kept, o.host) for o in SqlPlanStore(db).trial_outcomes(0.0)] == [("explore", False, "h1")]
    assert run.measured_better(run.settings) == {("before", "after")}, "the hosts as they were measured better"
    memory = run._trial_memory(run.settings)
    assert memory.tried == {"h1": 1, "h2": 1}, "a joint trial spends the trial budget of every host it measured"
