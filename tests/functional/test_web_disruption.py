"""The disruption budget in the web view, on SQLite and PostgreSQL: a plan's page shows what its
trials spent of `max_trials` and `max_trial_repins`, the trials left waiting with their hosts, and
the guests held at `max_moves_per_guest_hour`, from the plan's stored notes; a guest's page counts
its moves in the last hour against the configured limit, with one query of the plan store."""

from __future__ import annotations

import contextlib
import re
import time
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.functional.test_web_view import elements, guest_path, sign_in
from tests.functional.web_support import DEDICATED, HOSTILE, SHARED, record_guests, store_plan
from vmplacer.adapters.db.api import SqlTokenStore
from vmplacer.api.app import create_app
from vmplacer.api.services import ApiOptions
from vmplacer.config import EXAMPLE_HOST_NAME
from vmplacer.core.placement.guest_placement import Placement, placement_from_dict
from vmplacer.core.rebalance.plan import Action, Plan

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

MOVES_LIMIT = 3  # rebalance.disruption.max_moves_per_guest_hour of the fixture's config
OTHER_HOST = "h0002"  # a host a waiting trial names that is not configured: its link still renders


def _container(database_url: str, data_dir: Path, moves_limit: int):  # -> Container
    from vmplacer.adapters.db import migrate
    from vmplacer.bootstrap import Container
    from vmplacer.config import settings_from_mapping

    migrate.upgrade(database_url)
    document = {"data_dir": str(data_dir), "database_url": database_url,
                "rebalance": {"disruption": {"max_moves_per_guest_hour": moves_limit}}}
    return Container(settings_from_mapping(document, "test", environ={}))


@contextlib.contextmanager
def _view(database_url: str, data_dir: Path, moves_limit: int = MOVES_LIMIT) -> Iterator[tuple[Any, Any]]:
    """A signed-in client of the view (read token) over the example host's recorded guests."""
    container = _container(database_url, data_dir, moves_limit)
    try:
        read = SqlTokenStore(container.sessions).create("viewer", "read")
        record_guests(container, EXAMPLE_HOST_NAME)
        app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False, isolation_check_s=0))
        with TestClient(app, raise_server_exceptions=False, follow_redirects=False,
                        headers={"Origin": "http://testserver"}) as client:
            sign_in(client, read)
            yield client, container
    finally:
        container.close()


def _budget_plan(container: Any) -> int:
    """A plan as the planner stores one whose budget ran out: 2 trials kept of 2, 30 of 40
    repins, 3 trials waiting (two stored, one of them hostile markup), and guests fixed — the
    hostile one and the dedicated one at their moves per hour, the shared one cooling down."""
    host = EXAMPLE_HOST_NAME
    notes = {
        "disruption": {"trials": 2, "trial_repins": 30, "max_trials": 2, "max_trial_repins": 40,
                       "trials_waiting": 3},
        "over_budget": [
            {"trial": OTHER_HOST, "hosts": [OTHER_HOST], "what": "spread", "value": 0.125, "repins": 12,
             "migrations": 0, "why": "max_trials 2 per plan reached"},
            {"trial": f"{host}+{HOSTILE}", "hosts": [host, HOSTILE], "what": HOSTILE, "value": 0.05, "repins": 4,
             "migrations": 1, "why": "12 repins would pass max_trial_repins 40 per plan (30 spent)"},
        ],
        "fixed": [f"{HOSTILE} (moved 3 times in the last hour (max_moves_per_guest_hour 3))",
                  f"{DEDICATED} (moved 4 times in the last hour (max_moves_per_guest_hour 3))",
                  f"{SHARED} (moved 12 s ago (cool-down 600 s))"],
    }
    settings = {"max_moves_per_guest_hour": MOVES_LIMIT, "max_frozen_share_per_guest_hour": 0.02,
                "max_migrations_in_flight": 2, "notes": notes}
    plan = Plan(actions=(), hosts=(host,), state="empty", objective_before=1.0, objective_after=1.0,
                summary="nothing to do; 3 trials left for later rounds by the disruption budget", settings=settings,
                created_at=time.time())
    return int(container.plan_store.save(plan, created_by="tests").id)


def _rows(html: str, attribute: str) -> list[str]:
    return [str(a[attribute]) for t, a in elements(html) if t == "tr" and attribute in a]


def _cells(html: str, row_id: str) -> list[str]:
    """The text of each cell of the table row whose data-budget is `row_id`."""
    start = html.index(f'data-budget="{row_id}"')
    row = html[start:html.index("</tr>", start)]
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)]


