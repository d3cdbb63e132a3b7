"""Host leases for the job runner: the `host_leases` table, shared with `vmplacer rebalance`."""

from __future__ import annotations

from typing import Any

from vmplacer.adapters.db.plans import SqlLeaseStore
from vmplacer.ports import LeaseStore


def host_leases(container: Any) -> LeaseStore:
    return SqlLeaseStore(container.sessions)


def live_holders(container: Any) -> dict[str, dict[str, Any]]:
    """host -> {"holder", "expires_at"} for leases held right now."""
    return {host: {"holder": info["holder"], "expires_at": info["expires_at"]}
            for host, info in SqlLeaseStore(container.sessions).holders().items() if info.get("live")}
