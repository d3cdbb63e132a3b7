"""/metrics' disruption gauges from the real plan store (SQLite and PostgreSQL): the newest plan
that spent a trial budget shows every limit it was made under, and the migrations running now."""

from __future__ import annotations

from vmplacer.adapters.db.plans import SqlPlanStore
from vmplacer.api.metrics import disruption_gauges
from vmplacer.app.apply.migration_slots import MigrationSlots
from vmplacer.core.rebalance.plan import Plan
from vmplacer.core.rebalance.state import RebalanceSettings


def samples(collect) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # type: ignore[no-untyped-def]
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in collect() for s in family.samples}


def test_the_budget_gauges_show_every_limit_of_the_newest_plan_and_migrations_now(sessions):
    store = SqlPlanStore(sessions)
    settings = RebalanceSettings(max_moves_per_guest_hour=4, max_frozen_share_per_guest_hour=0.01,
                                 max_migrations_in_flight=3).to_dict()
    spent = {"trials": 2, "trial_repins": 30, "max_trials": 20, "max_trial_repins": 400, "trials_waiting": 0}
    plan = store.save(Plan((), ("h1",), summary="one", settings={**settings, "notes": {"disruption": spent}}))
    pool = MigrationSlots()
    collect = disruption_gauges(store.latest_disruption, in_flight=lambda: pool.in_flight)
    with pool.held(3):
        found = samples(collect)
    budget = "vmplacer_rebalance_disruption_budget"
    assert found[(budget, (("what", "moves_per_guest_hour"),))] == 4
    assert found[(budget, (("what", "frozen_share_per_guest_hour"),))] == 0.01
    assert found[(budget, (("what", "migrations_in_flight"),))] == 3
    assert found[(budget, (("what", "trials"),))] == 20
    assert found[("vmplacer_rebalance_disruption_plan", ())] == plan.id
    assert found[("vmplacer_rebalance_migrations_in_flight", ())] == 1
    assert samples(collect)[("vmplacer_rebalance_migrations_in_flight", ())] == 0


def test_a_plan_with_a_bad_recorded_limit_shows_the_others():
    spent = {"trials": 1, "max_trials": 5, "max_moves_per_guest_hour": True, "max_migrations_in_flight": "x"}
    found = samples(disruption_gauges(lambda: spent, in_flight=lambda: 0))
    budget = "vmplacer_rebalance_disruption_budget"
    assert found[(budget, (("what", "trials"),))] == 5
    assert (budget, (("what", "migrations_in_flight"),)) not in found
    assert (budget, (("what", "moves_per_guest_hour"),)) not in found
