"""Host leases on SQLite and PostgreSQL: all or nothing, expiry, and two concurrent rebalance
runs of which exactly one acts."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select

from tests.support import SerialisedHost
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.models import HostLeaseRow
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlanStore
from vmplacer.lab.simulator import SimCluster
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer, RunOptions
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.topology.host import uniform_topology


@pytest.fixture
def engine(migrated_url):
    engine = make_engine(migrated_url)
    yield engine
    engine.dispose()


class RealClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def test_all_or_nothing_renew_release_and_expiry(engine):
    leases = SqlLeaseStore(make_session_factory(engine))
    assert leases.acquire(["h1", "h2"], "a", 60)
    assert not leases.acquire(["h2", "h3"], "b", 60)
    assert leases.holders(["h3"]).get("h3", {}).get("holder") is None, "h3 was taken although h2 was busy"
    assert leases.acquire(["h1"], "a", 60), "re-acquiring our own lease must work"
    assert leases.renew(["h1", "h2"], "a", 60)
    assert not leases.renew(["h1", "h3"], "a", 60)
    leases.release(["h1", "h2"], "a")
    assert leases.acquire(["h2", "h3"], "b", 0.2)
    time.sleep(0.4)
    assert leases.acquire(["h3"], "c", 60), "an expired lease must be free"
    assert not leases.renew(["h3"], "b", 60), "the old holder lost it"
    assert leases.holders(["h3"])["h3"]["holder"] == "c"


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_locked_row_is_skipped_not_waited_for_on_postgresql(engine):
    sessions = make_session_factory(engine)
    leases = SqlLeaseStore(sessions)
    leases.acquire(["h1"], "a", 60)
    leases.release(["h1"], "a")
    with sessions() as other:
        other.scalars(select(HostLeaseRow).where(HostLeaseRow.host == "h1").with_for_update()).all()
        started = time.monotonic()
        assert not leases.acquire(["h1"], "b", 60)  # SKIP LOCKED: the row is invisible, not awaited
        assert time.monotonic() - started < 2.0
        other.rollback()
    assert leases.acquire(["h1"], "b", 60)


def test_two_concurrent_runs_never_both_act(engine):
    cluster = SimCluster(seed=0, noise=0.0)
    host = cluster.add_host("h1", uniform_topology(nodes=1, cores_per_node=4, name="h1"))
    for name in ("a", "b", "c"):
        host.define_domain(name, workload="spin", vcpupin=[0])
    inside = threading.Event()
    release = threading.Event()

    def slow_profile(host_name, seconds, scope):
        inside.set()
        release.wait(10)
        return "profiled"

    def make(holder: str, profile=None, wait_s: float = 0.0) -> tuple[Rebalancer, RunOptions]:
        sessions = make_session_factory(engine)
        run = Rebalancer(
            RebalancePorts(hosts={"h1": SerialisedHost(host)}, plans=SqlPlanStore(sessions),
                           leases=SqlLeaseStore(sessions), clock=RealClock(), profile=profile),
            holder=holder, settings=RebalanceSettings(allow_migration=False),
        )
        return run, RunOptions(hosts=("h1",), profile_seconds=1.0 if profile else 0.0, wait_s=wait_s)

    first, first_options = make("first", slow_profile)
    results: dict[str, object] = {}
    worker = threading.Thread(target=lambda: results.update(first=first.run(first_options)))
    worker.start()
    assert inside.wait(10), "the first run never started profiling"
    second, second_options = make("second")
    busy = second.run(second_options)
    assert busy.status == "busy" and busy.plan is None
    assert "another run holds a lease" in busy.notes[0]
    release.set()
    worker.join(30)
    assert results["first"].status == "applied"
    # A run that waits gets the host once the first let go, and finds nothing left to do.
    third, third_options = make("third", wait_s=5.0)
    assert third.run(third_options).status == "nothing-to-do"
    plans = SqlPlanStore(make_session_factory(engine)).recent()
    applied = [p for p in plans if p["state"] == "succeeded"]
    assert len(applied) == 1


def test_apply_keeps_a_lease_its_caller_held_and_releases_one_it_took(engine):
    """A caller holding the hosts' lease between plans (the protect job) keeps it through apply:
    releasing it would let another run take the hosts until the caller took it back."""
    from vmplacer.core.placement.guest_placement import Placement
    from vmplacer.core.rebalance.plan import Action, Plan

    sessions = make_session_factory(engine)
    leases, plans = SqlLeaseStore(sessions), SqlPlanStore(sessions)
    sim = SimCluster(seed=1, noise=0.0)
    sim.add_host("h1", uniform_topology(nodes=1, cores_per_node=2, name="h1"))
    sim.hosts["h1"].define_domain("a", workload="spin", vcpupin=[0], memory_kib=256 * 1024)
    run = Rebalancer(
        RebalancePorts(hosts=dict(sim.hosts), plans=plans, leases=leases, clock=RealClock()),
        holder="job", settings=RebalanceSettings(trials=False),
    )

    def plan_to(cpu: int) -> int:
        before = Placement("a", "h1", {0: frozenset({1 - cpu})}, memory_kib=256 * 1024)
        after = Placement("a", "h1", {0: frozenset({cpu})}, memory_kib=256 * 1024)
        return plans.save(Plan(actions=(Action(0, "repin", "h1", "a", before=before, after=after),),
                               hosts=("h1",))).id

    assert leases.acquire(["h1"], "job", 60)
    assert run.apply(plan_to(1)).state == "succeeded"
    held = leases.holders(["h1"])["h1"]
    assert held["holder"] == "job" and held["live"], "apply let go of the lease its caller held"
    assert not leases.acquire(["h1"], "other", 60)

    leases.release(["h1"], "job")
    assert run.apply(plan_to(0)).state == "succeeded"
    assert leases.holders(["h1"])["h1"]["holder"] is None, "apply kept a lease it took itself"
