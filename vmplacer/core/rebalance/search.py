"""The rebalance policy's local search: candidate moves, the rules they keep, the loop.

Steepest ascent on what-if host layouts (`rebalance/layout`): each round every
host offers its best local move (move, swap, pool/unpool, relocate) and the
cluster its best migration; the best one that clears the hysteresis and fits
the action budget is applied to the what-if copy. The search only records
moves; `rebalance/actions` turns them into a plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from vmplacer.core.placement.allocate import allocate
from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.rebalance.layout_problem import LayoutProblem, LayoutSolution, LayoutSolver
from vmplacer.core.rebalance.migration_cost import migration_cost
from vmplacer.core.placement.nofit import NoFit
from vmplacer.core.placement.occupancy import HostUsage, memory_by_node
from vmplacer.core.placement.guest_placement import GuestCell, Placement
from vmplacer.core.stage_times import NO_STAGE_TIMES, StageTimes
from vmplacer.core.text import plural
from vmplacer.core.rebalance.draft import NO_HISTORY, Draft, RunHistory, Stage
from vmplacer.core.rebalance.exact import NotExact, layout_changes, solve_hosts, solved_layout
from vmplacer.core.rebalance.layout import (
    BetaTable,
    HostLayout,
    _host_confidences,
    _locality_nodes,
    LayoutPieces,
    utility,
)
from vmplacer.core.rebalance.state import (
    EXCLUSIVE,
    FIXED,
    FLOATING,
    PINNED,
    ClusterState,
    GuestState,
    RebalanceSettings,
)

_EPS = 1e-9


# --------------------------------------------------------------------------- moves
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


# --------------------------------------------------------------------------- the search
class RebalanceSearch:
    def __init__(self, state: ClusterState, model: InterferenceModel, settings: RebalanceSettings,
                 now: float | None, last_moved: Mapping[str, float], scope: Iterable[str] | None,
                 solver: LayoutSolver | None = None, optimism: float = 0.0, history: RunHistory = NO_HISTORY):
        self.state = state
        self.solver = solver
        self.times: StageTimes = NO_STAGE_TIMES  # where the planning time goes (set by plan_rebalance)
        self.draft = Draft()  # what the stages decide (core/rebalance/draft.py)
        self.history = history  # what earlier runs measured and did; read-only (core/rebalance/draft.py)
        self.model = model
        self.settings = settings
        self.betas = BetaTable(model, optimism)
        self.hosts = {name: HostLayout(host, self.betas) for name, host in state.hosts.items()}
        self.guests: dict[str, GuestState] = {}
        scope_set = set(scope) if scope is not None else None
        for guest in state.guests.values():
            if guest.mode != FIXED:
                why = ""
                if scope_set is not None and guest.name not in scope_set:
                    why = "outside the rebalancing scope"
                elif now is not None and guest.name in last_moved and now - last_moved[guest.name] < settings.cooldown_s:
                    why = f"moved {now - last_moved[guest.name]:.0f} s ago (cool-down {settings.cooldown_s:g} s)"
                if why:
                    guest = guest.fixed(why)
            self.guests[guest.name] = guest
            self.hosts[guest.host].add(guest, guest.placement.vcpupin)
        self.host_of = {g.name: g.host for g in self.guests.values()}
        self.refused_by: dict[str, set[str]] = {}
        for guest in self.guests.values():
            for peer in guest.anti_affinity:
                self.refused_by.setdefault(peer, set()).add(guest.name)
        self.memory_nodes = {g.name: g.placement.memory_nodes for g in self.guests.values()}
        # guest -> (guest state, host, pins, memory nodes, placement): `_current_placement`, kept
        self._placements: dict[str, tuple[GuestState, str, Mapping[int, frozenset[int]], object, Placement]] = {}
        self.original = {g.name: g for g in self.guests.values()}
        self.start_perf = self.perf_by_guest()
        # host -> (its guests and pins, their confidences): `host_confidences`, kept
        self._confidences: dict[str, tuple[tuple, dict[str, float]]] = {}
        self.floors: dict[str, float] = {}
        for guest in self.guests.values():
            if guest.floor is not None:
                self.floors[guest.name] = guest.floor
            elif guest.protected:
                self.floors[guest.name] = self.start_perf.get(guest.name, 0.0)
        self.perf_now = dict(self.start_perf)
        self.moves: list[CandidateMove] = []
        self.touched: set[str] = set()
        self.migrated: dict[str, str] = {}  # guest -> original host
        self.memory_moved: set[str] = set()

    # ----- evaluation helpers -------------------------------------------------------------------------
    @property
    def confidence(self) -> dict[str, float]:
        """Each guest's confidence (`_host_confidences`) in the what-if layout as it is now."""
        result: dict[str, float] = {}
        for host in self.hosts.values():
            result.update(self.host_confidences(host))
        return result

    def guest_confidence(self, name: str, default: float = 0.0) -> float:
        """`confidence` of one guest: only its host's is computed (a plan needs the moved guests')."""
        return self.host_confidences(self.hosts[self.host_of[name]]).get(name, default)

    def host_confidences(self, host: HostLayout) -> dict[str, float]:
        """`_host_confidences` of the host as it is, kept while its guests and pins are the same:
        the plan asks again for every host at the end, and most hosts are as they were."""
        state = (tuple(host.guests.values()),
                 tuple((name, tuple(sorted(pins.items()))) for name, pins in host.pins.items()))
        kept = self._confidences.get(host.name)
        if kept is not None and kept[0] == state:
            return kept[1]
        found = _host_confidences(host, self.model, self.betas)
        self._confidences[host.name] = (state, found)
        return found

    def perf_by_guest(self) -> dict[str, float]:
        result: dict[str, float] = {}
        for host in self.hosts.values():
            result.update(self.host_perf(host))
        return result

    @staticmethod
    def host_perf(host: HostLayout) -> dict[str, float]:
        """Each guest's predicted performance on `host` as it is laid out now."""
        if not host.guests:
            return {}
        pieces = host.pieces()
        values = host.perf(pieces, pieces.cpu)[0][0]
        return {name: float(values[i]) for i, name in enumerate(pieces.guests)}

    def objective_of(self, pieces: LayoutPieces, perf: np.ndarray) -> np.ndarray:
        return (utility(perf, self.settings.fairness) * pieces.weight[None, :]).sum(axis=1)

    def host_objective(self, host: HostLayout) -> float:
        if not host.guests:
            return 0.0
        pieces = host.pieces()
        return float(self.objective_of(pieces, host.perf(pieces, pieces.cpu)[0])[0])

    def total_objective(self) -> float:
        return sum(self.host_objective(h) for h in self.hosts.values())

    def floors_ok(self, pieces: LayoutPieces, perf: np.ndarray) -> np.ndarray:
        """Per candidate: no protected guest pushed below min(its floor, where it is now)."""
        ok = np.ones(perf.shape[0], dtype=bool)
        if not self.floors:
            return ok
        for index, name in enumerate(pieces.guests):
            floor = self.floors.get(name)
            if floor is None:
                continue
            now = self.perf_now.get(name, floor)
            ok &= perf[:, index] >= min(floor, now) - 1e-6
        return ok

    def movable(self, name: str) -> bool:
        return self.guests[name].movable

    def may_pin(self, name: str) -> bool:
        """A floating guest whose vCPUs the search may pin 1:1 again: vmplacer floated it (in this
        search, or an earlier plan's pool that nobody has changed since), or the settings allow
        pinning floating guests. A guest whose flavor asks for shared vCPUs keeps floating."""
        guest = self.guests[name]
        return (guest.mode == FLOATING and guest.spec is None and guest.movable
                and (self.settings.pin_floating_guests or name in self.history.pooled
                     or self.original[name].mode == PINNED))

    # ----- candidate moves on one host -----------------------------------------------------------
    def best_local(self, host: HostLayout) -> CandidateMove | None:
        if not any(self.movable(n) for n in host.guests):
            return None
        pieces = host.pieces()
        base, base_linear = host.perf(pieces, pieces.cpu)
        base_obj = float(self.objective_of(pieces, base)[0])
        base_lin = float(self.objective_of(pieces, base_linear)[0])
        current = base[0]
        moves: list[CandidateMove] = []
        order = self._ranked_pieces(host, pieces, current)
        moves.extend(self._best_singles(host, pieces, order[: self.settings.move_candidates], base_obj, base_lin))
        swappable = self._swappable(pieces)
        for m in order[: self.settings.swap_candidates]:
            moves.extend(self._best_swap(host, pieces, m, base_obj, base_lin, swappable))
        moves.extend(self._pool_moves(host, base_obj, base_lin))
        moves.extend(self._relocations(host, base_obj, base_lin))
        if not moves:
            return None
        # The best by predicted gain and the best if nothing but time sharing and the
        # topology were sure: judged properly, the surer of them is the host's candidate.
        by_gain = max(moves, key=lambda mv: mv.gain)
        by_sure = max(moves, key=lambda mv: mv.quick_sure)
        return max({id(by_gain): by_gain, id(by_sure): by_sure}.values(), key=lambda mv: (self._judge(mv), mv.gain))

    def _ranked_pieces(self, host: HostLayout, pieces: LayoutPieces, current: np.ndarray) -> list[int]:
        """Movable single-pinned pieces, the most promising first: their guest's weighted
        shortfall plus how crowded their pCPU is (crowding hurts every guest there)."""
        if not len(pieces.cpu):
            return []
        crowd = np.bincount(pieces.cpu, weights=pieces.demand, minlength=len(host.cpus))
        result = []
        for p in range(len(pieces.cpu)):
            name = pieces.guests[pieces.vm[p]]
            guest = self.guests[name]
            if not pieces.single[p] or guest.mode not in (PINNED, EXCLUSIVE):
                continue
            shortfall = pieces.weight[pieces.vm[p]] * (1.0 - current[pieces.vm[p]])
            result.append((shortfall + max(0.0, crowd[pieces.cpu[p]] - 1.0), p))
        result.sort(key=lambda item: (-item[0], item[1]))
        return [p for _, p in result]

    def _blind(self, pieces: LayoutPieces) -> LayoutPieces | None:
        """The same layout seen through the topology prior (every guest alike), cached."""
        if self.betas.prior is None:
            return None
        if pieces.blind is None:
            parent = None
            if pieces.parent is not None and pieces.parent[0].blind is not None:
                parent = (pieces.parent[0].blind, pieces.parent[1])  # its matrix, updated likewise
            pieces.blind = replace(pieces, key=np.zeros_like(pieces.key), table=self.betas.prior, matrix=None,
                                   current=None, blind=None, terms=None, spread=None,
                                   load=None, blind_base=None, slots=None, parent=parent, piece_keys=None)
        return pieces.blind

    def _quick_sure(self, pieces: LayoutPieces, gain: np.ndarray, lin: np.ndarray, blind: LayoutPieces | None,
                    blind_perf: np.ndarray | None, linear_obj: np.ndarray, blind_base: float) -> np.ndarray:
        """Per candidate: the sure gain if the model's own data counted for nothing — time
        sharing plus what both the model and the topology prior predict. The blind view's time
        sharing is the layout's own (same pieces, same shares): its linear objective is
        `linear_obj`, already summed."""
        if blind is None or blind_perf is None:
            return lin
        prior = self.objective_of(blind, blind_perf) - linear_obj - blind_base
        interference = gain - lin
        return lin + np.maximum(self.settings.guess_weight * interference, np.minimum(interference, prior))

    def _blind_base(self, host: HostLayout, pieces: LayoutPieces) -> float:
        """The layout's objective under the topology prior minus time sharing alone (cached: every
        single move judged from the layout subtracts it)."""
        if pieces.blind_base is None:
            blind = self._blind(pieces)
            if blind is None:
                return 0.0
            perf, linear = host.perf(blind, blind.cpu)
            pieces.blind_base = float(self.objective_of(blind, perf)[0] - self.objective_of(blind, linear)[0])
        return pieces.blind_base

    def _best_singles(self, host: HostLayout, pieces: LayoutPieces, ms: list[int], base_obj: float,
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
        blind = self._blind(pieces)
        perf, linear, blind_perf = host.perf_moves_blind_many(pieces, blind, moved, local, blocks)
        gain = self.objective_of(pieces, perf) - base_obj
        linear_obj = self.objective_of(pieces, linear)
        lin = linear_obj - base_lin
        ok = self.floors_ok(pieces, perf)
        quick = self._quick_sure(pieces, gain, lin, blind, blind_perf, linear_obj, self._blind_base(host, pieces))
        moves = []
        for (m, name, vcpu, here, targets), (start, end) in zip(singles, blocks):
            moves.extend(self._single_moves(host, name, vcpu, here, targets, gain[start:end], lin[start:end],
                                            quick[start:end], ok[start:end]))
        return moves

    @staticmethod
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

    def _swappable(self, pieces: LayoutPieces) -> np.ndarray:
        """Per piece: a vCPU pinned to one pCPU, of a pinned or exclusive guest (a swap partner)."""
        pinned = np.array([self.guests[name].mode in (PINNED, EXCLUSIVE) for name in pieces.guests], dtype=bool)
        return pieces.single & pinned[pieces.vm]

    def _best_swap(self, host: HostLayout, pieces: LayoutPieces, m: int, base_obj: float, base_lin: float,
                   swappable: np.ndarray | None = None) -> list[CandidateMove]:
        name_m = pieces.guests[pieces.vm[m]]
        if swappable is None:
            swappable = self._swappable(pieces)
        # on another pCPU (so not m itself), of another guest
        partners = np.flatnonzero(swappable & (pieces.cpu != pieces.cpu[m]) & (pieces.vm != pieces.vm[m]))
        if not len(partners):
            return []
        cand = np.repeat(pieces.cpu[None, :], len(partners), axis=0)
        rows = np.arange(len(partners))
        cand[rows, m] = pieces.cpu[partners]
        cand[rows, partners] = pieces.cpu[m]
        pairs = np.stack([np.minimum(partners, m), np.maximum(partners, m)], axis=1)
        perf, linear = host.perf(pieces, cand, pairs)
        gain = self.objective_of(pieces, perf) - base_obj
        lin = self.objective_of(pieces, linear) - base_lin
        ok = self.floors_ok(pieces, perf)
        partners = partners.tolist()
        # Under the topology prior every guest is alike, so a swap changes nothing there
        # (bar unequal loads): its zero-confidence value is time sharing and the guessed part.
        quick = lin + self.settings.guess_weight * np.maximum(gain - lin, 0.0) + np.minimum(gain - lin, 0.0)
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
                if not self._valid_swap(host, name_m, pins_m, name_n, pins_n):
                    continue
                if not any(mv.changes[1].guest == name_n and mv.changes[0].pins == pins_m for mv in moves):
                    moves.append(CandidateMove(
                        "swap", [GuestChange(name_m, host.name, pins_m), GuestChange(name_n, host.name, pins_n)],
                        float(gain[index]), float(lin[index]), quick_sure=float(quick[index]),
                        reason=f"swap pCPUs of {name_m} vCPU {int(pieces.vcpu[m])} ({cpu_m}) and "
                               f"{name_n} vCPU {int(pieces.vcpu[n])} ({cpu_n})"))
                break
        return moves

    def _valid_swap(self, host: HostLayout, a: str, pins_a: dict, b: str, pins_b: dict) -> bool:
        old_a, old_b = host.pins[a], host.pins[b]
        evaluated = host._pieces  # the layout's evaluation, valid again once the pins are back
        host.set_pins(a, pins_a)
        host.set_pins(b, pins_b)
        try:
            return not self.violations(host, [a, b])
        finally:
            host.set_pins(a, old_a)
            host.set_pins(b, old_b, pieces=evaluated)

    def _pool_moves(self, host: HostLayout, base_obj: float, base_lin: float) -> list[CandidateMove]:
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
            if len(members) >= 2 and demand > len(pool) + _EPS:
                layout = dict(host.pins)
                for n in members:
                    layout[n] = {v: frozenset(pool) for v in host.pins[n]}
                move = self._evaluate_layout(host, layout, members, "pool", base_obj, base_lin,
                                             f"{len(members)} guests asking {demand:.1f} pCPUs of node {node}'s "
                                             f"{len(pool)}: float them over the pool {_fmt(pool)}")
                if move:
                    moves.append(move)
            floating = [n for n in host.guests
                        if self.may_pin(n) and all(p and p <= pool for p in host.pins[n].values())]
            vcpus = sum(len(host.pins[n]) for n in floating)
            if floating and vcpus <= len(pool):
                free = _least_loaded(host, pool - host.pinned_by_others(None), set(floating))
                if len(free) >= vcpus:
                    layout = dict(host.pins)
                    it = iter(free)
                    for n in floating:
                        layout[n] = {v: frozenset({next(it)}) for v in sorted(host.pins[n])}
                    move = self._evaluate_layout(host, layout, floating, "unpool", base_obj, base_lin,
                                                 f"pin floating guests {', '.join(floating)} 1:1 in node {node}")
                    if move:
                        moves.append(move)
        return moves

    def _evaluate_layout(self, host: HostLayout, layout: dict, members: list[str], kind: str, base_obj: float,
                         base_lin: float, reason: str) -> CandidateMove | None:
        pieces = host.pieces(layout)
        perf, lin = host.perf(pieces, pieces.cpu)
        if not self.floors_ok(pieces, perf)[0]:
            return None
        gain = float(self.objective_of(pieces, perf)[0]) - base_obj
        lin_gain = float(self.objective_of(pieces, lin)[0]) - base_lin
        return CandidateMove(kind, [GuestChange(n, host.name, dict(layout[n])) for n in members], gain, lin_gain, reason=reason)

    def _relocations(self, host: HostLayout, base_obj: float, base_lin: float) -> list[CandidateMove]:
        """A guest whose vCPUs and memory live on one node moves, whole, to another node."""
        if len(host.node_cpus) < 2:
            return []
        moves = []
        ranked = sorted(host.guests, key=lambda n: (-self.guests[n].weight * (1.0 - self.perf_now.get(n, 1.0)), n))
        for name in ranked[: max(1, self.settings.swap_candidates)]:
            guest = host.guests[name]
            if guest.mode not in (PINNED, EXCLUSIVE) or len(guest.placement.cells) > 1:
                continue
            nodes = _locality_nodes(host, guest, host.pins[name])
            if len(nodes) != 1:
                continue
            here = next(iter(nodes))
            for node in sorted(host.node_cpus):
                if node == here:
                    continue
                move = self._place_on(host, name, node=node, base_obj=base_obj, base_lin=base_lin)
                if move is None:
                    continue
                cost = _memory_move_cost(guest, self.settings)
                move.gain -= guest.weight * cost / self.settings.horizon_s
                move.cost = {"memory_move_s": guest.placement.memory_kib / 1024 / self.settings.memory_move_mib_s,
                             "lost_perf_s": cost}
                move.kind = "relocate"
                move.changes[0].memory_nodes = frozenset({node})
                move.reason = f"{name}: vCPUs and memory from node {here} to node {node}"
                if self._memory_fits(host, name, frozenset({node})):
                    moves.append(move)
        return moves

    def _place_on(self, host: HostLayout, name: str, *, node: int | None, base_obj: float,
                  base_lin: float, guest: GuestState | None = None) -> CandidateMove | None:
        """Greedy: the guest's vCPUs, one after another, each on the pCPU that gains most.

        `host` may not hold the guest yet (a migration's destination): it is
        added for the evaluation and removed again. Guests that keep their
        memory on chosen nodes keep all their vCPUs in the first vCPU's node.
        """
        guest = guest or self.guests[name]
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
                values = self.objective_of(pieces, host.perf_moves(pieces, piece, cand[:, piece])[0])
                best = targets[int(np.argmax(values))]
                pins[vcpu] = frozenset({best})
                if keeps_node and node is None:
                    node = host.node_of[best]
            host.set_pins(name, pins)
            pieces = host.pieces()
            perf, linear = host.perf(pieces, pieces.cpu)
            if not self.floors_ok(pieces, perf)[0]:
                return None
            gain = float(self.objective_of(pieces, perf)[0]) - base_obj
            lin = float(self.objective_of(pieces, linear)[0]) - base_lin
            return CandidateMove("move", [GuestChange(name, host.name, pins)], gain, lin)
        finally:
            if visiting:
                host.remove(name)
            else:
                host.set_pins(name, old_pins)

    # ----- migrations ------------------------------------------------------------------------------------
    def best_migration(self) -> CandidateMove | None:
        settings = self.settings
        if not settings.allow_migration or len(self.hosts) < 2:
            return None
        perf = self.perf_by_guest()
        candidates = sorted(
            (g for g in self.guests.values()
             if g.movable and g.migratable and g.name not in self.migrated and g.name in perf),
            key=lambda g: (-g.weight * (1.0 - perf[g.name]), g.name),
        )[: settings.migration_candidates]
        best: CandidateMove | None = None
        spare = {name: _spare(h) for name, h in self.hosts.items()}
        for guest in candidates:
            if guest.weight * (1.0 - perf[guest.name]) <= settings.min_migration_gain / 2:
                continue
            source = self.hosts[self.host_of[guest.name]]
            destinations = sorted(
                (h for h in self.hosts.values() if h is not source and h.state.accepts_migrations),
                key=lambda h: (-spare[h.name], h.name),
            )[: settings.destination_candidates]
            for destination in destinations:
                move = self._migration(guest, source, destination)
                if move and (best is None or move.gain > best.gain):
                    best = move
        return best

    def _visit(self, destination: HostLayout, visitor: GuestState,
               pins: Mapping[int, frozenset[int]]) -> tuple[float, float] | None:
        """The destination's objective and linear objective with `visitor` pinned there as `pins`,
        or None when a guest's floor would break; the destination is left as it was."""
        destination.add(visitor, pins)
        try:
            pieces = destination.pieces()
            perf = destination.perf(pieces, pieces.cpu)[0]
            if not self.floors_ok(pieces, perf)[0]:
                return None
            return float(self.objective_of(pieces, perf)[0]), self._linear_objective(destination)
        finally:
            destination.remove(visitor.name)

    def _migration(self, guest: GuestState, source: HostLayout, destination: HostLayout) -> CandidateMove | None:
        name = guest.name
        src_before = self.host_objective(source)
        src_lin_before = self._linear_objective(source)
        dst_before = self.host_objective(destination)
        dst_lin_before = self._linear_objective(destination)
        pins_here = source.pins[name]
        source.remove(name)
        try:
            src_after = self.host_objective(source)
            src_lin_after = self._linear_objective(source)
            src_ok = self._floors_hold(source)
        finally:
            source.add(guest, pins_here)
        if not src_ok:
            return None
        visitor = replace(guest, host=destination.name, placement=replace(guest.placement, host=destination.name))
        placement = None
        if guest.spec is not None:
            placement = self._engine_placement(destination, visitor)
            if placement is None:
                return None
            pins = dict(placement.vcpupin)
            scored = self._visit(destination, visitor, pins)
            if scored is None:
                return None
            dst_after, dst_lin_after = scored
        elif guest.mode == FLOATING:
            pool = frozenset(destination.usable - destination.owned_by_others(None))
            if not pool:
                return None
            pins = {v: pool for v in guest.placement.vcpupin}
            if not self._anti_affinity_ok(destination, guest, frozenset(destination.node_of[c] for c in pool)):
                return None
            scored = self._visit(destination, visitor, pins)
            if scored is None:
                return None
            dst_after, dst_lin_after = scored
        else:
            move = self._place_on(destination, name, node=None, base_obj=dst_before, base_lin=dst_lin_before,
                                  guest=visitor)
            if move is None:
                return None
            pins = move.changes[0].pins
            dst_after = dst_before + move.gain
            dst_lin_after = dst_lin_before + move.linear_gain
        memory_nodes = self._destination_memory_nodes(destination, guest, pins, placement)
        if memory_nodes is None:
            return None
        # Anti-affinity is per NUMA node: the engine and `allowed` kept the vCPUs off the
        # peers' nodes; the memory must stay off them too.
        used_nodes = frozenset(destination.node_of[c] for cpus in pins.values() for c in cpus)
        if not self._anti_affinity_ok(destination, guest, used_nodes | memory_nodes):
            return None
        settings = self.settings
        cost = migration_cost(
            guest.placement.memory_kib / 1024.0,
            guest.dirty_mib_s if guest.dirty_mib_s is not None else settings.default_dirty_mib_s,
            settings.migration_bandwidth_mib_s,
            max_downtime_s=settings.max_downtime_s,
            copy_slowdown=settings.copy_slowdown,
        )
        if not cost.converges:
            self.draft.rejected.append(f"migrate {name} to {destination.name}: {cost.reason}")
            return None
        raw = (src_after - src_before) + (dst_after - dst_before)
        lin = (src_lin_after - src_lin_before) + (dst_lin_after - dst_lin_before)
        paid = guest.weight * cost.lost_perf_s / settings.horizon_s
        change = GuestChange(name, destination.name, pins, memory_nodes=memory_nodes, placement=placement)
        return CandidateMove("migrate", [change], raw - paid, lin - paid, cost={**cost.to_dict(), "paid": paid},
                     reason=f"{name}: {source.name} → {destination.name}, predicted +{raw:.3f} "
                            f"(cost {paid:.4f} over {settings.horizon_s:g} s)")

    def _linear_objective(self, host: HostLayout) -> float:
        if not host.guests:
            return 0.0
        pieces = host.pieces()
        return float(self.objective_of(pieces, host.perf(pieces, pieces.cpu)[1])[0])

    def _floors_hold(self, host: HostLayout) -> bool:
        if not host.guests:
            return True
        pieces = host.pieces()
        return bool(self.floors_ok(pieces, host.perf(pieces, pieces.cpu)[0])[0])

    def _engine_placement(self, destination: HostLayout, guest: GuestState) -> Placement | None:
        """Where the placement engine would put a guest vmplacer placed (all its rules apply)."""
        assert guest.spec is not None
        others = [self._current_placement(n) for n in destination.guests]
        anti = {n: self.guests[n].anti_affinity for n in destination.guests if self.guests[n].anti_affinity}
        try:
            return allocate(destination.topology, guest.spec, others, options=destination.state.options,
                            anti_affinity_of_others=anti)
        except NoFit:
            return None

    def _destination_memory_nodes(self, destination: HostLayout, guest: GuestState, pins: Mapping[int, frozenset[int]],
                                  placement: Placement | None) -> frozenset[int] | None:
        """Memory nodes on the destination: the engine's, else the nodes of the new pCPUs (when the
        guest pinned its memory), else unchanged; None when the memory does not fit."""
        if placement is not None:
            return placement.memory_nodes
        if guest.placement.memory_nodes or guest.placement.cells:
            nodes = frozenset(destination.node_of[c] for cpus in pins.values() for c in cpus)
        else:
            nodes = frozenset()
        visitor = self._current_placement(guest.name)
        visitor = replace(visitor, host=destination.name, vcpupin=dict(pins), memory_nodes=nodes, cells=())
        usage = HostUsage.build(destination.topology, [self._current_placement(n) for n in destination.guests])
        for node, kib in memory_by_node(destination.topology, visitor).items():
            page = visitor.hugepage_kib
            if page and page > 4:
                if usage.huge_free_pages(node, page) < -(-kib // page):
                    return None
            elif usage.small_free_kib(node, destination.reserved_kib) < kib:
                return None
        return nodes

    def _memory_fits(self, host: HostLayout, name: str, nodes: frozenset[int]) -> bool:
        others = [self._current_placement(n) for n in host.guests if n != name]
        usage = HostUsage.build(host.topology, others)
        need = self._current_placement(name).memory_kib
        free = sum(usage.small_free_kib(n, host.reserved_kib) for n in nodes if n in host.topology.nodes)
        return free >= need

    def _anti_affinity_ok(self, host: HostLayout, guest: GuestState, nodes: frozenset[int] | None) -> bool:
        peers = set(guest.anti_affinity) | self.refused_by.get(guest.name, set())
        present = peers & set(host.guests)
        if not present:
            return True
        if nodes is None:
            return False  # nodes not known: refuse
        for peer in present:
            peer_nodes = {host.node_of[c] for cpus in host.pins[peer].values() for c in cpus}
            if peer_nodes & nodes:
                return False
        return True

    # ----- rules ------------------------------------------------------------------------------------------
    def violations(self, host: HostLayout, names: Iterable[str]) -> list[str]:
        """Rules of the placement engine the layout breaks for `names` (empty: none)."""
        problems = []
        for name in names:
            guest = self.guests[name]
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

    # ----- applying moves --------------------------------------------------------------------------------
    def _current_placement(self, name: str) -> Placement:
        """The guest's placement as the what-if state has it (kept while its guest state, host,
        pins and memory nodes are the very ones it was made from: destinations ask for every
        guest's placement on every host they weigh)."""
        guest = self.guests[name]
        host = self.hosts[self.host_of[name]]
        pins = host.pins[name]
        memory = self.memory_nodes.get(name)
        kept = self._placements.get(name)
        if kept is not None and kept[0] is guest and kept[1] == host.name and kept[2] is pins and kept[3] == memory:
            return kept[4]
        old = guest.placement
        placement = replace(old, host=host.name, vcpupin=dict(pins))
        if memory is not None:
            placement = replace(placement, memory_nodes=memory)
        self._placements[name] = (guest, host.name, pins, memory, placement)
        return placement

    def apply(self, move: CandidateMove) -> None:
        for change in move.changes:
            name = change.guest
            old_host = self.hosts[self.host_of[name]]
            guest = self.guests[name]
            if change.host != old_host.name:
                old_host.remove(name)
                self.migrated.setdefault(name, guest.host)
                base = change.placement or replace(guest.placement, host=change.host)
                guest = replace(guest, host=change.host, placement=replace(base, host=change.host))
                self.guests[name] = guest
                self.hosts[change.host].add(guest, change.pins)
                self.host_of[name] = change.host
                if change.memory_nodes is not None:
                    self.memory_nodes[name] = change.memory_nodes
            else:
                old_host.set_pins(name, change.pins)
                if change.memory_nodes is not None:
                    self.memory_nodes[name] = change.memory_nodes
                    self.memory_moved.add(name)
                    # later moves keep its vCPUs where its memory now is
                    placement = replace(guest.placement, memory_nodes=change.memory_nodes,
                                        cells=_relocated_cells(guest.placement, change.memory_nodes))
                    self.guests[name] = replace(guest, placement=placement)
                    old_host.guests[name] = self.guests[name]
            if move.kind == "pool":
                self.guests[name] = replace(self.guests[name], mode=FLOATING)
                self.hosts[self.host_of[name]].guests[name] = self.guests[name]
            elif self.may_pin(name) and all(len(p) == 1 for p in change.pins.values()):
                self.guests[name] = replace(self.guests[name], mode=PINNED)
                self.hosts[self.host_of[name]].guests[name] = self.guests[name]
            self.touched.add(name)
        self.moves.append(move)

    @staticmethod
    def new_move(kind: str, changes: Iterable[tuple[str, str, dict[int, frozenset[int]]]]) -> CandidateMove:
        """A move of (guest, host, pins) changes, its gains still to be computed."""
        return CandidateMove(kind, [GuestChange(g, h, dict(p)) for g, h, p in changes], 0.0, 0.0)

    def actions_if(self, move: CandidateMove) -> int:
        touched = self.touched | {c.guest for c in move.changes}
        migrated = set(self.migrated) | {c.guest for c in move.changes if c.host != self.host_of[c.guest]}
        memory = self.memory_moved | ({c.guest for c in move.changes} if move.kind == "relocate" else set())
        return len(touched) + len(migrated) + len(memory)

    def run(self, stages: Iterable[Stage]) -> None:
        """Each stage in turn refines the draft, timed under its name (core/rebalance/policy.py
        `PIPELINE` lists them in order)."""
        for stage in stages:
            with self.times.stage(stage.name):
                stage.refine(self)

    def climb(self) -> None:
        """Stage: steepest ascent — single moves, swaps, pools, relocations, migrations — until no
        move clears its threshold or the action budget is spent."""
        self._climb()

    def polish(self) -> None:
        """Stage: where hosts are small, an exact solver's layout from where the climb stopped
        (no solver: nothing)."""
        if self.solver is not None:
            self._polish()

    def climb_after_polish(self) -> None:
        """Stage: climb again from the solver's layouts, when the solver moved anything."""
        if any(report.get("taken") for report in self.draft.exact):
            self._climb()

    def _climb(self) -> None:
        settings = self.settings
        cache: dict[str, CandidateMove | None] = {}
        dirty = set(self.hosts)
        migration: CandidateMove | None = None
        migration_dirty = True
        for _ in range(settings.max_rounds):
            for name in dirty:
                cache[name] = self.best_local(self.hosts[name])
            dirty = set()
            if migration_dirty:
                migration = self.best_migration()
                migration_dirty = False
            options = [m for m in cache.values()
                       if m is not None and self._judge(m) >= self._threshold(m) and not self.held_back(m)]
            if migration is not None and self._judge(migration) >= settings.min_migration_gain:
                options.append(migration)
            options.sort(key=lambda m: -m.sure_gain)
            chosen = None
            for option in options:
                if self.actions_if(option) <= settings.max_actions:
                    chosen = option
                    break
            if chosen is None:
                if options:
                    self.draft.rejected.append(f"action budget of {settings.max_actions} reached")
                    self._decline(options[0], self._threshold(options[0]), "max_actions")
                else:
                    best = max((m for m in [*cache.values(), migration] if m is not None and m.gain > _EPS),
                               key=lambda m: m.gain, default=None)
                    if best is not None:
                        self._decline(best, self._threshold(best))
                return
            dirty |= self._take(chosen)
            migration_dirty = True

    def _take(self, move: CandidateMove) -> set[str]:
        """Apply a move to the what-if state; the hosts it changed."""
        hosts = {self.host_of[c.guest] for c in move.changes} | {c.host for c in move.changes}
        self.apply(move)
        # A guest's predicted performance depends on its own host's layout only: re-read the hosts
        # the move changed (guests that left them are re-read on the host they went to).
        for name in hosts:
            self.perf_now.update(self.host_perf(self.hosts[name]))
        return hosts

    def held_back(self, move: CandidateMove) -> bool:
        """A move the model's data drive (its interference change reaches `min_gain`) on a host in
        back-off: not planned; the host's layout may only be tried (kept if measured better)."""
        if not self.history.held:
            return False
        hosts = {self.host_of[c.guest] for c in move.changes} | {c.host for c in move.changes}
        return bool(hosts & set(self.history.held)) and abs(move.gain - move.linear_gain) >= self.min_gain_on(hosts)

    def _threshold(self, move: CandidateMove) -> float:
        """The gain a move must clear: `min_migration_gain` when a guest changes host, else the
        hysteresis of the hosts it touches (`min_gain`, lower on hosts of few guests)."""
        if any(c.host != self.host_of[c.guest] for c in move.changes):
            return self.settings.min_migration_gain
        return self.min_gain_on({self.host_of[c.guest] for c in move.changes} | {c.host for c in move.changes})

    def min_gain_on(self, hosts) -> float:
        """The hysteresis of a move on `hosts` (RebalanceSettings.min_gain_for their guests)."""
        weight = sum(self.guests[g].weight for h in set(hosts) for g in self.hosts[h].guests)
        return self.settings.min_gain_for(weight)

    def _decline(self, move: CandidateMove, threshold: float, by: str | None = None) -> None:
        """Remember a gain left on the table and what declined it (the plan says so)."""
        self._judge(move)
        paid = move.cost.get("paid", 0.0)
        if by is None:
            if self.held_back(move) and move.gain >= threshold:
                by = "backoff"
            elif move.gain + paid >= threshold > move.gain:
                by = "migration_cost"
            elif move.gain >= threshold > move.sure_gain:
                by = "confidence"
            else:
                by = "min_migration_gain" if threshold == self.settings.min_migration_gain and any(
                    c.host != self.host_of[c.guest] for c in move.changes) else "min_gain"
        self.draft.declined.append({
            "kind": move.kind, "move": move.reason, "guests": sorted({c.guest for c in move.changes}),
            "predicted_gain": round(move.gain, 4), "sure_gain": round(move.sure_gain, 4),
            "confidence": round(move.confidence, 3), "cost": round(paid, 4), "threshold": threshold,
            "declined_by": by,
        })

    # ----- the exact solver ------------------------------------------------------------------------------
    def _exact_groups(self) -> list[list[str]]:
        """Hosts the solver takes: every small host alone, or all small hosts together (with
        migrations) when their pCPUs together stay within `exact_max_cpus`."""
        limit = self.settings.exact_max_cpus
        small = [n for n in sorted(self.hosts) if 0 < len(self.hosts[n].usable) <= limit]
        busy = [n for n in small if any(self.movable(g) for g in self.hosts[n].guests)]
        if not busy:
            return []
        joint = [n for n in small if self.hosts[n].state.accepts_migrations or n in busy]
        if (self.settings.allow_migration and len(joint) > 1
                and sum(len(self.hosts[n].usable) for n in joint) <= limit):
            return [joint]
        return [[n] for n in busy]

    def _polish(self) -> bool:
        settings = self.settings
        budget = settings.exact_budget_s
        changed = False
        for group in self._exact_groups():
            report: dict = {"hosts": group}
            self.draft.exact.append(report)
            if budget <= 0:
                report.update(status="skipped", why=f"solver budget of {settings.exact_budget_s:g} deterministic s spent")
                continue
            try:
                problem, solution = solve_hosts(self, self.solver, group, min(settings.exact_time_s, budget))
            except NotExact as exc:
                report.update(status="not solved", why=str(exc))
                continue
            report.update(items=problem.n_items, slots=problem.n_slots, approximate=problem.approximate)
            if solution is None:
                report.update(status="no solution", why="no layout (at most one time-shared pCPU) keeps every rule")
                continue
            budget -= solution.spent
            report.update(solution.to_dict())
            if problem.hint is not None:
                report["before"] = round(problem.objective(problem.hint), 6)
            if len(group) == 1:
                self.draft.exact_layouts[group[0]] = solved_layout(problem, solution)
            move = self._relayout_move(problem, solution, group, report)
            if move is None:
                continue
            threshold = self._threshold(move)
            if self._judge(move) < threshold or self.held_back(move):
                self._decline(move, threshold)
                report["taken"] = False
                if move.gain >= threshold and len(group) == 1 and not move.cost:
                    # worth it by the model, not sure enough by its data: worth measuring (a trial)
                    self.draft.declined_layouts[group[0]] = solved_layout(problem, solution)
                continue
            if self.actions_if(move) > settings.max_actions:
                self._decline(move, threshold, "max_actions")
                report["taken"] = False
                continue
            self._take(move)
            report["taken"] = True
            changed = True
        return changed

    def _relayout_move(self, problem: LayoutProblem, solution: LayoutSolution, group: list[str],
                       report: dict) -> CandidateMove | None:
        """The solver's layout as one move, judged by the search's own arithmetic."""
        wanted = layout_changes(self, problem, solution)
        if not wanted:
            return None
        changes, paid, lost = [], 0.0, 0.0
        for name, (host, pins) in sorted(wanted.items()):
            memory_nodes = None
            if host != self.host_of[name]:
                memory_nodes = self._destination_memory_nodes(self.hosts[host], self.guests[name], pins, None)
                if memory_nodes is None:
                    report["why"] = f"{name}: its memory does not fit on {host}"
                    return None
                g = problem.guests.index(name)
                own = float(problem.move_cost[g]) if problem.move_cost is not None else 0.0
                paid += own
                lost += own * self.settings.horizon_s / max(self.guests[name].weight, 1e-9)
            changes.append(GuestChange(name, host, pins, memory_nodes=memory_nodes))
        move = CandidateMove("relayout", changes, 0.0, 0.0)
        before = sum(self.host_objective(self.hosts[h]) for h in group)
        before_lin = sum(self._linear_objective(self.hosts[h]) for h in group)
        undo = self._try(move)
        try:
            after = sum(self.host_objective(self.hosts[h]) for h in group)
            after_lin = sum(self._linear_objective(self.hosts[h]) for h in group)
            broken = [p for h in group for p in self.violations(self.hosts[h], [n for n in wanted if n in self.hosts[h].guests])]
            floors = all(self._floors_hold(self.hosts[h]) for h in group)
        finally:
            undo()
        if broken or not floors:
            report["why"] = broken[0] if broken else "a protected guest would fall below its floor"
            return None
        move.gain = after - before - paid
        move.linear_gain = after_lin - before_lin - paid
        if paid:
            move.cost = {"lost_perf_s": lost, "paid": paid}
        report["gain"] = round(move.gain, 6)
        if move.gain <= _EPS:
            return None
        move.reason = (f"exact layout of {', '.join(group)} ({solution.status}, {solution.solver}): "
                       f"{plural(len(changes), 'guest')} move, predicted {move.gain:+.3f}")
        return move

    def _judge(self, move: CandidateMove) -> float:
        if not move.judged:
            self._assess(move)
            move.guess_weight = self.settings.guess_weight
            move.judged = True
        return move.sure_gain

    def _assess(self, move: CandidateMove) -> None:
        """How much of the move's predicted interference change rests on data (confidence),
        and how much the topology alone predicts (prior gain).

        The change is taken pair by pair (who hurts whom, at which distance, before and
        after): each pair's change counts with the confidence of the coefficients behind
        it, before and after. A pair at a distance class never observed, or whose
        coefficients the samples cannot tell apart, contributes the model's guess, which
        is not sure.
        """
        hosts = sorted({self.host_of[c.guest] for c in move.changes} | {c.host for c in move.changes})
        before = [self.hosts[h].pair_terms(self.hosts[h].pieces()) for h in hosts]
        prior_before = sum(self._prior_interference(self.hosts[h]) for h in hosts)
        undo = self._try(move)
        try:
            after = [self.hosts[h].pair_terms(self.hosts[h].pieces()) for h in hosts]
            prior_after = sum(self._prior_interference(self.hosts[h]) for h in hosts)
        finally:
            undo()
        move.prior_gain = prior_after - prior_before
        total = weighted = 0.0
        for (keys_b, terms_b, conf_b), (keys_a, terms_a, conf_a) in zip(before, after):
            change, trust = pair_changes(keys_b, terms_b, conf_b, keys_a, terms_a, conf_a)
            if change is None:
                continue
            total += float(change.sum())
            weighted += float(np.multiply(change, trust, out=trust).sum())
        move.confidence = weighted / total if total > _EPS else 1.0

    def _prior_interference(self, host: HostLayout) -> float:
        """The host's objective under the topology prior, minus time sharing alone."""
        if not host.guests or self.betas.prior is None:
            return 0.0
        return self._blind_base(host, host.pieces())

    def _interference_part(self, host: HostLayout) -> dict[str, float]:
        """Per guest: predicted performance minus what time sharing alone predicts."""
        if not host.guests:
            return {}
        pieces = host.pieces()
        perf, linear = host.perf(pieces, pieces.cpu)
        return {name: float(perf[0][i] - linear[0][i]) for i, name in enumerate(pieces.guests)}

    def _try(self, move: CandidateMove):
        """Put the move's layout on the what-if hosts; returns the function that takes it back."""
        undo = []
        for change in move.changes:
            name = change.guest
            source = self.hosts[self.host_of[name]]
            old_pins = source.pins[name]
            if change.host != source.name:
                guest = source.guests[name]
                source.remove(name)
                target = self.hosts[change.host]
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


def _spare(host: HostLayout) -> float:
    demand = sum(g.load * len(host.pins[n]) for n, g in host.guests.items())
    return len(host.usable) - demand


def _memory_move_cost(guest: GuestState, settings: RebalanceSettings) -> float:
    seconds = guest.placement.memory_kib / 1024.0 / settings.memory_move_mib_s
    return settings.copy_slowdown * seconds


def _fmt(cpus: Iterable[int]) -> str:
    from vmplacer.core.topology.cpuset import format_cpuset

    return format_cpuset(cpus)


def _relocated_cells(placement: Placement, nodes: frozenset[int]) -> tuple[GuestCell, ...]:
    if not placement.cells or len(nodes) != 1:
        return placement.cells
    node = next(iter(nodes))
    return tuple(replace(cell, host_node=node) for cell in placement.cells)
