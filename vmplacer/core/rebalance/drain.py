"""Draining a host for maintenance: live-migrate its guests away, as a Plan.

A rebalance moves a guest only when the move pays for itself; a drain moves
every guest it can, because the operator needs the host empty (a kernel or
firmware update, a failing DIMM). Each guest goes where the same rules as a
rebalance migration allow (the placement engine's rules for guests vmplacer
placed, anti-affinity, memory per node, protected guests' floors on the
destination, a migration that converges) and, among those destinations, where
the predicted objective ends highest. Largest memory first, while the other
hosts have the most room. Cool-downs and `--scope` do not apply; the
`rebalance` label does: `off` or `no-migrate` keeps a guest where it is, and
the plan says so, and a `scope` (guest names) drains part of a host at a
time. A guest that fits nowhere stays and is named with the reason; the rest
still leave.

Pure, like the rest of the policy: the cluster state in, a Plan out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.text import plural
from vmplacer.core.rebalance.plan import Plan
from vmplacer.core.rebalance.actions import build_actions, plan_from_search
from vmplacer.core.rebalance.search import apply_move, start_search
from vmplacer.core.rebalance.migration import migration_move
from vmplacer.core.rebalance.whatif import CandidateMove, total_objective
from vmplacer.core.rebalance.state import (
    LABEL_REBALANCE,
    ClusterState,
    RebalanceInputError,
    RebalanceSettings,
)


def plan_drain(
    state: ClusterState,
    model: InterferenceModel,
    host: str,
    settings: RebalanceSettings | None = None,
    *,
    now: float | None = None,
    scope: Iterable[str] | None = None,
) -> Plan:
    """Migrations that empty `host`; the Plan's `settings.notes.stuck` names guests that stay, with why."""
    settings = settings or RebalanceSettings()
    if host not in state.hosts:
        raise RebalanceInputError(f"host {host!r} to drain is not in the cluster state "
                                  f"({', '.join(sorted(state.hosts))})")
    destinations = sorted(n for n, h in state.hosts.items() if n != host and h.accepts_migrations)
    hosts = dict(state.hosts)
    hosts[host] = replace(hosts[host], accepts_migrations=False)
    draft, inputs = start_search(ClusterState(hosts, state.guests), model, settings)
    draft.ruled.add(host)  # the host must be emptied, whatever a measurement says: no trial brings a guest back
    before = total_objective(draft, inputs)
    source = draft.hosts[host]
    stuck: list[str] = []
    in_scope = set(scope) if scope is not None else None
    leaving = sorted(state.on_host(host), key=lambda g: (-g.placement.memory_kib, g.name))
    for original in leaving:
        guest = draft.guests[original.name]
        if in_scope is not None and guest.name not in in_scope:
            stuck.append(f"{guest.name}: outside the scope of this drain")
            continue
        if not guest.migratable:
            value = "off" if original.why_fixed.endswith("=off") else "no-migrate"  # see describe_guest
            stuck.append(f"{guest.name}: label {LABEL_REBALANCE}={value} keeps it on {host}")
            continue
        if not destinations:
            stuck.append(f"{guest.name}: no other host accepts migrations")
            continue
        rejected_before = len(draft.rejected)
        best: CandidateMove | None = None
        for name in destinations:
            move = migration_move(draft, inputs, guest, source, draft.hosts[name])
            if move is not None and (best is None or move.gain > best.gain):
                best = move
        if best is None:
            why = "; ".join(draft.rejected[rejected_before:]) or (
                "no destination has room for it under its placement rules, anti-affinity "
                "and the floors of protected guests there")
            stuck.append(f"{guest.name}: fits on no other host ({why})")
            continue
        best.reason = f"drain {host}: " + best.reason
        apply_move(draft, inputs, best)
    after = total_objective(draft, inputs)
    actions, predicted = build_actions(draft, inputs, model)
    moved = sum(1 for a in actions if a.kind == "migrate")
    summary = f"drain {host}: {plural(moved, 'migration')}"
    summary += f"; {plural(len(stuck), 'guest')} stay: " + "; ".join(stuck) if stuck else "; the host will be empty"
    notes = {"drain": host, "stuck": stuck, "fixed": [], "rejected": draft.rejected[:20]}
    return plan_from_search(draft, inputs, actions, predicted, before=before, after=after, summary=summary, notes=notes,
                            now=now)
