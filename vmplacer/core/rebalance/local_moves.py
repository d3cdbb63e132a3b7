"""Candidate moves within one host: a vCPU to another pCPU, two vCPUs swapped, a node's
vCPUs pooled or pinned back, a guest relocated to another NUMA node.

Each is a function of one what-if `HostLayout` and the plan's (draft, inputs);
`best_local` offers the host's best candidate, judged (core/rebalance/whatif.py). The
moves are scored in batches (`HostLayout.perf_moves_blind_many`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from vmplacer.core.rebalance.budget import layout_fits
from vmplacer.core.rebalance.draft import Draft, PlanInputs
from vmplacer.core.rebalance.layout import HostLayout, LayoutPieces, locality_nodes
from vmplacer.core.rebalance.state import EXCLUSIVE, PINNED, GuestState, RebalanceSettings
from vmplacer.core.rebalance.whatif import (
    EPS,
    CandidateMove,
    GuestChange,
    blind_base,
    blind_view,
    floors_ok,
    judge,
    may_pin,
    memory_fits,
    objective_of,
    violations,
)


@dataclass(frozen=True)
class LocalOffer:
    """A host's best local move, still to be picked from its contenders: the best by predicted
    gain and the best if nothing but time sharing and the topology were sure (one when they
    agree). Judged properly, the surer of them is the host's move (`move`). Judging tries both
    on the host, so the climb judges only the offers that could change its choice (`bound`)."""

    contenders: tuple[CandidateMove, ...]

    @property
    def bound(self) -> float:
        """The most the host's move can be sure of (`CandidateMove.sure_gain` counts at most all of
        an interference change that helps, none of one that hurts)."""
        return max(max(c.gain, c.linear_gain) for c in self.contenders)

    @property
    def most_gain(self) -> float:
        return max(c.gain for c in self.contenders)

    def move(self, draft: Draft, inputs: PlanInputs) -> CandidateMove:
        return max(self.contenders, key=lambda mv: (judge(draft, inputs, mv), mv.gain))


def local_offer(draft: Draft, inputs: PlanInputs, host: HostLayout) -> LocalOffer | None:
    """The host's offer: its candidate moves (single, swap, pool/unpool, relocate) searched, the
    two contenders kept; None when nothing on it may move or no move keeps the rules."""
    if not any(draft.guests[n].movable for n in host.guests):
        return None
    pieces = host.pieces()
    base, base_linear = host.perf(pieces, pieces.cpu)
    base_obj = float(objective_of(inputs, pieces, base)[0])
    base_lin = float(objective_of(inputs, pieces, base_linear)[0])
    current = base[0]
    moves: list[CandidateMove] = []
    order = _ranked_pieces(draft, host, pieces, current)
    moves.extend(_best_singles(draft, inputs, host, pieces, order[: inputs.settings.move_candidates], base_obj, base_lin))
    moves.extend(_best_swaps(draft, inputs, host, pieces, order[: inputs.settings.swap_candidates], base_obj, base_lin))
    moves.extend(_pool_moves(draft, inputs, host, base_obj, base_lin))
    moves.extend(_relocations(draft, inputs, host, base_obj, base_lin))
    if not moves:
        return None
    by_gain = max(moves, key=lambda mv: mv.gain)
    by_sure = max(moves, key=lambda mv: mv.quick_sure)
    return LocalOffer((by_gain,) if by_sure is by_gain else (by_gain, by_sure))


def _ranked_pieces(draft: Draft, host: HostLayout, pieces: LayoutPieces, current: np.ndarray) -> list[int]:
    """Movable single-pinned pieces, the most promising first: their guest's weighted
    shortfall plus how crowded their pCPU is (crowding hurts every guest there)."""
    if not len(pieces.cpu):
        return []
    crowd = np.bincount(pieces.cpu, weights=pieces.demand, minlength=len(host.cpus))
    result = []
    for p in range(len(pieces.cpu)):
        name = pieces.guests[pieces.vm[p]]
        guest = draft.guests[name]
        if not pieces.single[p] or guest.mode not in (PINNED, EXCLUSIVE):
            continue
        shortfall = pieces.weight[pieces.vm[p]] * (1.0 - current[pieces.vm[p]])
        result.append((shortfall + max(0.0, crowd[pieces.cpu[p]] - 1.0), p))
    result.sort(key=lambda item: (-item[0], item[1]))
    return [p for _, p in result]


def _quick_sure(inputs: PlanInputs, pieces: LayoutPieces, gain: np.ndarray, lin: np.ndarray, blind: LayoutPieces | None,
                blind_perf: np.ndarray | None, linear_obj: np.ndarray, blind_base: float) -> np.ndarray:
    """Per candidate: the sure gain if the model's own data counted for nothing — time
    sharing plus what both the model and the topology prior predict. The blind view's time
    sharing is the layout's own (same pieces, same shares): its linear objective is
    `linear_obj`, already summed."""
    if blind is None or blind_perf is None:
        return lin
    prior = objective_of(inputs, blind, blind_perf) - linear_obj - blind_base
    interference = gain - lin
    return lin + np.maximum(inputs.settings.guess_weight * interference, np.minimum(interference, prior))


def _best_singles(draft: Draft, inputs: PlanInputs, host: HostLayout, pieces: LayoutPieces, ms: list[int], base_obj: float,
                  base_lin: float) -> list[CandidateMove]:
    """Each piece of `ms` in turn: its best move to another allowed pCPU by predicted gain, and
    by quick sure gain (one move when they agree). All pieces' candidates are scored in one
    pass (`perf_moves_blind_many`: each piece's numbers as if scored alone)."""
    singles = []  # (piece, guest, vCPU, pCPU now, pCPUs it may move to)
    for m in ms:
        name = pieces.guests[pieces.vm[m]]
        vcpu = int(pieces.vcpu[m])
        here = host.cpus[pieces.cpu[m]]
        targets = sorted(host.allowed(name, vcpu) - {here})
        if targets:
            singles.append((m, name, vcpu, here, targets))
    if not singles:
        return []
    blocks, start = [], 0
    for single in singles:
        blocks.append((start, start + len(single[4])))
        start += len(single[4])
    moved = np.repeat(np.array([single[0] for single in singles], dtype=np.int64),
                      [len(single[4]) for single in singles])
    local = np.array([host.index[c] for single in singles for c in single[4]], dtype=np.int64)
    blind = blind_view(inputs, pieces)
    perf, linear, blind_perf = host.perf_moves_blind_many(pieces, blind, moved, local, blocks)
    gain = objective_of(inputs, pieces, perf) - base_obj
    linear_obj = objective_of(inputs, pieces, linear)
    lin = linear_obj - base_lin
    ok = floors_ok(draft, inputs, pieces, perf)
    quick = _quick_sure(inputs, pieces, gain, lin, blind, blind_perf, linear_obj, blind_base(inputs, host, pieces))
    moves = []
    for (m, name, vcpu, here, targets), (start, end) in zip(singles, blocks):
        moves.extend(_single_moves(host, name, vcpu, here, targets, gain[start:end], lin[start:end],
                                        quick[start:end], ok[start:end]))
    return moves


def _single_moves(host: HostLayout, name: str, vcpu: int, here: int, targets: list[int], gain: np.ndarray,
                  lin: np.ndarray, quick: np.ndarray, ok: np.ndarray) -> list[CandidateMove]:
    """One vCPU's best move by predicted gain and by quick sure gain (per target pCPU)."""
    moves: list[CandidateMove] = []
    for score in (gain, quick):
        score = np.where(ok, score, -np.inf)
        best = int(np.argmax(score))
        if not np.isfinite(score[best]) or any(mv.changes[0].pins[vcpu] == {targets[best]} for mv in moves):
            continue
        pins = dict(host.pins[name])
        pins[vcpu] = frozenset({targets[best]})
        moves.append(CandidateMove("move", [GuestChange(name, host.name, pins)], float(gain[best]), float(lin[best]),
                           reason=f"vCPU {vcpu} of {name}: pCPU {here} → {targets[best]}",
                           quick_sure=float(quick[best])))
    return moves


def _swappable(draft: Draft, pieces: LayoutPieces) -> np.ndarray:
    """Per piece: a vCPU pinned to one pCPU, of a pinned or exclusive guest (a swap partner)."""
    pinned = np.array([draft.guests[name].mode in (PINNED, EXCLUSIVE) for name in pieces.guests], dtype=bool)
    return pieces.single & pinned[pieces.vm]


def _best_swaps(draft: Draft, inputs: PlanInputs, host: HostLayout, pieces: LayoutPieces, ms: list[int],
                base_obj: float, base_lin: float) -> list[CandidateMove]:
    """Each piece of `ms` in turn: its best swaps with a piece of another guest on another pCPU,
    by predicted gain and by quick sure gain. All pieces' swaps are scored in one pass (each
    piece's rows as if scored alone: `HostLayout.perf` blocks)."""
    swappable = _swappable(draft, pieces)
    groups = []  # (piece, its partners): on another pCPU (so not m itself), of another guest
    for m in ms:
        partners = np.flatnonzero(swappable & (pieces.cpu != pieces.cpu[m]) & (pieces.vm != pieces.vm[m]))
        if len(partners):
            groups.append((m, partners))
    if not groups:
        return []
    blocks, start = [], 0
    for _, partners in groups:
        blocks.append((start, start + len(partners)))
        start += len(partners)
    cand = np.repeat(pieces.cpu[None, :], start, axis=0)
    for (m, partners), (begin, end) in zip(groups, blocks):
        rows = np.arange(begin, end)
        cand[rows, m] = pieces.cpu[partners]
        cand[rows, partners] = pieces.cpu[m]
    pairs = np.concatenate([np.stack([np.minimum(partners, m), np.maximum(partners, m)], axis=1)
                            for m, partners in groups])
    perf, linear = host.perf(pieces, cand, pairs, blocks)
    gain = objective_of(inputs, pieces, perf) - base_obj
    lin = objective_of(inputs, pieces, linear) - base_lin
    ok = floors_ok(draft, inputs, pieces, perf)
    # Under the topology prior every guest is alike, so a swap changes nothing there
    # (bar unequal loads): its zero-confidence value is time sharing and the guessed part.
    quick = lin + inputs.settings.guess_weight * np.maximum(gain - lin, 0.0) + np.minimum(gain - lin, 0.0)
    moves: list[CandidateMove] = []
    for (m, partners), (begin, end) in zip(groups, blocks):
        moves.extend(_swap_moves(draft, host, pieces, m, partners.tolist(), gain[begin:end], lin[begin:end],
                                 quick[begin:end], ok[begin:end]))
    return moves


def _swap_moves(draft: Draft, host: HostLayout, pieces: LayoutPieces, m: int, partners: list[int],
                gain: np.ndarray, lin: np.ndarray, quick: np.ndarray, ok: np.ndarray) -> list[CandidateMove]:
    """Piece m's best swap by predicted gain and by quick sure gain (per partner), among the four
    best of each that keep the rules."""
    name_m = pieces.guests[pieces.vm[m]]
    moves: list[CandidateMove] = []
    for score in (gain, quick):
        order = np.argsort(-np.where(ok, score, -np.inf), kind="stable")
        for index in order[:4]:
            if not ok[index] or score[index] <= 0:
                break
            n = partners[int(index)]
            name_n = pieces.guests[pieces.vm[n]]
            cpu_m, cpu_n = host.cpus[pieces.cpu[m]], host.cpus[pieces.cpu[n]]
            pins_m = dict(host.pins[name_m])
            pins_m[int(pieces.vcpu[m])] = frozenset({cpu_n})
            pins_n = dict(host.pins[name_n])
            pins_n[int(pieces.vcpu[n])] = frozenset({cpu_m})
            if not _valid_swap(draft, host, name_m, pins_m, name_n, pins_n):
                continue
            if not any(mv.changes[1].guest == name_n and mv.changes[0].pins == pins_m for mv in moves):
                moves.append(CandidateMove(
                    "swap", [GuestChange(name_m, host.name, pins_m), GuestChange(name_n, host.name, pins_n)],
                    float(gain[index]), float(lin[index]), quick_sure=float(quick[index]),
                    reason=f"swap pCPUs of {name_m} vCPU {int(pieces.vcpu[m])} ({cpu_m}) and "
                           f"{name_n} vCPU {int(pieces.vcpu[n])} ({cpu_n})"))
            break
    return moves


def _valid_swap(draft: Draft, host: HostLayout, a: str, pins_a: dict, b: str, pins_b: dict) -> bool:
    old_a, old_b = host.pins[a], host.pins[b]
    evaluated = host._pieces  # the layout's evaluation, valid again once the pins are back
    host.set_pins(a, pins_a)
    host.set_pins(b, pins_b)
    try:
        return not violations(draft, host, [a, b])
    finally:
        host.set_pins(a, old_a)
        host.set_pins(b, old_b, pieces=evaluated)


def _pool_moves(draft: Draft, inputs: PlanInputs, host: HostLayout, base_obj: float, base_lin: float) -> list[CandidateMove]:
    """Oversubscribed shareable vCPUs float over their node's pool; floating ones pin back 1:1."""
    moves = []
    nodes = sorted(host.node_cpus)
    for node in nodes:
        pool = (host.node_cpus[node] & host.usable) - host.owned_by_others(None)
        if not pool:
            continue
        members = [n for n, g in host.guests.items()
                   if g.mode == PINNED and all(len(p) == 1 and next(iter(p)) in pool for p in host.pins[n].values())]
        demand = sum(host.guests[n].load * len(host.pins[n]) for n in members)
        if len(members) >= 2 and demand > len(pool) + EPS:
            layout = dict(host.pins)
            for n in members:
                layout[n] = {v: frozenset(pool) for v in host.pins[n]}
            move = _evaluate_layout(draft, inputs, host, layout, members, "pool", base_obj, base_lin,
                                         f"{len(members)} guests asking {demand:.1f} pCPUs of node {node}'s "
                                         f"{len(pool)}: float them over the pool {_fmt(pool)}")
            if move:
                moves.append(move)
        floating = [n for n in host.guests
                    if may_pin(draft, inputs, n) and all(p and p <= pool for p in host.pins[n].values())]
        vcpus = sum(len(host.pins[n]) for n in floating)
        if floating and vcpus <= len(pool):
            free = _least_loaded(host, pool - host.pinned_by_others(None), set(floating))
            if len(free) >= vcpus:
                layout = dict(host.pins)
                it = iter(free)
                for n in floating:
                    layout[n] = {v: frozenset({next(it)}) for v in sorted(host.pins[n])}
                move = _evaluate_layout(draft, inputs, host, layout, floating, "unpool", base_obj, base_lin,
                                             f"pin floating guests {', '.join(floating)} 1:1 in node {node}")
                if move:
                    moves.append(move)
    return moves


def _evaluate_layout(draft: Draft, inputs: PlanInputs, host: HostLayout, layout: dict, members: list[str], kind: str, base_obj: float,
                     base_lin: float, reason: str) -> CandidateMove | None:
    if not layout_fits(layout, len(host.usable) or len(host.cpus), inputs.settings):
        refused = f"{kind} on host {host.name} ({reason}): over the memory budget, not evaluated"
        if refused not in draft.rejected:
            draft.rejected.append(refused)
        return None
    pieces = host.pieces(layout)
    perf, lin = host.perf(pieces, pieces.cpu)
    if not floors_ok(draft, inputs, pieces, perf)[0]:
        return None
    gain = float(objective_of(inputs, pieces, perf)[0]) - base_obj
    lin_gain = float(objective_of(inputs, pieces, lin)[0]) - base_lin
    return CandidateMove(kind, [GuestChange(n, host.name, dict(layout[n])) for n in members], gain, lin_gain, reason=reason)


def _relocations(draft: Draft, inputs: PlanInputs, host: HostLayout, base_obj: float, base_lin: float) -> list[CandidateMove]:
    """A guest whose vCPUs and memory live on one node moves, whole, to another node."""
    if len(host.node_cpus) < 2:
        return []
    moves = []
    ranked = sorted(host.guests, key=lambda n: (-draft.guests[n].weight * (1.0 - draft.perf_now.get(n, 1.0)), n))
    for name in ranked[: max(1, inputs.settings.swap_candidates)]:
        guest = host.guests[name]
        if guest.mode not in (PINNED, EXCLUSIVE) or len(guest.placement.cells) > 1:
            continue
        nodes = locality_nodes(host, guest, host.pins[name])
        if len(nodes) != 1:
            continue
        here = next(iter(nodes))
        for node in sorted(host.node_cpus):
            if node == here:
                continue
            move = place_on(draft, inputs, host, name, node=node, base_obj=base_obj, base_lin=base_lin)
            if move is None:
                continue
            cost = _memory_move_cost(guest, inputs.settings)
            move.gain -= guest.weight * cost / inputs.settings.horizon_s
            move.cost = {"memory_move_s": guest.placement.memory_kib / 1024 / inputs.settings.memory_move_mib_s,
                         "lost_perf_s": cost}
            move.kind = "relocate"
            move.changes[0].memory_nodes = frozenset({node})
            move.reason = f"{name}: vCPUs and memory from node {here} to node {node}"
            if memory_fits(draft, host, name, frozenset({node})):
                moves.append(move)
    return moves


def place_on(draft: Draft, inputs: PlanInputs, host: HostLayout, name: str, *, node: int | None, base_obj: float,
             base_lin: float, guest: GuestState | None = None) -> CandidateMove | None:
    """Greedy: the guest's vCPUs, one after another, each on the pCPU that gains most.

    `host` may not hold the guest yet (a migration's destination): it is
    added for the evaluation and removed again. Guests that keep their
    memory on chosen nodes keep all their vCPUs in the first vCPU's node.
    """
    guest = guest or draft.guests[name]
    visiting = name not in host.guests
    old_pins = None if visiting else host.pins[name]
    keeps_node = bool(guest.placement.memory_nodes or guest.placement.cells)
    if visiting:
        host.add(replace(guest, host=host.name, placement=replace(guest.placement, host=host.name)), {})
    try:
        pins: dict[int, frozenset[int]] = {}
        for vcpu in sorted(guest.placement.vcpupin):
            host.set_pins(name, dict(pins))
            if node is None and visiting:
                targets = sorted(host.allowed(name, vcpu, ignore_locality=True))
            else:
                targets = sorted(host.allowed(name, vcpu, node))
            if not targets:
                return None
            host.set_pins(name, {**pins, vcpu: frozenset({targets[0]})})
            pieces = host.pieces()
            piece = int(np.flatnonzero((pieces.vm == pieces.guests.index(name)) & (pieces.vcpu == vcpu))[0])
            cand = np.repeat(pieces.cpu[None, :], len(targets), axis=0)
            cand[:, piece] = [host.index[c] for c in targets]
            values = objective_of(inputs, pieces, host.perf_moves(pieces, piece, cand[:, piece])[0])
            best = targets[int(np.argmax(values))]
            pins[vcpu] = frozenset({best})
            if keeps_node and node is None:
                node = host.node_of[best]
        host.set_pins(name, pins)
        pieces = host.pieces()
        perf, linear = host.perf(pieces, pieces.cpu)
        if not floors_ok(draft, inputs, pieces, perf)[0]:
            return None
        gain = float(objective_of(inputs, pieces, perf)[0]) - base_obj
        lin = float(objective_of(inputs, pieces, linear)[0]) - base_lin
        return CandidateMove("move", [GuestChange(name, host.name, pins)], gain, lin)
    finally:
        if visiting:
            host.remove(name)
        else:
            host.set_pins(name, old_pins)


def _least_loaded(host: HostLayout, cpus: set[int], leaving: set[str]) -> list[int]:
    """`cpus` by how much of them the guests not in `leaving` ask for, then by their core's load."""
    load: dict[int, float] = {}
    for name, pins in host.pins.items():
        if name in leaving:
            continue
        for allowed in pins.values():
            for c in allowed:
                load[c] = load.get(c, 0.0) + host.guests[name].load / len(allowed)
    core_of = {c: host.topology.cpus[c].core for c in host.cpus}
    core_load: dict[int, float] = {}
    for c, value in load.items():
        core_load[core_of[c]] = core_load.get(core_of[c], 0.0) + value
    return sorted(cpus, key=lambda c: (load.get(c, 0.0), core_load.get(core_of[c], 0.0), c))


def _memory_move_cost(guest: GuestState, settings: RebalanceSettings) -> float:
    seconds = guest.placement.memory_kib / 1024.0 / settings.memory_move_mib_s
    return settings.copy_slowdown * seconds


def _fmt(cpus: Iterable[int]) -> str:
    from vmplacer.core.topology.cpuset import format_cpuset

    return format_cpuset(cpus)
