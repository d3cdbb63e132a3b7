"""The what-if layouts' arithmetic: candidate moves, their predicted gain and how sure it is, the rules.

Every stage reads the `Draft`'s host layouts (core/rebalance/layout.py `HostLayout`) through
these functions: a host's objective and each guest's predicted performance, whether a
layout keeps the placement engine's rules and the protected guests' floors, and how much
of a move's predicted gain the model's data back (`judge`). A move is tried on the layouts
and taken back (`try_move`); the search (core/rebalance/search.py) applies the ones it takes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from vmplacer.core.placement.guest_placement import GuestCell, Placement
from vmplacer.core.placement.occupancy import HostUsage, memory_by_node
from vmplacer.core.rebalance.draft import Draft, PlanInputs
from vmplacer.core.rebalance import layout_moves
from vmplacer.core.rebalance.layout import HostLayout, LayoutPieces, layout_confidences, utility
from vmplacer.core.rebalance.state import EXCLUSIVE, FIXED, FLOATING, PINNED, GuestState


EPS = 1e-9


@dataclass
class GuestChange:
    """One guest's new whereabouts in a move."""

    guest: str
    host: str
    pins: dict[int, frozenset[int]]
    memory_nodes: frozenset[int] | None = None  # None: unchanged
    placement: Placement | None = None  # a full placement (placement-engine result)


@dataclass
class CandidateMove:
    kind: str  # move | swap | pool | unpool | relocate | migrate
    changes: list[GuestChange]
    gain: float  # objective gain, cost included
    linear_gain: float  # the part time sharing alone explains
    cost: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    confidence: float = 1.0  # how much of the predicted interference change rests on data
    prior_gain: float = 0.0  # the interference change the topology alone predicts (no workload data)
    quick_sure: float = -np.inf  # the sure gain at zero confidence: a cheap ranking of candidates
    guess_weight: float = 0.0  # share of an interference change the data do not identify that still counts
    judged: bool = False  # confidence and prior gain computed

    @property
    def sure_gain(self) -> float:
        """The gain the move is judged by: time sharing counts fully (it is arithmetic, not a
        guess); predicted interference as far as the model's data identify it, or as far as
        the topology alone predicts it too (moving off a busy SMT sibling onto an idle core
        helps whoever the neighbours are)."""
        interference = self.gain - self.linear_gain
        trusted = self.guess_weight + (1.0 - self.guess_weight) * self.confidence
        return self.linear_gain + max(trusted * interference, min(interference, self.prior_gain))


def new_move(kind: str, changes: Iterable[tuple[str, str, dict[int, frozenset[int]]]]) -> CandidateMove:
    """A move of (guest, host, pins) changes, its gains still to be computed."""
    return CandidateMove(kind, [GuestChange(g, h, dict(p)) for g, h, p in changes], 0.0, 0.0)


def guest_confidence(draft: Draft, inputs: PlanInputs, name: str, default: float = 0.0) -> float:
    """`confidence` of one guest: only its host's is computed (a plan needs the moved guests')."""
    return host_confidences(draft, inputs, draft.hosts[draft.host_of[name]]).get(name, default)


def host_confidences(draft: Draft, inputs: PlanInputs, host: HostLayout) -> dict[str, float]:
    """`layout_confidences` of the host as it is, kept while its guests and pins are the same:
    the plan asks again for every host at the end, and most hosts are as they were."""
    state = (tuple(host.guests.values()),
             tuple((name, tuple(sorted(pins.items()))) for name, pins in host.pins.items()))
    kept = draft.confidence_cache.get(host.name)
    if kept is not None and kept[0] == state:
        return kept[1]
    found = layout_confidences(host, inputs.model, inputs.betas)
    draft.confidence_cache[host.name] = (state, found)
    return found


def perf_by_guest(draft: Draft) -> dict[str, float]:
    result: dict[str, float] = {}
    for host in draft.hosts.values():
        result.update(host_perf(host))
    return result


