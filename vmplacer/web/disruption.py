"""What a plan spent of the disruption budget (docs/disruption.md), read from its stored settings:
the trials kept and the vCPUs they repin against `max_trials` and `max_trial_repins`, the trials
left waiting with their hosts and the limit that held each back, and the guests the planner left
alone at `max_moves_per_guest_hour`. Pure: a plan's settings in, plain dictionaries out; a plan
made before the budget existed (or a drain, which tries nothing) has no `disruption` note."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# How the planner names a guest it left alone at its moves per hour (core/rebalance/search.py):
# "NAME (moved N times in the last hour (max_moves_per_guest_hour M))". Matched from the end, so
# any guest name, brackets and all, stays whole.
_AT_MOVES_LIMIT = re.compile(r"^(?P<guest>.+) \(moved (?P<moves>\d+) times in the last hour "
                             r"\(max_moves_per_guest_hour (?P<limit>\d+)\)\)$", re.DOTALL)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def waiting_row(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One trial the budget held back, as the plan page lists it."""
    hosts = entry.get("hosts")
    return {"trial": str(entry.get("trial", "")),
            "hosts": [str(h) for h in hosts] if isinstance(hosts, list) else [],
            "what": str(entry.get("what", "")), "value": _number(entry.get("value")),
            "repins": _count(entry.get("repins")), "migrations": _count(entry.get("migrations")) or 0,
            "why": str(entry.get("why", ""))}


def fixed_by_moves(fixed: Any) -> list[dict[str, Any]]:
    """The guests the plan's `fixed` notes say were left alone at `max_moves_per_guest_hour`,
    with their moves in the hour before the plan."""
    found = []
    for entry in fixed if isinstance(fixed, list) else ():
        match = _AT_MOVES_LIMIT.match(entry) if isinstance(entry, str) else None
        if match:
            found.append({"guest": match["guest"], "moves": int(match["moves"]), "limit": int(match["limit"])})
    return found


def plan_disruption(settings: Mapping[str, Any]) -> dict[str, Any] | None:
    """The plan's spend and limits (`trials` None when its notes hold no `disruption`); None when
    there is nothing to show: no trial budget spent and no guest held at its moves per hour."""
    notes = settings.get("notes")
    notes = notes if isinstance(notes, Mapping) else {}
    spent = notes.get("disruption")
    spent = spent if isinstance(spent, Mapping) else {}
    fixed = fixed_by_moves(notes.get("fixed"))
    if not spent and not fixed:
        return None
    waiting = [waiting_row(e) for e in notes.get("over_budget") or () if isinstance(e, Mapping)]
    return {"trials": _count(spent.get("trials")), "max_trials": _count(spent.get("max_trials")),
            "trial_repins": _count(spent.get("trial_repins")),
            "max_trial_repins": _count(spent.get("max_trial_repins")),
            "trials_waiting": _count(spent.get("trials_waiting")) or len(waiting),
            "waiting": waiting,
            "fixed_by_moves": fixed,
            "max_moves_per_guest_hour": _count(settings.get("max_moves_per_guest_hour")),
            "max_frozen_share_per_guest_hour": _number(settings.get("max_frozen_share_per_guest_hour")),
            "max_migrations_in_flight": _count(settings.get("max_migrations_in_flight"))}
