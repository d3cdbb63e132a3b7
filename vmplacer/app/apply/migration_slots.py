"""Migrations in flight: `rebalance.disruption.max_migrations_in_flight`.

A host is in at most one migration at a time already: a plan's actions on one host run in order
in one lane (core/rebalance/lanes.py: a migration ties its source and destination into one
lane), and a host lease keeps every other plan off the host while a plan runs. What lanes do not
bound is the fleet: each plan runs up to `parallel_hosts` lanes at once, and one process (the
API service, a `vmplacer rebalance` run) may apply several plans. Every executor of a process
takes a slot from one shared pool (`PROCESS_SLOTS`) for each migration it starts — the
migration, its verification, the clean-up of a failed one, and a migration back (a revert) —
and waits for one when the limit is reached; a migration that waited checks its host lease and
the host again before it starts. A lane holds at most one slot and never waits while holding
one, so waiting cannot deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from vmplacer.core.rebalance.plan import Plan
from vmplacer.core.rebalance.state import RebalanceSettings

SETTING = "rebalance.disruption.max_migrations_in_flight"
FIELD = "max_migrations_in_flight"  # its name in a plan's settings and in ExecutorSettings


class MigrationLimitError(ValueError):
    """A plan's recorded limit that is not a usable number; names the field."""


def migration_limit(plan: Plan, configured: int | None) -> int:
    """The limit to apply `plan` with: the executor's setting when given, else the plan's own
    (recorded when it was planned), else the default. 0: no limit."""
    if configured is not None:
        return configured
    value = plan.settings.get(FIELD) if isinstance(plan.settings, Mapping) else None
    if value is None:
        return RebalanceSettings().max_migrations_in_flight
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise MigrationLimitError(f"plan {plan.id}: field 'settings.{FIELD}' must be an integer >= 0, got {value!r}")
    return value


class MigrationSlots:
    """Migrations running at once in this process, and the most there ever were."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.in_flight = 0
        self.peak = 0
        self.waits = 0  # migrations that had to wait for a slot

    @contextmanager
    def held(self, limit: int) -> Iterator[bool]:
        """One migration's slot for the block, waiting while `limit` are in flight (0: no limit);
        yields whether it waited (the world may have changed meanwhile)."""
        with self._changed:
            waited = 0 < limit <= self.in_flight
            self.waits += waited
            while 0 < limit <= self.in_flight:
                self._changed.wait()
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            yield waited
        finally:
            with self._changed:
                self.in_flight -= 1
                self._changed.notify_all()


PROCESS_SLOTS = MigrationSlots()