def host_perf(host: HostLayout) -> dict[str, float]:
    """Each guest's predicted performance on `host` as it is laid out now."""
    if not host.guests:
        return {}
    pieces = host.pieces()
    values = host.perf(pieces, pieces.cpu)[0][0]
    return {name: float(values[i]) for i, name in enumerate(pieces.guests)}


def objective_of(inputs: PlanInputs, pieces: LayoutPieces, perf: np.ndarray) -> np.ndarray:
    return (utility(perf, inputs.settings.fairness) * pieces.weight[None, :]).sum(axis=1)


def host_objective(inputs: PlanInputs, host: HostLayout) -> float:
    if not host.guests:
        return 0.0
    pieces = host.pieces()
    return float(objective_of(inputs, pieces, host.perf(pieces, pieces.cpu)[0])[0])


def total_objective(draft: Draft, inputs: PlanInputs) -> float:
    return sum(host_objective(inputs, h) for h in draft.hosts.values())


def floors_ok(draft: Draft, inputs: PlanInputs, pieces: LayoutPieces, perf: np.ndarray) -> np.ndarray:
    """Per candidate: no protected guest pushed below min(its floor, where it is now)."""
    ok = np.ones(perf.shape[0], dtype=bool)
    if not inputs.floors:
        return ok
    for index, name in enumerate(pieces.guests):
        floor = inputs.floors.get(name)
        if floor is None:
            continue
        now = draft.perf_now.get(name, floor)
        ok &= perf[:, index] >= min(floor, now) - 1e-6
    return ok


def may_pin(draft: Draft, inputs: PlanInputs, name: str) -> bool:
    """A floating guest whose vCPUs the search may pin 1:1 again: vmplacer floated it (in this
    search, or an earlier plan's pool that nobody has changed since), or the settings allow
    pinning floating guests. A guest whose flavor asks for shared vCPUs keeps floating."""
    guest = draft.guests[name]
    return (guest.mode == FLOATING and guest.spec is None and guest.movable
            and (inputs.settings.pin_floating_guests or name in inputs.history.pooled
                 or inputs.original[name].mode == PINNED))


def blind_view(inputs: PlanInputs, pieces: LayoutPieces) -> LayoutPieces | None:
    """The same layout seen through the topology prior (every guest alike), cached."""
    if inputs.betas.prior is None:
        return None
    if pieces.blind is None:
        parent = None
        if pieces.parent is not None and pieces.parent[0].blind is not None:
            parent = (pieces.parent[0].blind, pieces.parent[1])  # its matrix, updated likewise
        pieces.blind = replace(pieces, key=np.zeros_like(pieces.key), table=inputs.betas.prior, matrix=None,
                               current=None, blind=None, terms=None, spread=None,
                               load=None, blind_base=None, slots=None, parent=parent, piece_keys=None,
                               by_cpu=None, guest_sums=None)
    return pieces.blind


def blind_base(inputs: PlanInputs, host: HostLayout, pieces: LayoutPieces) -> float:
    """The layout's objective under the topology prior minus time sharing alone (cached: every
    single move judged from the layout subtracts it)."""
    if pieces.blind_base is None:
        blind = blind_view(inputs, pieces)
        if blind is None:
            return 0.0
        perf, linear = host.perf(blind, blind.cpu)
        pieces.blind_base = float(objective_of(inputs, blind, perf)[0] - objective_of(inputs, blind, linear)[0])
    return pieces.blind_base


def linear_objective(inputs: PlanInputs, host: HostLayout) -> float:
    if not host.guests:
        return 0.0
    pieces = host.pieces()
    return float(objective_of(inputs, pieces, host.perf(pieces, pieces.cpu)[1])[0])


def floors_hold(draft: Draft, inputs: PlanInputs, host: HostLayout) -> bool:
    if not host.guests:
        return True
    pieces = host.pieces()
    return bool(floors_ok(draft, inputs, pieces, host.perf(pieces, pieces.cpu)[0])[0])


