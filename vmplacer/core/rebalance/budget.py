"""The memory a plan may take: which hosts' layouts fit, decided before any is evaluated.

Scoring a small host's layout holds arrays of piece × piece entries (`rebalance/layout`: the
interference matrix, its blind view, pair terms and their spread, the kept recent layouts, a
judged move's before and after); their count per host is bounded (`PAIR_ARRAYS`, measured on
big hosts, docs/big-hosts.md). A big layout (more than `layout_moves.PER_GUEST_ABOVE` pieces:
floating vCPUs × the pCPUs they may run on) scores its moves from per-guest sums of pCPU × piece
entries, and a move's doubt (past `DENSE_JUDGE_PIECES` pieces, its confidence too) from a bounded
number of changed pieces' lines at a time (`layout_moves`, `doubt`, `whatif`): its need grows
with pCPUs × pieces (`LINE_ARRAYS`), plus the confidence's pair arrays up to `DENSE_JUDGE_PIECES`.
A host whose need exceeds the plan's budget (`memory_budget_mib`) is left out of the plan, named
with its need, rather than let the planner run out of memory — and so is a big layout one of whose
judged changes alone (about pieces² pair entries) would exceed the host's search budget
(`host_budget_s`), rather than let its plan run for minutes; the others' kept
evaluations share the same budget (`BetaTable.keep_cells`).
"""

from __future__ import annotations

from vmplacer.core.rebalance.layout import piece_count
from vmplacer.core.rebalance.layout_moves import DENSE_JUDGE_PIECES, PER_GUEST_ABOVE
from vmplacer.core.rebalance.state import EXCLUSIVE, PINNED, ClusterState, RebalanceSettings

PAIR_ARRAYS = 16  # piece × piece float arrays a host's search holds at its peak (measured, docs/big-hosts.md)
STILL_ARRAYS = 4  # … on a host where nothing moves within it (its layout is only evaluated)
BASE_MIB = 96  # what a search holds whatever its pieces: candidate batches, pCPU tables (measured)
# a big layout's pCPU × piece arrays at its peak (per-guest sums of the layout and its blind view
# while they are made, kept evaluations), and its piece × guest ones (the layout's and its blind view's)
LINE_ARRAYS = 8
GUEST_ARRAYS = 2
LINES_MIB = 128  # changed pieces' lines read at once (`doubt.LINE_CELLS`, `whatif.LINE_CELLS`: a few arrays)
JUDGE_ARRAYS = 8  # piece × piece arrays judging a move's confidence holds, up to `DENSE_JUDGE_PIECES`
_CELL_BYTES = 8
# candidate × piece entries the search scores per second of `host_budget_s` (`HostLayout.work`):
# 11–16 million measured on the reference machine (docs/big-hosts.md), so that a budget means the
# same work on any machine and a dry run stops where the real run stops
WORK_PER_SECOND = 12_000_000


def budget_cells(settings: RebalanceSettings) -> int:
    """Piece × piece entries one layout may have within the budget (and all kept evaluations
    together): what is left of it after `BASE_MIB`, over `PAIR_ARRAYS` arrays."""
    left = max(settings.memory_budget_mib - BASE_MIB, 0) * (1 << 20)
    return left // (_CELL_BYTES * PAIR_ARRAYS)


def host_need_mib(pieces: int, moves: bool = True, cpus: int = 0, guests: int = 0) -> float:
    """MiB planning a host of `pieces` pieces (`cpus` pCPUs, `guests` guests) takes at its peak;
    `moves`: something on it may move within it (else its layout is only evaluated)."""
    if pieces > PER_GUEST_ABOVE:
        entries = pieces * (cpus * LINE_ARRAYS + guests * GUEST_ARRAYS)
        if pieces <= DENSE_JUDGE_PIECES:  # a move's confidence still judged on whole pair arrays
            entries += pieces * pieces * JUDGE_ARRAYS
        return BASE_MIB + LINES_MIB + entries * _CELL_BYTES / (1 << 20)
    arrays = PAIR_ARRAYS if moves else STILL_ARRAYS
    return BASE_MIB + pieces * pieces * _CELL_BYTES * arrays / (1 << 20)


def hosts_over_budget(state: ClusterState, settings: RebalanceSettings) -> dict[str, str]:
    """Host -> why it is left out of the plan, for the hosts whose layout needs more than the
    budget (every guest's pins as they are; a candidate layout with more pieces — a pool — is
    refused on its own, `layout_fits`)."""
    layouts: dict[str, dict[str, dict[int, frozenset[int]]]] = {name: {} for name in state.hosts}
    moving: set[str] = set()
    for guest in state.guests.values():
        layouts[guest.host][guest.name] = dict(guest.placement.vcpupin)
        if guest.mode in (PINNED, EXCLUSIVE):
            moving.add(guest.host)
    left_out = {}
    for name, layout in layouts.items():
        usable = len(state.hosts[name].topology.usable_cpus) or len(state.hosts[name].topology.cpus)
        pieces = piece_count(layout, usable)
        need = host_need_mib(pieces, name in moving, len(state.hosts[name].topology.cpus), len(layout))
        if pieces > DENSE_JUDGE_PIECES and pieces * pieces > host_work_limit(settings):
            left_out[name] = (f"host {name}: its layout is {pieces} pieces (floating vCPUs × the pCPUs they may "
                              f"run on): judging one change reads about {pieces * pieces:,} pair entries, more "
                              f"than the host's whole search budget of {settings.host_budget_s:g} s "
                              f"({host_work_limit(settings):,.0f} entries, rebalance.search.host_budget_s); "
                              "left as it is")
            continue
        if need > settings.memory_budget_mib:
            left_out[name] = (f"host {name}: its layout is {pieces} pieces (floating vCPUs × the pCPUs they may "
                              f"run on), about {need:.0f} MiB to plan, over the plan's memory budget of "
                              f"{settings.memory_budget_mib} MiB (rebalance.search.memory_budget_mib); "
                              "left as it is")
    return left_out


def layout_fits(layout: dict[str, dict[int, frozenset[int]]], usable: int, settings: RebalanceSettings) -> bool:
    """Whether a candidate layout (e.g. a pool: pinned vCPUs floating over a node) may be
    evaluated within the budget."""
    pieces = piece_count(layout, usable)
    # held to the piece × piece bound although a big layout is scored without such arrays: a pool
    # past it costs the search its whole budget on a crowded host and finds no gain there
    # (docs/big-hosts.md, 112 pCPUs × 200 pinned guests)
    return pieces * pieces <= budget_cells(settings)


def host_work_limit(settings: RebalanceSettings) -> float:
    """Piece entries the search may score on one host (`HostLayout.work`) before it stops
    looking for more moves there: `host_budget_s` in deterministic seconds."""
    return settings.host_budget_s * WORK_PER_SECOND
