"""The two store queries behind a guest's page, on SQLite and PostgreSQL: its ζ/ζb history from
the profile runs that sampled it, and the plans with an action on it, newest first."""

from __future__ import annotations

from tests.functional.test_api_helpers import make_container
from tests.functional.web_support import DEDICATED, HOSTILE, SHARED, record_guests, store_plan, store_profiles
from vmplacer.config import EXAMPLE_HOST_NAME


def test_a_guests_history_and_plans_come_newest_first_and_only_its_own(database_url, tmp_path):
    container = make_container(database_url, tmp_path, None)
    try:
        record_guests(container, EXAMPLE_HOST_NAME)
        first = store_plan(container, EXAMPLE_HOST_NAME)
        second = store_plan(container, EXAMPLE_HOST_NAME)
        runs = store_profiles(container, EXAMPLE_HOST_NAME, runs=3)
        unfinished = container.profile_store.start_run(EXAMPLE_HOST_NAME, "ipc", {})
        store = container.profile_store
        history = store.guest_history(DEDICATED)
        assert [h["run_id"] for h in history] == sorted(runs, reverse=True)
        assert unfinished not in [h["run_id"] for h in history]  # a running run has no results yet
        assert all(h["host"] == EXAMPLE_HOST_NAME and h["summary"]["degradation"]["estimate"] > 0 for h in history)
        assert [h["run_id"] for h in store.guest_history(DEDICATED, limit=2)] == sorted(runs, reverse=True)[:2]
        assert store.guest_history(HOSTILE) == []  # a neighbour in the samples, never sampled itself
        plans = container.plan_store.touching(SHARED)
        assert [p["id"] for p in plans] == [second, first]
        assert plans[0]["on_guest"] == [{"index": 0, "kind": "repin", "state": "pending"}]
        assert [p["id"] for p in container.plan_store.touching(SHARED, limit=1)] == [second]
        assert container.plan_store.touching(DEDICATED) == []
    finally:
        container.close()