def test_the_plan_page_shows_the_budget_its_trials_spent_and_what_waits(database_url, tmp_path):
    with _view(database_url, tmp_path) as (client, container):
        plan_id = _budget_plan(container)
        page = client.get(f"/ui/plans/{plan_id}")
        assert page.status_code == 200, page.text
        html = page.text
        assert _rows(html, "data-budget") == ["trials", "trial_repins", "trials_waiting", "moves_per_guest_hour"]
        assert _cells(html, "trials")[1:3] == ["2", "2 per plan"]
        assert _cells(html, "trial_repins")[1:3] == ["30", "40 per plan"]
        assert _cells(html, "trials_waiting")[1] == "3"
        assert _cells(html, "moves_per_guest_hour")[1:3] == ["2", f"{MOVES_LIMIT} per guest per hour"]
        assert _rows(html, "data-trial") == [OTHER_HOST, f"{EXAMPLE_HOST_NAME}+{HOSTILE}"]  # attributes, unescaped
        assert "3 trial(s) left for later rounds; the first 2 are stored with the plan" in html
        assert "max_trials 2 per plan reached" in html and "+0.125" in html
        links = [a["href"] for t, a in elements(html) if t == "a"]
        assert f"/ui/hosts/{OTHER_HOST}" in links
        assert "/ui/hosts/%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E" in links  # the hostile host, escaped
        held = _rows(html, "data-fixed")
        assert held == [HOSTILE, DEDICATED]  # not the guest cooling down
        assert f"/ui/guests/{DEDICATED}" in links
        assert "2.0 % of each guest's hour (72 s)" in html and "2 migrations in flight per process" in html
        assert HOSTILE not in html  # every caller text is escaped
        assert not [t for t, _ in elements(html) if t == "img"]


def test_a_plan_without_budget_notes_shows_no_budget(database_url, tmp_path):
    with _view(database_url, tmp_path) as (client, container):
        plain = store_plan(container, EXAMPLE_HOST_NAME)  # no notes: made before the budget existed
        html = client.get(f"/ui/plans/{plain}").text
        assert 'id="disruption"' not in html and "Disruption budget" not in html
        assert client.app.state.web.plan(plain)["disruption"] is None


def _moves(container: Any, guest: str, succeeded: int, rolled_back: int) -> None:
    """A plan of `succeeded + rolled_back` repins of `guest`, finished now as the executor records them."""
    record = container.placement_store.get(guest)
    before = placement_from_dict(record["placement"])
    after = Placement(**{**before.__dict__, "vcpupin": {v: frozenset({min(c)}) for v, c in before.vcpupin.items()}})
    actions = tuple(Action(i, "repin", EXAMPLE_HOST_NAME, guest, None, before, after)
                    for i in range(succeeded + rolled_back))
    plan = container.plan_store.save(Plan(actions=actions, hosts=(EXAMPLE_HOST_NAME,), created_at=time.time()))
    for action in actions:
        state = "succeeded" if action.index < succeeded else "rolled_back"
        container.plan_store.record_action(plan.id, replace(action, state=state), finished=True)


def _count_calls(container: Any) -> list[tuple[Any, float]]:
    calls: list[tuple[Any, float]] = []
    store = container.plan_store
    original = store.moves_since

    def counted(guests: Any, since: float) -> dict[str, int]:
        calls.append((list(guests) if guests is not None else None, since))
        return original(guests, since)

    store.moves_since = counted
    return calls


def test_the_guest_page_counts_its_moves_this_hour_against_the_limit(database_url, tmp_path):
    with _view(database_url, tmp_path) as (client, container):
        _moves(container, SHARED, succeeded=1, rolled_back=1)  # an undone move counts twice: 3
        _moves(container, DEDICATED, succeeded=1, rolled_back=0)
        calls = _count_calls(container)
        html = client.get(guest_path(SHARED)).text
        assert calls and [guests for guests, _ in calls] == [[SHARED]]  # one query of the store per page
        assert 'id="moves-count">3<' in html and f'id="moves-limit">{MOVES_LIMIT}<' in html
        assert "at the limit" in html
        html = client.get(guest_path(DEDICATED)).text
        assert 'id="moves-count">1<' in html and "at the limit" not in html
        html = client.get(guest_path(HOSTILE)).text  # never moved
        assert 'id="moves-count">0<' in html
        client.app.state.web._wall = lambda: time.time() + 3601  # an hour on: the moves have left the window
        assert 'id="moves-count">0<' in client.get(guest_path(SHARED)).text


def test_a_guest_page_says_when_moves_per_hour_have_no_limit(database_url, tmp_path):
    with _view(database_url, tmp_path, moves_limit=0) as (client, container):
        _moves(container, SHARED, succeeded=2, rolled_back=0)
        html = client.get(guest_path(SHARED)).text
        assert 'id="moves-count">2<' in html and 'id="moves-limit">no limit<' in html
        assert "at the limit" not in html


@pytest.mark.parametrize("fixed, expected", [
    (["a (moved 6 times in the last hour (max_moves_per_guest_hour 6))"], [("a", 6, 6)]),
    (["x (y) (moved 7 times in the last hour (max_moves_per_guest_hour 6))"], [("x (y)", 7, 6)]),
    (["a (moved 12 s ago (cool-down 600 s))", "b (outside the rebalancing scope)", 7, None], []),
    ("not a list", []),
])
def test_guests_at_their_moves_per_hour_are_read_from_the_fixed_notes_whatever_their_name(fixed, expected):
    from vmplacer.web.disruption import fixed_by_moves

    assert [(f["guest"], f["moves"], f["limit"]) for f in fixed_by_moves(fixed)] == expected
