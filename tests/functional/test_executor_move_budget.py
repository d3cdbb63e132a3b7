"""The per-guest move budget enforced again when a plan is applied, on simulated hosts with a real
database (SQLite and PostgreSQL): a guest other plans moved `max_moves_per_guest_hour` times in
the last hour is not moved again (the rest of the plan runs), this plan's own moves count, a
guest's move is never left half done, an explore trial starts whole or not at all, and undoing
a move is always allowed."""

from __future__ import annotations

import pytest

from tests.support import SerialisedHost
from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlacementUpdates, SqlPlanStore
from vmplacer.app.apply.executor import Executor, ExecutorError, ExecutorSettings
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.rebalance.trial import Measured
from vmplacer.core.topology.host import uniform_topology
from vmplacer.lab.simulator import SimCluster

SETTING = "rebalance.disruption.max_moves_per_guest_hour"
LIMIT = RebalanceSettings().max_moves_per_guest_hour
WEIGHTS = {"a": 1.0, "b": 1.0, "c": 1.0}


@pytest.fixture
def sim():
    cluster = SimCluster(seed=1, noise=0.0)
    for host in ("h1", "h2"):
        cluster.add_host(host, uniform_topology(nodes=1, cores_per_node=4, name=host))
    for name in "abc":
        cluster.hosts["h1"].define_domain(name, workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    cluster.hosts["h2"].define_domain("d", workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    return cluster


def pin(guest: str, cpu: int, host: str = "h1") -> Placement:
    return Placement(guest, host, {0: frozenset({cpu})}, memory_kib=256 * 1024)


def repin(index: int, guest: str, start: int, end: int, host: str = "h1", **extra) -> Action:
    return Action(index, "repin", host, guest, before=pin(guest, start, host), after=pin(guest, end, host),
                  reason="spread", **extra)


def cpu_of(sim, guest: str, host: str = "h1") -> int:
    return next(iter(sim.hosts[host].domain(guest).placement.vcpupin[0]))


def moved_before(db, guest: str, times: int) -> None:
    """`times` moves of `guest` by an earlier plan, finished just now (the store's clock)."""
    store = SqlPlanStore(db)
    actions = tuple(repin(i, guest, i % 2, (i + 1) % 2) for i in range(times))
    plan = store.save(Plan(actions=actions, hosts=("h1",)))
    for action in plan.actions:
        store.record_action(plan.id, action.moved_to("running").moved_to("succeeded"), finished=True)


def approved(db, actions: tuple[Action, ...], hosts=("h1",), settings=None) -> Plan:
    store = SqlPlanStore(db)
    plan = store.save(Plan(actions=actions, hosts=hosts, settings=settings or {}))
    assert store.transition(plan.id, "proposed", "approved")
    return store.get(plan.id)


def executor(sim, db, hosts=None, **kwargs) -> Executor:
    return Executor(hosts or dict(sim.hosts), clock=sim.clock, plans=SqlPlanStore(db), audit=SqlPlacementStore(db),
                    **kwargs)


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_guest_moved_to_the_limit_since_planning_is_skipped_and_the_rest_runs(sim, db, lanes):
    moved_before(db, "a", LIMIT)
    moved_before(db, "b", LIMIT - 1)
    plan = approved(db, (repin(0, "a", 0, 1), repin(1, "b", 0, 2), repin(2, "d", 0, 3, host="h2")), ("h1", "h2"))
    hosts = {h: SerialisedHost(sim.hosts[h]) for h in ("h1", "h2")}
    done = executor(sim, db, hosts, lanes=lanes).run(plan)
    assert [a.state for a in done.actions] == ["skipped", "succeeded", "succeeded"]
    message = done.actions[0].message
    assert f"a moved {LIMIT} times in the last hour" in message and f"{SETTING} ({LIMIT})" in message
    assert (cpu_of(sim, "a"), cpu_of(sim, "b"), cpu_of(sim, "d", "h2")) == (0, 2, 3)
    assert done.state == "succeeded"
    audit = [r for r in SqlPlanStore(db).audit_rows(plan.id) if r["action"] == "rebalance-repin"]
    assert [(r["guest"], r["outcome"]) for r in audit if r["guest"] == "a"] == [("a", "skipped")]
    assert any(r["guest"] == "a" and SETTING in r["message"] for r in audit)
    assert SqlPlanStore(db).moves_since(["a", "b"], 0.0) == {"a": LIMIT, "b": LIMIT}


def test_the_moves_this_plan_made_count_and_a_guests_next_step_is_never_refused(sim, db):
    moved_before(db, "a", LIMIT - 1)
    moved_before(db, "b", LIMIT - 1)
    plan = approved(db, (
        repin(0, "a", 0, 1), repin(1, "a", 1, 2),                       # a second, separate move of a
        repin(2, "b", 0, 1), repin(3, "b", 1, 3, depends_on=(2,)),      # b's move, carried on
        repin(4, "c", 0, 3, depends_on=(1,)),                           # after a refused move
    ))
    done = executor(sim, db).run(plan)
    assert [a.state for a in done.actions] == ["succeeded", "skipped", "succeeded", "succeeded", "skipped"]
    assert f"a moved {LIMIT} times in the last hour" in done.actions[1].message
    assert done.actions[4].message == "depends on action 1 (repin), which skipped"
    assert (cpu_of(sim, "a"), cpu_of(sim, "b"), cpu_of(sim, "c")) == (1, 3, 0)


def test_with_no_limit_the_moves_run(sim, db):
    moved_before(db, "a", LIMIT * 2)
    # the plan's own setting, as it was planned
    done = executor(sim, db).run(approved(db, (repin(0, "a", 0, 1),), settings={"max_moves_per_guest_hour": 0}))
    assert done.actions[0].state == "succeeded" and cpu_of(sim, "a") == 1
    # the executor's setting (the configuration when it applies) wins over the plan's
    plan = approved(db, (repin(0, "a", 1, 2),), settings={"max_moves_per_guest_hour": LIMIT})
    done = executor(sim, db, settings=ExecutorSettings(max_moves_per_guest_hour=0)).run(plan)
    assert done.actions[0].state == "succeeded" and cpu_of(sim, "a") == 2
    plan = approved(db, (repin(0, "a", 2, 3),), settings={"max_moves_per_guest_hour": 0})
    done = executor(sim, db, settings=ExecutorSettings(max_moves_per_guest_hour=LIMIT)).run(plan)
    assert done.actions[0].state == "skipped" and f"{SETTING} ({LIMIT})" in done.actions[0].message


def test_a_plan_with_a_malformed_limit_is_refused_before_it_starts(sim, db):
    plan = approved(db, (repin(0, "a", 0, 1),), settings={"max_moves_per_guest_hour": "many"})
    with pytest.raises(ExecutorError, match="field 'settings.max_moves_per_guest_hour' must be an integer >= 0"):
        executor(sim, db).run(plan)
    assert SqlPlanStore(db).get(plan.id).state == "approved" and cpu_of(sim, "a") == 0
    with pytest.raises(ValueError, match="field 'max_moves_per_guest_hour'"):
        ExecutorSettings(max_moves_per_guest_hour=-1)


def trial(kind: str) -> dict:
    return {"kind": kind, "weights": WEIGHTS, "fairness": 0.0, "min_gain": 0.01, "tolerance": 0.02,
            "from_key": "x", "to_key": "t"}


def measured(value: float) -> Measured:
    return Measured("h1", {g: value for g in WEIGHTS}, {g: 3 for g in WEIGHTS})


def test_an_explore_trial_with_a_guest_at_the_limit_does_not_start_at_all(sim, db):
    moved_before(db, "c", LIMIT)
    probed: list[str] = []
    plan = approved(db, (
        repin(0, "b", 0, 1, parameters={"tried": "model"}),
        repin(1, "c", 0, 2, parameters={"tried": "model"}),
        Action(2, "probe", "h1", depends_on=(0, 1), parameters={"seconds": 1.0, "trial": trial("explore")}),
        repin(3, "a", 0, 3),
    ))
    done = executor(sim, db, probe=lambda host, s: probed.append(host) or measured(0.5),
                    measurements={"h1": measured(0.33)}).run(plan)
    assert [a.state for a in done.actions] == ["skipped", "skipped", "skipped", "succeeded"]
    assert done.actions[0].message.startswith("the trial measured by action 2 does not start: c moved")
    assert f"c moved {LIMIT} times in the last hour" in done.actions[1].message
    assert probed == [], "a trial that did not start was measured"
    assert (cpu_of(sim, "a"), cpu_of(sim, "b"), cpu_of(sim, "c")) == (3, 0, 0), "the host is half in the trial"


def test_undoing_a_trial_is_allowed_whatever_the_budget(sim, db):
    moved_before(db, "c", LIMIT - 1)
    plan = approved(db, (
        repin(0, "c", 0, 2, parameters={"tried": "model"}),
        Action(1, "probe", "h1", depends_on=(0,), parameters={"seconds": 1.0, "trial": trial("explore")}),
    ))
    done = executor(sim, db, probe=lambda host, s: measured(0.25), measurements={"h1": measured(0.33)}).run(plan)
    assert [a.state for a in done.actions] == ["rolled_back", "rolled_back"]
    assert cpu_of(sim, "c") == 0, "the move a trial undid was left in place"
    # made and taken back: it counts twice, over the limit, and the undo was not refused for it
    assert SqlPlanStore(db).moves_since(["c"], 0.0) == {"c": LIMIT + 1}


def test_a_stored_plan_applied_after_other_plans_moved_its_guest_skips_that_move(sim, db):
    """The planner saw the guest within its budget; other plans spent it before this one was applied."""
    ports = RebalancePorts(hosts={"h1": sim.hosts["h1"]}, plans=SqlPlanStore(db), leases=SqlLeaseStore(db),
                           clock=sim.clock, placements=SqlPlacementUpdates(db, {"h1": "sim://h1"}),
                           audit=SqlPlacementStore(db))
    run = Rebalancer(ports, holder="budget", settings=RebalanceSettings(allow_migration=False))
    plan = run.make_plan(["h1"])
    moved = [a for a in plan.actions if a.kind == "repin"]
    assert moved, "nothing planned to move"
    moved_before(db, moved[0].guest, LIMIT)
    done = run.apply(plan.id)
    by_index = {a.index: a for a in done.actions}
    assert by_index[moved[0].index].state == "skipped"
    assert f"{moved[0].guest} moved {LIMIT} times" in by_index[moved[0].index].message
    assert cpu_of(sim, moved[0].guest) == 0
    assert all(by_index[a.index].state == "succeeded" for a in moved[1:] if moved[0].index not in a.depends_on)


class StoreWithout:
    """The real plan store with `moves_since` missing (an older double of the port) or failing."""

    def __init__(self, inner: SqlPlanStore, failing: bool):
        self.inner, self.failing = inner, failing

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if name == "moves_since" and not self.failing:
            raise AttributeError(name)
        if name == "moves_since":
            def unreadable(guests, since):  # type: ignore[no-untyped-def]
                raise OSError("the database went away")
            return unreadable
        return getattr(self.inner, name)


def test_a_store_that_cannot_count_moves_does_not_break_the_executor_but_one_that_fails_refuses(sim, db):
    moved_before(db, "a", LIMIT)
    plan = approved(db, (repin(0, "a", 0, 1),))
    done = Executor(dict(sim.hosts), clock=sim.clock, plans=StoreWithout(SqlPlanStore(db), failing=False)).run(plan)
    assert done.actions[0].state == "succeeded", "a store that cannot count blocked the plan"
    plan = approved(db, (repin(0, "b", 0, 1),))
    done = Executor(dict(sim.hosts), clock=sim.clock, plans=StoreWithout(SqlPlanStore(db), failing=True)).run(plan)
    assert done.actions[0].state == "skipped" and "could not be counted (the database went away)" in done.actions[0].message
    assert cpu_of(sim, "b") == 0
