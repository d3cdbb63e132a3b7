"""Plan action kinds, one class each: precheck → execute → verify → revert.

* `Repin` (pinning.py) — vCPUs, then emulator threads, live;
* `SetMemoryNodes` (memory.py) — live memory-node change;
* `Migrate` (migrate.py) — live migration under a bandwidth limit and timeout;
* `Throttle`, `Release` (bandwidth.py) — CPU bandwidth, live and persistent;
* `Probe` (probe.py) — a short profiling run.

`action_kinds` builds one instance per plan action kind for the executor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping

from vmplacer.app.apply.actions.bandwidth import Release, Throttle
from vmplacer.app.apply.actions.base import ActionFailed, ActionKind, Check
from vmplacer.app.apply.actions.memory import SetMemoryNodes
from vmplacer.app.apply.actions.migrate import Migrate
from vmplacer.app.apply.actions.pinning import Repin
from vmplacer.app.apply.actions.probe import OnVerdict, Probe
from vmplacer.core.rebalance.trial import Measured
from vmplacer.ports import Hypervisor

__all__ = ["ActionFailed", "ActionKind", "Check", "action_kinds"]


def action_kinds(
    hosts: Mapping[str, Hypervisor],
    *,
    probe: Callable[[str, float], str | Measured] | None = None,
    migration_bandwidth_mib_s: int | None = None,
    migration_timeout_s: float = 300.0,
    measurements: MutableMapping[str, Measured] | None = None,
    on_verdict: OnVerdict | None = None,
) -> dict[str, ActionKind]:
    """Plan action kind → the class instance that carries its contract."""
    handlers: list[ActionKind] = [
        Repin(hosts),
        SetMemoryNodes(hosts),
        Migrate(hosts, bandwidth_mib_s=migration_bandwidth_mib_s, timeout_s=migration_timeout_s),
        Throttle(hosts),
        Release(hosts),
        Probe(hosts, probe=probe, measurements=measurements, on_verdict=on_verdict),
    ]
    return {kind: handler for handler in handlers for kind in handler.kinds}
