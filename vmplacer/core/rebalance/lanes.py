"""A plan's actions split into lanes that share no host: what an executor may run at once.

Actions on one host run in plan order (a probe measures the repins before it; a revert
undoes them newest first), so each host is in exactly one lane. A migration, or a trial
that measures several hosts, ties its hosts into one lane; so does a dependency between
actions. Lanes are listed by their first action, each in plan order: run one after
another they are the plan itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vmplacer.core.rebalance.plan import Action


def action_lanes(actions: Sequence[Action], hosts_of: dict[int, Iterable[str]] | None = None) -> list[list[int]]:
    """Action indexes grouped into lanes that share no host and no dependency. `hosts_of`:
    index -> further hosts an action touches (a trial's measured hosts), beyond its own and
    its migration target."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    def join(a: str, b: str) -> None:
        parent[root(a)] = root(b)

    for action in actions:
        mine = f"a{action.index}"
        join(mine, f"h{action.host}")
        if action.target_host:
            join(mine, f"h{action.target_host}")
        for host in (hosts_of or {}).get(action.index, ()):
            join(mine, f"h{host}")
        for dep in action.depends_on:
            join(mine, f"a{dep}")
    lanes: dict[str, list[int]] = {}
    for action in actions:
        lanes.setdefault(root(f"a{action.index}"), []).append(action.index)
    return list(lanes.values())