def current_placement(draft: Draft, name: str) -> Placement:
    """The guest's placement as the what-if state has it (kept while its guest state, host,
    pins and memory nodes are the very ones it was made from: destinations ask for every
    guest's placement on every host they weigh)."""
    guest = draft.guests[name]
    host = draft.hosts[draft.host_of[name]]
    pins = host.pins[name]
    memory = draft.memory_nodes.get(name)
    kept = draft.placement_cache.get(name)
    if kept is not None and kept[0] is guest and kept[1] == host.name and kept[2] is pins and kept[3] == memory:
        return kept[4]
    old = guest.placement
    placement = replace(old, host=host.name, vcpupin=dict(pins))
    if memory is not None:
        placement = replace(placement, memory_nodes=memory)
    draft.placement_cache[name] = (guest, host.name, pins, memory, placement)
    return placement


def memory_fits(draft: Draft, host: HostLayout, name: str, nodes: frozenset[int]) -> bool:
    others = [current_placement(draft, n) for n in host.guests if n != name]
    usage = HostUsage.build(host.topology, others)
    need = current_placement(draft, name).memory_kib
    free = sum(usage.small_free_kib(n, host.reserved_kib) for n in nodes if n in host.topology.nodes)
    return free >= need


def destination_memory_nodes(draft: Draft, destination: HostLayout, guest: GuestState, pins: Mapping[int, frozenset[int]],
                             placement: Placement | None) -> frozenset[int] | None:
    """Memory nodes on the destination: the engine's, else the nodes of the new pCPUs (when the
    guest pinned its memory), else unchanged; None when the memory does not fit."""
    if placement is not None:
        return placement.memory_nodes
    if guest.placement.memory_nodes or guest.placement.cells:
        nodes = frozenset(destination.node_of[c] for cpus in pins.values() for c in cpus)
    else:
        nodes = frozenset()
    visitor = current_placement(draft, guest.name)
    visitor = replace(visitor, host=destination.name, vcpupin=dict(pins), memory_nodes=nodes, cells=())
    usage = HostUsage.build(destination.topology, [current_placement(draft, n) for n in destination.guests])
    for node, kib in memory_by_node(destination.topology, visitor).items():
        page = visitor.hugepage_kib
        if page and page > 4:
            if usage.huge_free_pages(node, page) < -(-kib // page):
                return None
        elif usage.small_free_kib(node, destination.reserved_kib) < kib:
            return None
    return nodes


def violations(draft: Draft, host: HostLayout, names: Iterable[str]) -> list[str]:
    """Rules of the placement engine the layout breaks for `names` (empty: none)."""
    problems = []
    for name in names:
        guest = draft.guests[name]
        pins = host.pins[name]
        used = {c for cpus in pins.values() for c in cpus}
        bad = sorted(used - host.usable)
        if bad and guest.mode != FIXED:
            problems.append(f"{name}: pCPUs {bad} are reserved or offline on {host.name}")
        owned = host.owned_by_others(name)
        if used & owned:
            problems.append(f"{name}: pCPUs {sorted(used & owned)} are owned by another guest")
        shared_nodes = {host.node_of[c] for c in used} & host.anti_affine_nodes(name)
        if shared_nodes:
            problems.append(f"{name}: shares node(s) {sorted(shared_nodes)} with a guest of its anti-affinity")
        if guest.mode == EXCLUSIVE:
            others = host.pinned_by_others(name)
            if used & others:
                problems.append(f"{name}: its dedicated pCPUs {sorted(used & others)} run other guests")
            cpus = [next(iter(p)) for p in pins.values()]
            if len(set(cpus)) != len(cpus):
                problems.append(f"{name}: two dedicated vCPUs share a pCPU")
            if guest.thread_policy == "isolate":
                cores = [host.topology.cpus[c].core for c in cpus]
                if len(set(cores)) != len(cores):
                    problems.append(f"{name}: isolate needs one vCPU per core")
                busy = others | owned
                for c in cpus:
                    if (host.siblings[c] - {c}) & busy:
                        problems.append(f"{name}: a sibling of pCPU {c} runs another guest (isolate)")
    return problems


def judge(draft: Draft, inputs: PlanInputs, move: CandidateMove) -> float:
    if not move.judged:
        _assess(draft, inputs, move)
        move.guess_weight = inputs.settings.guess_weight
        move.judged = True
    return move.sure_gain


def _assess(draft: Draft, inputs: PlanInputs, move: CandidateMove) -> None:
    """How much of the move's predicted interference change rests on data (confidence),
    and how much the topology alone predicts (prior gain).

    The change is taken pair by pair (who hurts whom, at which distance, before and
    after): each pair's change counts with the confidence of the coefficients behind
    it, before and after. A pair at a distance class never observed, or whose
    coefficients the samples cannot tell apart, contributes the model's guess, which
    is not sure.
    """
    hosts = sorted({draft.host_of[c.guest] for c in move.changes} | {c.host for c in move.changes})
    before = [_keys_and_factors(draft.hosts[h]) for h in hosts]
    prior_before = sum(_prior_interference(inputs, draft.hosts[h]) for h in hosts)
    undo = try_move(draft, move)
    try:
        after = [_keys_and_factors(draft.hosts[h]) for h in hosts]
        prior_after = sum(_prior_interference(inputs, draft.hosts[h]) for h in hosts)
    finally:
        undo()
    move.prior_gain = prior_after - prior_before
    total = weighted = 0.0
    # each layout's evaluation stands on its own pieces: read after the move is taken back
    for (host_b, pieces_b, keys_b, factors_b), (host_a, pieces_a, keys_a, factors_a) in zip(before, after):
        big = max(len(pieces_b.cpu), len(pieces_a.cpu)) > layout_moves.DENSE_JUDGE_PIECES
        changed = changed_pieces(keys_b, factors_b, keys_a, factors_a, 1.0 if big else SPARSE_SHARE)
        if changed is not None:
            found = pair_line_sums(keys_b, _lines_of(host_b, pieces_b), keys_a, _lines_of(host_a, pieces_a), changed)
        else:
            change, trust = pair_changes(*host_b.pair_terms(pieces_b), *host_a.pair_terms(pieces_a))
            if change is None:
                continue
            found = float(change.sum()), float(np.multiply(change, trust, out=trust).sum())
        total += found[0]
        weighted += found[1]
    move.confidence = weighted / total if total > EPS else 1.0


def _keys_and_factors(host: HostLayout) -> tuple[HostLayout, LayoutPieces, list, np.ndarray]:
    """The host's layout as it stands: its pieces, their pair-term keys, and per piece the two
    factors its row and column of pair terms are made of besides the pair's coefficient (its
    granted share and objective scale) — what tells which pieces' terms a move changes."""
    pieces = host.pieces()
    granted, scale = host.pair_factors(pieces)
    return host, pieces, host.pair_keys(pieces), np.stack([granted, scale], axis=1)


Lines = Callable[[np.ndarray, bool], tuple[np.ndarray, np.ndarray]]


def _lines_of(host: HostLayout, pieces: LayoutPieces) -> Lines:
    """The rows (or columns) of a layout's pair terms and confidences, for the pieces asked."""
    return lambda which, columns: host.pair_lines(pieces, which, columns)


def _array_lines(terms: np.ndarray, conf: np.ndarray) -> Lines:
    return lambda which, columns: (terms[:, which].T, conf[:, which].T) if columns else (terms[which], conf[which])


# a move that changes more pieces than this share of a layout is judged on the whole pair arrays
SPARSE_SHARE = 0.25
# (… unless the layout has more than `layout_moves.DENSE_JUDGE_PIECES`)
LINE_CELLS = 1 << 21  # changed pieces' lines × pieces read at once (16 MiB an array)


def changed_pieces(keys_b: list, factors_b: np.ndarray, keys_a: list, factors_a: np.ndarray,
                    share: float = SPARSE_SHARE) -> np.ndarray | None:
    """[u] over the union of both layouts' pieces (before's first, then after's new ones): the
    pieces whose row and column of pair terms may differ — in one layout only, or in both with
    another granted share or objective scale. A pair of two other pieces has the same pCPUs,
    identities and factors on both sides, so the same term and confidence: its change is 0.
    None when more than `share` of the pieces changed (the whole arrays are then cheaper)."""
    union = dict(zip(keys_b, range(len(keys_b))))
    for k in keys_a:
        union.setdefault(k, len(union))
    changed = np.ones(len(union), dtype=bool)
    index = np.fromiter(map(union.__getitem__, keys_a), dtype=np.intp, count=len(keys_a))
    both = index < len(keys_b)
    same = (factors_a[both] == factors_b[index[both]]).all(axis=1)
    changed[index[both][same]] = False
    if changed.sum() > share * max(len(union), 1):
        return None
    return changed


def pair_change_sums(keys_b: list, terms_b: np.ndarray, conf_b: np.ndarray, keys_a: list, terms_a: np.ndarray,
                     conf_a: np.ndarray, changed: np.ndarray) -> tuple[float, float]:
    """`pair_line_sums` of two layouts whose whole pair arrays are at hand."""
    return pair_line_sums(keys_b, _array_lines(terms_b, conf_b), keys_a, _array_lines(terms_a, conf_a), changed)


def pair_line_sums(keys_b: list, lines_b: Lines, keys_a: list, lines_a: Lines,
                   changed: np.ndarray) -> tuple[float, float]:
    """(Σ |after − before|, Σ |after − before| · least confidence) over the pairs that have a
    `changed` piece (`changed_pieces`): `pair_changes`' sums without its union × union arrays,
    in O(changed × pieces), reading only the changed pieces' rows and columns."""
    nb, n = len(keys_b), len(changed)
    union = dict(zip(keys_b, range(nb)))
    for k in keys_a:
        union.setdefault(k, len(union))
    index = np.fromiter(map(union.__getitem__, keys_a), dtype=np.intp, count=len(keys_a))
    where_a = np.full(n, -1, dtype=np.intp)
    where_a[index] = np.arange(len(keys_a))
    rows = np.flatnonzero(changed)

    def lines(read: Lines, at: np.ndarray, placed: np.ndarray, transpose: bool,
              part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows (or columns) of the changed pieces `part` in one layout, spread over the union's pieces."""
        value, trust = np.zeros((len(part), n)), np.ones((len(part), n))
        present = at[part] >= 0
        if present.any():
            mine = at[part][present]
            got_t, got_c = read(mine, transpose)
            value[np.ix_(np.flatnonzero(present), placed)] = got_t
            trust[np.ix_(np.flatnonzero(present), placed)] = np.where(got_t != 0, got_c, 1.0)
        return value, trust

    where_b = np.where(np.arange(n) < nb, np.arange(n), -1)
    total = weighted = 0.0
    step = max(1, LINE_CELLS // max(n, 1))
    for start in range(0, max(len(rows), 1), step):  # a bounded number of lines at a time
        part = rows[start:start + step]
        for transpose in (False, True):
            value_b, trust_b = lines(lines_b, where_b, np.arange(nb), transpose, part)
            value_a, trust_a = lines(lines_a, where_a, index, transpose, part)
            change = np.abs(value_a - value_b)
            trust = np.minimum(np.minimum(trust_a, trust_b), 1.0)
            if transpose:  # pairs of two changed pieces are counted with the rows
                change[:, rows] = 0.0
            total += float(change.sum())
            weighted += float((change * trust).sum())
    return total, weighted


def _prior_interference(inputs: PlanInputs, host: HostLayout) -> float:
    """The host's objective under the topology prior, minus time sharing alone."""
    if not host.guests or inputs.betas.prior is None:
        return 0.0
    return blind_base(inputs, host, host.pieces())


def try_move(draft: Draft, move: CandidateMove):
    """Put the move's layout on the what-if hosts; returns the function that takes it back."""
    undo = []
    for change in move.changes:
        name = change.guest
        source = draft.hosts[draft.host_of[name]]
        old_pins = source.pins[name]
        if change.host != source.name:
            guest = source.guests[name]
            source.remove(name)
            target = draft.hosts[change.host]
            target.add(replace(guest, host=change.host, placement=replace(guest.placement, host=change.host)),
                       change.pins)
            undo.append(lambda s=source, t=target, g=guest, n=name, p=old_pins: (t.remove(n), s.add(g, p)))
        elif change.pins != old_pins:  # a guest the move leaves where it is needs no undo
            before = source._pieces  # the host's evaluation as it is, valid again once taken back
            source.set_pins(name, change.pins)
            undo.append(lambda s=source, n=name, p=old_pins, b=before: s.set_pins(n, p, pieces=b))

    def take_back() -> None:
        for step in reversed(undo):
            step()
    return take_back


def pair_changes(keys_b: list, terms_b: np.ndarray, conf_b: np.ndarray, keys_a: list, terms_a: np.ndarray,
                 conf_a: np.ndarray) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """[x, y] over the pieces of both layouts (before's first, in order, then after's new ones):
    how much each pair's term changes, |after − before|, and the least confidence behind it
    (written over: the caller's to use up).

    When every piece before is still there after (a pool: the pinned vCPUs become floating
    pieces over the pool, the old ones among them, hundreds in all), after's terms are gathered
    into that order in one go instead of scattered into zeros through a fancy index: each entry
    is the same arithmetic on the same operands, so the same floats and the same sums."""
    nb = len(keys_b)
    union = dict(zip(keys_b, range(nb)))  # a layout's pieces are distinct
    for k in keys_a:
        union.setdefault(k, len(union))
    n = len(union)
    if n == 0:
        return None, None
    index = np.fromiter(map(union.__getitem__, keys_a), dtype=np.intp, count=len(keys_a))
    order = np.argsort(index, kind="stable") if keys_a and len(keys_a) == n else None
    if order is None or not bool((index[order] == np.arange(n)).all()):
        delta = np.zeros((n, n))
        trust = np.ones((n, n))
        if nb:
            delta[:nb, :nb] += -1.0 * terms_b
            trust[:nb, :nb] = np.minimum(trust[:nb, :nb], np.where(terms_b != 0, conf_b, 1.0))
        if keys_a:
            at = np.ix_(index, index)
            delta[at] += 1.0 * terms_a
            trust[at] = np.minimum(trust[at], np.where(terms_a != 0, conf_a, 1.0))
        return np.abs(delta, out=delta), trust
    # after's piece order[u] is the union's piece u
    delta = terms_a.take(order, axis=0).take(order, axis=1)
    trust = conf_a.take(order, axis=0).take(order, axis=1)
    np.copyto(trust, 1.0, where=delta == 0)  # np.where(terms != 0, conf, 1.0)
    if nb:
        # before's block: (0 − before) + after, and the least of 1, before's and after's confidence
        changed = np.zeros((nb, nb))
        changed += -1.0 * terms_b
        delta[:nb, :nb] = changed + delta[:nb, :nb]
        least = np.minimum(np.ones((nb, nb)), np.where(terms_b != 0, conf_b, 1.0))
        least = np.minimum(least, trust[:nb, :nb])
    np.minimum(1.0, trust, out=trust)  # ties only at 1.0 itself: the same as against ones
    if nb:
        trust[:nb, :nb] = least
    return np.abs(delta, out=delta), trust


def relocated_cells(placement: Placement, nodes: frozenset[int]) -> tuple[GuestCell, ...]:
    if not placement.cells or len(nodes) != 1:
        return placement.cells
    node = next(iter(nodes))
    return tuple(replace(cell, host_node=node) for cell in placement.cells)
