"""The memory a plan may take: which hosts' layouts fit, decided before any is evaluated.

Scoring a host's layout holds arrays of piece × piece entries (`rebalance/layout`: the
interference matrix, its blind view, pair terms and their spread, the kept recent layouts, a
judged move's before and after); their count per host is bounded (`PAIR_ARRAYS`, measured on
big hosts, docs/rebalance.md), so a host's need follows from its pieces alone. A host whose
need exceeds the plan's budget (`memory_budget_mib`) is left out of the plan, named with its
need, rather than let the planner run out of memory; the others' kept evaluations share the
same budget (`BetaTable.keep_cells`).
"""

from __future__ import annotations

from vmplacer.core.rebalance.layout import piece_count
from vmplacer.core.rebalance.state import ClusterState, RebalanceSettings

PAIR_ARRAYS = 32  # piece × piece float arrays one host's planning holds at its peak (measured)
_CELL_BYTES = 8
# piece entries the search scores per second of `host_budget_s` (`HostLayout.work`): 12–16 million measured on the
# reference machine (docs/rebalance.md, "Big hosts"), so that a budget means the same work on any
# machine and a dry run stops where the real run stops
WORK_PER_SECOND = 12_000_000


def budget_cells(settings: RebalanceSettings) -> int:
    """Piece × piece entries the budget allows one host (and all kept evaluations together)."""
    return settings.memory_budget_mib * (1 << 20) // (_CELL_BYTES * PAIR_ARRAYS)


def host_need_mib(pieces: int) -> float:
    """MiB a host of `pieces` pieces needs at its planning's peak."""
    return pieces * pieces * _CELL_BYTES * PAIR_ARRAYS / (1 << 20)


def hosts_over_budget(state: ClusterState, settings: RebalanceSettings) -> dict[str, str]:
    """Host -> why it is left out of the plan, for the hosts whose layout needs more than the
    budget (every guest's pins as they are: the search's layouts have as many pieces or fewer
    — pinning a floating vCPU makes one piece of many)."""
    layouts: dict[str, dict[str, dict[int, frozenset[int]]]] = {name: {} for name in state.hosts}
    for guest in state.guests.values():
        layouts[guest.host][guest.name] = dict(guest.placement.vcpupin)
    cells = budget_cells(settings)
    left_out = {}
    for name, layout in layouts.items():
        usable = len(state.hosts[name].topology.usable_cpus) or len(state.hosts[name].topology.cpus)
        pieces = piece_count(layout, usable)
        if pieces * pieces > cells:
            left_out[name] = (f"host {name}: its layout is {pieces} pieces (floating vCPUs × the pCPUs they may "
                              f"run on), about {host_need_mib(pieces):.0f} MiB to plan, over the plan's memory "
                              f"budget of {settings.memory_budget_mib} MiB (rebalance.search.memory_budget_mib); "
                              "left as it is")
    return left_out


def host_work_limit(settings: RebalanceSettings) -> float:
    """Piece entries the search may score on one host (`HostLayout.work`) before it stops
    looking for more moves there: `host_budget_s` in deterministic seconds."""
    return settings.host_budget_s * WORK_PER_SECOND
