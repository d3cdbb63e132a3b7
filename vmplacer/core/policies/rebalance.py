"""The rebalance policy: moves that raise predicted weighted performance, as a Plan.

Pure: it gets the cluster state, the interference model and the settings,
searches on a what-if copy and returns a `Plan` (nothing is touched).

Objective. Each running guest v gets a predicted performance p_v — the share
of its full-speed throughput (every vCPU at its load) it gets in the layout,
from the interference model: time sharing of pCPUs, and pairwise losses by
distance class (with no learned data the model is the linear predictor and
only time sharing counts). The objective is

    J = Σ_v w_v · (p_v − φ · max(0, 1 − p_v)²)

w_v weighs latency-critical guests and the `priority` label; φ (`fairness`)
is small: among layouts of equal total it prefers the one where the worst-off
guest does better (three busy vCPUs on two pCPUs: all three floating over both
beat two sharing one pCPU while the third has the other). Protected guests
(latency-critical, priority > 0, or a `perf_floor` label) are never pushed
below their floor: the label's value, else their predicted performance before
the run.

Moves, evaluated with the model on a what-if layout (local search, steepest
ascent, one move per round):

* move one pinned vCPU to another pCPU of its host;
* swap the pCPUs of two pinned vCPUs of different guests;
* pool: the shareable pinned vCPUs of an oversubscribed node float over the
  node's shared pool (the placement engine's rule for shared vCPUs);
* relocate a guest, vCPUs and memory, to another NUMA node of its host;
* migrate a guest to another host (pinned there greedily, or by the placement
  engine for guests vmplacer placed).

Every move keeps the placement engine's rules (exclusive pCPUs stay
exclusive, isolate guests keep whole cores, memory fits its nodes,
anti-affinity holds, reserved pCPUs stay unused). A move is taken only if it
raises J by `min_gain` (hysteresis); a migration or a memory move must also
pay for itself: its cost (`migration_cost`: downtime and slowdown while
copying, in VM-seconds at full speed) divided by `horizon_s` is subtracted,
and the rest must clear `min_migration_gain`. Guests moved within
`cooldown_s` stay put; at most `max_actions` actions are planned.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from vmplacer.core.allocate import allocate, refresh_shared_pins
from vmplacer.core.interference import InterferenceModel, Tenant, distance_matrix
from vmplacer.core.migration_cost import migration_cost
from vmplacer.core.nofit import NoFit
from vmplacer.core.occupancy import HostUsage, memory_by_node
from vmplacer.core.placement import GuestCell, Placement
from vmplacer.core.plan import Action, Plan
from vmplacer.core.policies.rebalance_state import (
    EXCLUSIVE,
    FIXED,
    FLOATING,
    PINNED,
    ClusterState,
    GuestState,
    HostState,
    RebalanceInputError,
    RebalanceSettings,
    describe_guest,
)

__all__ = [
    "ClusterState", "GuestState", "HostState", "RebalanceSettings", "RebalanceInputError", "describe_guest",
    "plan_rebalance", "evaluate_cluster", "exhaustive_best", "BetaTable",
]

_EPS = 1e-9


# --------------------------------------------------------------------------- β table
class BetaTable:
    """Interference coefficients β_c(u → v) between the guests' model identities, cached.

    Two workloads the model never observed but of the same workload class get
    the same coefficients, so identities are (known key) or (unknown, class):
    the number of distinct identities is bounded by what the model learned.
    """

    def __init__(self, model: InterferenceModel):
        from vmplacer.core.topology import DistanceClass

        self.model = model
        self.empty = model.observations == 0
        self._known = set(model.known_keys()) if not self.empty else set()
        self._classes = list(DistanceClass)
        self._pairs: dict[tuple[tuple[str, str], tuple[str, str]], np.ndarray] = {}

    def identity(self, guest: GuestState) -> tuple[str, str]:
        """The guest's own name when the model learned it (samples are keyed by guest), else its
        workload key (replicas), else its workload class."""
        for key in (guest.name, guest.key):
            if key in self._known:
                return ("key", key)
        return ("class", guest.workload_class)

    def tensor(self, identities: Sequence[tuple[str, str]]) -> np.ndarray | None:
        """[distance rank, background, foreground] over `identities`; None when all β are 0."""
        if self.empty:
            return None
        k = len(identities)
        table = np.zeros((len(self._classes), k, k))
        for i, background in enumerate(identities):
            for j, foreground in enumerate(identities):
                table[:, i, j] = self._pair(background, foreground)
        return table

    def _pair(self, background: tuple[str, str], foreground: tuple[str, str]) -> np.ndarray:
        key = (background, foreground)
        found = self._pairs.get(key)
        if found is None:
            bg_key = background[1] if background[0] == "key" else f"\x00unknown:{background[1]}"
            fg_key = foreground[1] if foreground[0] == "key" else f"\x00unknown:{foreground[1]}"
            bg_class = background[1] if background[0] == "class" else "unknown"
            fg_class = foreground[1] if foreground[0] == "class" else "unknown"
            found = np.array([0.0] + [
                self.model.beta(bg_key, fg_key, cls, background_class=bg_class, foreground_class=fg_class)
                for cls in self._classes[1:]
            ])
            self._pairs[key] = found
        return found


# --------------------------------------------------------------------------- one host's layout
@dataclass
class _Pieces:
    """A host layout flattened: one piece per (vCPU, pCPU it may run on)."""

    guests: list[str]
    vm: np.ndarray  # piece -> guest index
    vcpu: np.ndarray
    cpu: np.ndarray  # piece -> local pCPU index
    demand: np.ndarray
    key: np.ndarray  # piece -> identity index in `table`
    table: np.ndarray | None
    onehot: np.ndarray  # [piece, guest]
    ideal: np.ndarray  # per guest
    weight: np.ndarray
    single: np.ndarray  # piece is a vCPU pinned to exactly one pCPU
    matrix: np.ndarray | None = None  # interference between pieces, computed on first use
    current: tuple[np.ndarray, np.ndarray] | None = None  # `perf` of the layout itself, cached


class _Host:
    """Static facts of one host (pCPU indexes, distances, usable pCPUs) and its what-if layout."""

    def __init__(self, state: HostState, betas: BetaTable):
        topo = state.topology
        self.state = state
        self.name = state.name
        self.topology = topo
        self.cpus = sorted(c for c in topo.cpus if topo.cpus[c].online)
        self.index = {c: i for i, c in enumerate(self.cpus)}
        self.dist = distance_matrix(topo, np.array(self.cpus, dtype=np.int64))
        self.usable = frozenset(topo.usable_cpus)
        self.node_of = {c: topo.cpus[c].node for c in self.cpus}
        self.siblings = {c: topo.siblings(c) & set(self.cpus) for c in self.cpus}
        self.node_cpus: dict[int, frozenset[int]] = {}
        for cpu in self.cpus:
            self.node_cpus[self.node_of[cpu]] = self.node_cpus.get(self.node_of[cpu], frozenset()) | {cpu}
        self.betas = betas
        self.reserved_kib = state.options.reserved_memory_mib_per_node * 1024
        self.guests: dict[str, GuestState] = {}
        self.pins: dict[str, dict[int, frozenset[int]]] = {}
        self._pieces: _Pieces | None = None

    # ----- layout -------------------------------------------------------------------------
    def add(self, guest: GuestState, pins: Mapping[int, frozenset[int]]) -> None:
        self.guests[guest.name] = guest
        self.pins[guest.name] = dict(pins)
        self._pieces = None

    def remove(self, name: str) -> None:
        del self.guests[name]
        del self.pins[name]
        self._pieces = None

    def set_pins(self, name: str, pins: Mapping[int, frozenset[int]]) -> None:
        self.pins[name] = dict(pins)
        self._pieces = None

    def owned_by_others(self, name: str | None) -> frozenset[int]:
        """pCPUs exclusive guests other than `name` own (isolate guests: their whole cores)."""
        owned: set[int] = set()
        for other, guest in self.guests.items():
            if other == name or guest.mode != EXCLUSIVE and not (guest.mode == FIXED and guest.placement.exclusive_cpus):
                continue
            if guest.mode == FIXED:
                owned |= guest.placement.exclusive_cpus
                continue
            for cpus in self.pins[other].values():
                for cpu in cpus:
                    owned |= self.siblings[cpu] if guest.thread_policy == "isolate" else {cpu}
        return frozenset(owned)

    def pinned_by_others(self, name: str | None) -> frozenset[int]:
        """pCPUs where other guests have a vCPU pinned to that pCPU alone."""
        used: set[int] = set()
        for other, pins in self.pins.items():
            if other == name:
                continue
            for cpus in pins.values():
                if len(cpus) == 1:
                    used |= cpus
        return frozenset(used)

    def allowed(self, name: str, vcpu: int | None = None, node: int | None = None,
                ignore_locality: bool = False) -> frozenset[int]:
        """pCPUs a vCPU of `name` may move to (every rule that concerns one vCPU at a time)."""
        guest = self.guests[name]
        base = set(self.usable)
        if node is not None:
            nodes = {node}
        else:
            nodes = set() if ignore_locality else _locality_nodes(self, guest, self.pins[name])
        if nodes:
            base &= set().union(*(self.node_cpus.get(n, frozenset()) for n in nodes))
        base -= self.owned_by_others(name)
        if guest.mode == EXCLUSIVE:
            base -= self.pinned_by_others(name)
            mine = {c for v, cpus in self.pins[name].items() if v != vcpu for c in cpus}
            base -= mine
            if guest.thread_policy == "isolate":
                busy = self.pinned_by_others(name) | self.owned_by_others(name)
                base = {c for c in base
                        if not (self.siblings[c] - {c}) & busy and not self.siblings[c] & mine}
        return frozenset(base)

    # ----- evaluation -------------------------------------------------------------------------
    def pieces(self, layout: Mapping[str, Mapping[int, frozenset[int]]] | None = None,
               guests: Mapping[str, GuestState] | None = None) -> _Pieces:
        if layout is None and self._pieces is not None:
            return self._pieces
        layout = self.pins if layout is None else layout
        guests = self.guests if guests is None else guests
        names = list(layout)
        identities: dict[tuple[str, str], int] = {}
        vm, vcpu, cpu, demand, key, single = [], [], [], [], [], []
        everywhere = sorted(self.usable) or self.cpus
        for g, name in enumerate(names):
            guest = guests[name]
            ident = identities.setdefault(self.betas.identity(guest), len(identities))
            for v, pins in sorted(layout[name].items()):
                allowed = sorted(pins) if pins else everywhere
                share = guest.load / len(allowed)
                for c in allowed:
                    vm.append(g)
                    vcpu.append(v)
                    cpu.append(self.index[c])
                    demand.append(share)
                    key.append(ident)
                    single.append(len(allowed) == 1)
        vm_a = np.asarray(vm, dtype=np.int64)
        onehot = np.zeros((len(vm), len(names)))
        if len(vm):
            onehot[np.arange(len(vm)), vm_a] = 1.0
        result = _Pieces(
            guests=names, vm=vm_a, vcpu=np.asarray(vcpu, dtype=np.int64),
            cpu=np.asarray(cpu, dtype=np.int64), demand=np.asarray(demand, dtype=float),
            key=np.asarray(key, dtype=np.int64), table=self.betas.tensor(list(identities)),
            onehot=onehot,
            ideal=np.array([guests[n].ideal for n in names], dtype=float),
            weight=np.array([guests[n].weight for n in names], dtype=float),
            single=np.asarray(single, dtype=bool),
        )
        if layout is self.pins:
            self._pieces = result
        return result

    def perf(self, pieces: _Pieces, cpu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate (rows of `cpu`, C×P): each guest's predicted performance (C×V), and the
        same from time sharing alone (the linear predictor)."""
        same = cpu is pieces.cpu
        if same and pieces.current is not None:
            return pieces.current
        if cpu.ndim == 1:
            cpu = cpu[None, :]
        count, size = cpu.shape
        if size == 0:
            empty = np.zeros((count, len(pieces.guests)))
            return empty, empty
        n = len(self.cpus)
        slots = (cpu + (np.arange(count) * n)[:, None]).ravel()
        load = np.bincount(slots, weights=np.tile(pieces.demand, count), minlength=count * n)
        granted = pieces.demand[None, :] * np.minimum(1.0, 1.0 / np.maximum(load[slots].reshape(count, size), 1e-12))
        linear = self._per_guest(pieces, granted)
        if pieces.table is None:
            result = (linear, linear)
        elif same:
            loss = granted @ _interference_matrix(self, pieces).T
            result = (self._per_guest(pieces, granted * (1.0 - loss)), linear)
        else:
            result = (self._interfered(pieces, cpu, granted), linear)
        if same:
            pieces.current = result
        return result

    def _interfered(self, pieces: _Pieces, cpu: np.ndarray, granted: np.ndarray) -> np.ndarray:
        assert pieces.table is not None
        dist = self.dist[cpu[:, :, None], cpu[:, None, :]]  # [c, x, y]
        k = pieces.table.shape[1]
        beta = pieces.table.reshape(-1)[dist * (k * k) + pieces.key[None, None, :] * k + pieces.key[None, :, None]]
        other = (pieces.vm[:, None] != pieces.vm[None, :])[None, :, :] & (dist != 0)
        loss = np.einsum("cxy,cy->cx", np.where(other, beta, 0.0), granted)
        return self._per_guest(pieces, granted * (1.0 - loss))

    def perf_moves(self, pieces: _Pieces, m: int, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`perf` for candidates that each move piece `m` to one of `targets` (local pCPU indexes).

        Only row and column m of the interference matrix change, so the loss is
        the current matrix times the new time shares, corrected for m: a
        matrix product instead of a fresh C×P×P gather.
        """
        count = len(targets)
        n = len(self.cpus)
        cpu = np.tile(pieces.cpu, (count, 1))
        cpu[:, m] = targets
        load = np.tile(np.bincount(pieces.cpu, weights=pieces.demand, minlength=n), (count, 1))
        rows = np.arange(count)
        load[:, pieces.cpu[m]] -= pieces.demand[m]
        load[rows, targets] += pieces.demand[m]
        granted = pieces.demand[None, :] * np.minimum(1.0, 1.0 / np.maximum(load[rows[:, None], cpu], 1e-12))
        linear = self._per_guest(pieces, granted)
        if pieces.table is None:
            return linear, linear
        matrix = _interference_matrix(self, pieces)
        loss = granted @ matrix.T
        loss -= np.outer(granted[:, m], matrix[:, m])
        dist = self.dist[targets[:, None], pieces.cpu[None, :]]  # [c, x]: x's pCPU to m's new pCPU
        k = pieces.table.shape[1]
        flat = pieces.table.reshape(-1)
        valid = (pieces.vm[None, :] != pieces.vm[m]) & (dist != 0)
        caused = np.where(valid, flat[dist * (k * k) + pieces.key[m] * k + pieces.key[None, :]], 0.0)
        suffered = np.where(valid, flat[dist * (k * k) + pieces.key[None, :] * k + pieces.key[m]], 0.0)
        loss += caused * granted[:, m][:, None]
        loss[:, m] = (suffered * granted).sum(axis=1)
        return self._per_guest(pieces, granted * (1.0 - loss)), linear

    @staticmethod
    def _per_guest(pieces: _Pieces, got: np.ndarray) -> np.ndarray:
        return np.maximum(got @ pieces.onehot, 0.0) / pieces.ideal[None, :]


def _interference_matrix(host: _Host, pieces: _Pieces) -> np.ndarray:
    """[x, y]: β(y → x) at their pCPUs' distance, 0 for pieces of one guest or one pCPU (cached)."""
    if pieces.matrix is None:
        assert pieces.table is not None
        dist = host.dist[pieces.cpu[:, None], pieces.cpu[None, :]]
        k = pieces.table.shape[1]
        beta = pieces.table.reshape(-1)[dist * (k * k) + pieces.key[None, :] * k + pieces.key[:, None]]
        other = (pieces.vm[:, None] != pieces.vm[None, :]) & (dist != 0)
        pieces.matrix = np.where(other, beta, 0.0)
    return pieces.matrix


def _locality_nodes(host: _Host, guest: GuestState, pins: Mapping[int, frozenset[int]]) -> set[int]:
    """Nodes a guest's vCPUs must stay in: where its memory is, when it says where (NUMA locality)."""
    placement = guest.placement
    if placement.cells:
        return {cell.host_node for cell in placement.cells if cell.host_node in host.node_cpus}
    if placement.memory_nodes:
        return {n for n in placement.memory_nodes if n in host.node_cpus}
    return set()


def utility(perf: np.ndarray, fairness: float) -> np.ndarray:
    shortfall = np.maximum(0.0, 1.0 - perf)
    return perf - fairness * shortfall * shortfall


# --------------------------------------------------------------------------- moves
@dataclass
class _Change:
    """One guest's new whereabouts in a move."""

    guest: str
    host: str
    pins: dict[int, frozenset[int]]
    memory_nodes: frozenset[int] | None = None  # None: unchanged
    placement: Placement | None = None  # a full placement (placement-engine result)


@dataclass
class _Move:
    kind: str  # move | swap | pool | unpool | relocate | migrate
    changes: list[_Change]
    gain: float  # objective gain, cost included
    linear_gain: float  # the part time sharing alone explains
    cost: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    confidence: float = 1.0  # the model's confidence in the guests it moves

    @property
    def sure_gain(self) -> float:
        """The gain the move is judged by: time sharing counts fully (it is arithmetic, not
        a guess), predicted interference only as far as the model is confident in it."""
        return self.linear_gain + self.confidence * (self.gain - self.linear_gain)


# --------------------------------------------------------------------------- the search
class _Search:
    def __init__(self, state: ClusterState, model: InterferenceModel, settings: RebalanceSettings,
                 now: float | None, last_moved: Mapping[str, float], scope: Iterable[str] | None):
        self.state = state
        self.model = model
        self.settings = settings
        self.betas = BetaTable(model)
        self.hosts = {name: _Host(host, self.betas) for name, host in state.hosts.items()}
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
        self.original = {g.name: g for g in self.guests.values()}
        self.start_perf = self.perf_by_guest()
        self.confidence: dict[str, float] = {}
        for host in self.hosts.values():
            self.confidence.update(_host_confidences(host, model, self.betas))
        self.floors: dict[str, float] = {}
        for guest in self.guests.values():
            if guest.floor is not None:
                self.floors[guest.name] = guest.floor
            elif guest.protected:
                self.floors[guest.name] = self.start_perf.get(guest.name, 0.0)
        self.perf_now = dict(self.start_perf)
        self.moves: list[_Move] = []
        self.touched: set[str] = set()
        self.migrated: dict[str, str] = {}  # guest -> original host
        self.memory_moved: set[str] = set()
        self.rejected: list[str] = []

    # ----- evaluation helpers -------------------------------------------------------------------------
    def perf_by_guest(self) -> dict[str, float]:
        result: dict[str, float] = {}
        for host in self.hosts.values():
            if not host.guests:
                continue
            pieces = host.pieces()
            values = host.perf(pieces, pieces.cpu)[0][0]
            result.update({name: float(values[i]) for i, name in enumerate(pieces.guests)})
        return result

    def objective_of(self, pieces: _Pieces, perf: np.ndarray) -> np.ndarray:
        return (utility(perf, self.settings.fairness) * pieces.weight[None, :]).sum(axis=1)

    def host_objective(self, host: _Host) -> float:
        if not host.guests:
            return 0.0
        pieces = host.pieces()
        return float(self.objective_of(pieces, host.perf(pieces, pieces.cpu)[0])[0])

    def total_objective(self) -> float:
        return sum(self.host_objective(h) for h in self.hosts.values())

    def floors_ok(self, pieces: _Pieces, perf: np.ndarray) -> np.ndarray:
        """Per candidate: no protected guest pushed below min(its floor, where it is now)."""
        ok = np.ones(perf.shape[0], dtype=bool)
        for index, name in enumerate(pieces.guests):
            floor = self.floors.get(name)
            if floor is None:
                continue
            now = self.perf_now.get(name, floor)
            ok &= perf[:, index] >= min(floor, now) - 1e-6
        return ok

    def movable(self, name: str) -> bool:
        return self.guests[name].movable

    # ----- candidate moves on one host -----------------------------------------------------------
    def best_local(self, host: _Host) -> _Move | None:
        if not any(self.movable(n) for n in host.guests):
            return None
        pieces = host.pieces()
        base, base_linear = host.perf(pieces, pieces.cpu)
        base_obj = float(self.objective_of(pieces, base)[0])
        base_lin = float(self.objective_of(pieces, base_linear)[0])
        current = base[0]
        moves: list[_Move] = []
        order = self._ranked_pieces(host, pieces, current)
        for m in order[: self.settings.move_candidates]:
            move = self._best_single(host, pieces, m, base_obj, base_lin, current)
            if move:
                moves.append(move)
        for m in order[: self.settings.swap_candidates]:
            move = self._best_swap(host, pieces, m, base_obj, base_lin, current)
            if move:
                moves.append(move)
        moves.extend(self._pool_moves(host, base_obj, base_lin, current))
        moves.extend(self._relocations(host, base_obj, base_lin))
        return max(moves, key=lambda mv: mv.gain, default=None)

    def _ranked_pieces(self, host: _Host, pieces: _Pieces, current: np.ndarray) -> list[int]:
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

    def _gain_vectors(self, host: _Host, pieces: _Pieces, cand: np.ndarray, base_obj: float,
                      base_lin: float, current: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        perf, linear = host.perf(pieces, cand)
        gain = self.objective_of(pieces, perf) - base_obj
        lin = self.objective_of(pieces, linear) - base_lin
        ok = self.floors_ok(pieces, perf)
        return gain, lin, ok

    def _best_single(self, host: _Host, pieces: _Pieces, m: int, base_obj: float, base_lin: float,
                     current: np.ndarray) -> _Move | None:
        name = pieces.guests[pieces.vm[m]]
        vcpu = int(pieces.vcpu[m])
        here = host.cpus[pieces.cpu[m]]
        targets = sorted(host.allowed(name, vcpu) - {here})
        if not targets:
            return None
        perf, linear = host.perf_moves(pieces, m, np.array([host.index[c] for c in targets], dtype=np.int64))
        gain = self.objective_of(pieces, perf) - base_obj
        lin = self.objective_of(pieces, linear) - base_lin
        gain = np.where(self.floors_ok(pieces, perf), gain, -np.inf)
        best = int(np.argmax(gain))
        if not np.isfinite(gain[best]):
            return None
        pins = dict(host.pins[name])
        pins[vcpu] = frozenset({targets[best]})
        return _Move("move", [_Change(name, host.name, pins)], float(gain[best]), float(lin[best]),
                     reason=f"vCPU {vcpu} of {name}: pCPU {here} → {targets[best]}")

    def _best_swap(self, host: _Host, pieces: _Pieces, m: int, base_obj: float, base_lin: float,
                   current: np.ndarray) -> _Move | None:
        name_m = pieces.guests[pieces.vm[m]]
        partners = [n for n in range(len(pieces.cpu))
                    if n != m and pieces.single[n] and pieces.cpu[n] != pieces.cpu[m]
                    and pieces.vm[n] != pieces.vm[m]
                    and self.guests[pieces.guests[pieces.vm[n]]].mode in (PINNED, EXCLUSIVE)]
        if not partners:
            return None
        cand = np.tile(pieces.cpu, (len(partners), 1))
        rows = np.arange(len(partners))
        cand[rows, m] = pieces.cpu[partners]
        cand[rows, partners] = pieces.cpu[m]
        gain, lin, ok = self._gain_vectors(host, pieces, cand, base_obj, base_lin, current)
        order = np.argsort(-np.where(ok, gain, -np.inf))
        for index in order[:4]:
            if not ok[index] or gain[index] <= 0:
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
            return _Move("swap", [_Change(name_m, host.name, pins_m), _Change(name_n, host.name, pins_n)],
                         float(gain[index]), float(lin[index]),
                         reason=f"swap pCPUs of {name_m} vCPU {int(pieces.vcpu[m])} ({cpu_m}) and "
                                f"{name_n} vCPU {int(pieces.vcpu[n])} ({cpu_n})")
        return None

    def _valid_swap(self, host: _Host, a: str, pins_a: dict, b: str, pins_b: dict) -> bool:
        old_a, old_b = host.pins[a], host.pins[b]
        host.set_pins(a, pins_a)
        host.set_pins(b, pins_b)
        try:
            return not self.violations(host, [a, b])
        finally:
            host.set_pins(a, old_a)
            host.set_pins(b, old_b)

    def _pool_moves(self, host: _Host, base_obj: float, base_lin: float, current: np.ndarray) -> list[_Move]:
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
                move = self._evaluate_layout(host, layout, members, "pool", base_obj, base_lin, current,
                                             f"{len(members)} guests asking {demand:.1f} pCPUs of node {node}'s "
                                             f"{len(pool)}: float them over the pool {_fmt(pool)}")
                if move:
                    moves.append(move)
            if self.settings.pin_floating_guests:
                floating = [n for n, g in host.guests.items()
                            if g.mode == FLOATING and g.spec is None and all(p and p <= pool for p in host.pins[n].values())]
                vcpus = sum(len(host.pins[n]) for n in floating)
                if floating and vcpus <= len(pool):
                    free = sorted(pool - host.pinned_by_others(None))
                    if len(free) >= vcpus:
                        layout = dict(host.pins)
                        it = iter(free)
                        for n in floating:
                            layout[n] = {v: frozenset({next(it)}) for v in sorted(host.pins[n])}
                        move = self._evaluate_layout(host, layout, floating, "unpool", base_obj, base_lin, current,
                                                     f"pin floating guests {', '.join(floating)} 1:1 in node {node}")
                        if move:
                            moves.append(move)
        return moves

    def _evaluate_layout(self, host: _Host, layout: dict, members: list[str], kind: str, base_obj: float,
                         base_lin: float, current: np.ndarray, reason: str) -> _Move | None:
        pieces = host.pieces(layout)
        perf, lin = host.perf(pieces, pieces.cpu)
        if not self.floors_ok(pieces, perf)[0]:
            return None
        gain = float(self.objective_of(pieces, perf)[0]) - base_obj
        lin_gain = float(self.objective_of(pieces, lin)[0]) - base_lin
        return _Move(kind, [_Change(n, host.name, dict(layout[n])) for n in members], gain, lin_gain, reason=reason)

    def _relocations(self, host: _Host, base_obj: float, base_lin: float) -> list[_Move]:
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

    def _place_on(self, host: _Host, name: str, *, node: int | None, base_obj: float,
                  base_lin: float, guest: GuestState | None = None) -> _Move | None:
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
                cand = np.tile(pieces.cpu, (len(targets), 1))
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
            return _Move("move", [_Change(name, host.name, pins)], gain, lin)
        finally:
            if visiting:
                host.remove(name)
            else:
                host.set_pins(name, old_pins)

    # ----- migrations ------------------------------------------------------------------------------------
    def best_migration(self) -> _Move | None:
        settings = self.settings
        if not settings.allow_migration or len(self.hosts) < 2:
            return None
        perf = self.perf_by_guest()
        candidates = sorted(
            (g for g in self.guests.values()
             if g.movable and g.migratable and g.name not in self.migrated and g.name in perf),
            key=lambda g: (-g.weight * (1.0 - perf[g.name]), g.name),
        )[: settings.migration_candidates]
        best: _Move | None = None
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

    def _migration(self, guest: GuestState, source: _Host, destination: _Host) -> _Move | None:
        name = guest.name
        if not self._anti_affinity_ok(destination, guest, None):
            return None
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
            destination.add(visitor, placement.vcpupin)
            try:
                pieces = destination.pieces()
                perf = destination.perf(pieces, pieces.cpu)[0]
                if not self.floors_ok(pieces, perf)[0]:
                    return None
                dst_after = float(self.objective_of(pieces, perf)[0])
                dst_lin_after = self._linear_objective(destination)
            finally:
                destination.remove(name)
            pins = dict(placement.vcpupin)
        elif guest.mode == FLOATING:
            pool = frozenset(destination.usable - destination.owned_by_others(None))
            if not pool:
                return None
            pins = {v: pool for v in guest.placement.vcpupin}
            destination.add(visitor, pins)
            try:
                pieces = destination.pieces()
                perf = destination.perf(pieces, pieces.cpu)[0]
                if not self.floors_ok(pieces, perf)[0]:
                    return None
                dst_after = float(self.objective_of(pieces, perf)[0])
                dst_lin_after = self._linear_objective(destination)
            finally:
                destination.remove(name)
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
        settings = self.settings
        cost = migration_cost(
            guest.placement.memory_kib / 1024.0,
            guest.dirty_mib_s if guest.dirty_mib_s is not None else settings.default_dirty_mib_s,
            settings.migration_bandwidth_mib_s,
            max_downtime_s=settings.max_downtime_s,
            copy_slowdown=settings.copy_slowdown,
        )
        if not cost.converges:
            self.rejected.append(f"migrate {name} to {destination.name}: {cost.reason}")
            return None
        raw = (src_after - src_before) + (dst_after - dst_before)
        lin = (src_lin_after - src_lin_before) + (dst_lin_after - dst_lin_before)
        paid = guest.weight * cost.lost_perf_s / settings.horizon_s
        change = _Change(name, destination.name, pins, memory_nodes=memory_nodes, placement=placement)
        return _Move("migrate", [change], raw - paid, lin - paid, cost=cost.to_dict(),
                     reason=f"{name}: {source.name} → {destination.name}, predicted +{raw:.3f} "
                            f"(cost {paid:.4f} over {settings.horizon_s:g} s)")

    def _linear_objective(self, host: _Host) -> float:
        if not host.guests:
            return 0.0
        pieces = host.pieces()
        return float(self.objective_of(pieces, host.perf(pieces, pieces.cpu)[1])[0])

    def _floors_hold(self, host: _Host) -> bool:
        if not host.guests:
            return True
        pieces = host.pieces()
        return bool(self.floors_ok(pieces, host.perf(pieces, pieces.cpu)[0])[0])

    def _engine_placement(self, destination: _Host, guest: GuestState) -> Placement | None:
        """Where the placement engine would put a guest vmplacer placed (all its rules apply)."""
        assert guest.spec is not None
        others = [self._current_placement(n) for n in destination.guests]
        anti = {n: self.guests[n].anti_affinity for n in destination.guests if self.guests[n].anti_affinity}
        try:
            return allocate(destination.topology, guest.spec, others, options=destination.state.options,
                            anti_affinity_of_others=anti)
        except NoFit:
            return None

    def _destination_memory_nodes(self, destination: _Host, guest: GuestState, pins: Mapping[int, frozenset[int]],
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

    def _memory_fits(self, host: _Host, name: str, nodes: frozenset[int]) -> bool:
        others = [self._current_placement(n) for n in host.guests if n != name]
        usage = HostUsage.build(host.topology, others)
        need = self._current_placement(name).memory_kib
        free = sum(usage.small_free_kib(n, host.reserved_kib) for n in nodes if n in host.topology.nodes)
        return free >= need

    def _anti_affinity_ok(self, host: _Host, guest: GuestState, nodes: frozenset[int] | None) -> bool:
        peers = set(guest.anti_affinity) | self.refused_by.get(guest.name, set())
        present = peers & set(host.guests)
        if not present:
            return True
        if nodes is None:
            return False  # conservative for a new host: its node is not known yet
        for peer in present:
            peer_nodes = {host.node_of[c] for cpus in host.pins[peer].values() for c in cpus}
            if peer_nodes & nodes:
                return False
        return True

    # ----- rules ------------------------------------------------------------------------------------------
    def violations(self, host: _Host, names: Iterable[str]) -> list[str]:
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
        guest = self.guests[name]
        host = self.hosts[self.host_of[name]]
        pins = host.pins[name]
        old = guest.placement
        placement = replace(old, host=host.name, vcpupin=dict(pins))
        if self.memory_nodes.get(name) is not None:
            placement = replace(placement, memory_nodes=self.memory_nodes[name])
        return placement

    def apply(self, move: _Move) -> None:
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
            self.touched.add(name)
        self.moves.append(move)

    def actions_if(self, move: _Move) -> int:
        touched = self.touched | {c.guest for c in move.changes}
        migrated = set(self.migrated) | {c.guest for c in move.changes if c.host != self.host_of[c.guest]}
        memory = self.memory_moved | ({c.guest for c in move.changes} if move.kind == "relocate" else set())
        return len(touched) + len(migrated) + len(memory)

    def run(self) -> None:
        settings = self.settings
        cache: dict[str, _Move | None] = {}
        dirty = set(self.hosts)
        migration: _Move | None = None
        migration_dirty = True
        for _ in range(settings.max_rounds):
            for name in dirty:
                cache[name] = self.best_local(self.hosts[name])
            dirty = set()
            if migration_dirty:
                migration = self.best_migration()
                migration_dirty = False
            options = [m for m in cache.values() if m is not None and self._judge(m) >= settings.min_gain]
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
                    self.rejected.append(f"action budget of {settings.max_actions} reached")
                return
            hosts = {self.host_of[c.guest] for c in chosen.changes} | {c.host for c in chosen.changes}
            self.apply(chosen)
            self.perf_now = self.perf_by_guest()
            for name in hosts:
                self.confidence.update(_host_confidences(self.hosts[name], self.model, self.betas))
            dirty |= hosts
            migration_dirty = True

    def _judge(self, move: _Move) -> float:
        move.confidence = min((self.confidence.get(c.guest, 0.0) for c in move.changes), default=1.0)
        return move.sure_gain


def _spare(host: _Host) -> float:
    demand = sum(g.load * len(host.pins[n]) for n, g in host.guests.items())
    return len(host.usable) - demand


def _memory_move_cost(guest: GuestState, settings: RebalanceSettings) -> float:
    seconds = guest.placement.memory_kib / 1024.0 / settings.memory_move_mib_s
    return settings.copy_slowdown * seconds


def _fmt(cpus: Iterable[int]) -> str:
    from vmplacer.core.cpuset import format_cpuset

    return format_cpuset(cpus)


# --------------------------------------------------------------------------- building the plan
def _new_emulator(old: Placement, new_pins: Mapping[int, frozenset[int]], mode: str,
                  owned_by_others: frozenset[int]) -> frozenset[int]:
    """Emulator threads follow the vCPUs when they did (the engine's default), else stay."""
    old_cpus = old.pcpus
    new_cpus = frozenset().union(*new_pins.values()) if new_pins else frozenset()
    emulator = old.emulatorpin
    if emulator and (emulator == old_cpus or (mode == EXCLUSIVE and emulator <= old_cpus)):
        emulator = new_cpus
    if emulator & owned_by_others:
        emulator = (emulator - owned_by_others) or new_cpus
    return emulator


def _with_pins(search: _Search, name: str, host: _Host, pins: Mapping[int, frozenset[int]],
               base: Placement) -> Placement:
    guest = search.guests[name]
    emulator = _new_emulator(base, pins, guest.mode, host.owned_by_others(name))
    placement = replace(base, host=host.name, vcpupin=dict(sorted(pins.items())), emulatorpin=emulator)
    if guest.mode == EXCLUSIVE:
        cpus = frozenset().union(*pins.values())
        if guest.thread_policy == "isolate":
            cpus = frozenset().union(*(host.siblings[c] for c in cpus))
        placement = replace(placement, exclusive_cpus=cpus, dedicated=True)
    return placement


def _relocated_cells(placement: Placement, nodes: frozenset[int]) -> tuple[GuestCell, ...]:
    if not placement.cells or len(nodes) != 1:
        return placement.cells
    node = next(iter(nodes))
    return tuple(replace(cell, host_node=node) for cell in placement.cells)


def _build_actions(search: _Search, model: InterferenceModel) -> tuple[list[Action], dict[str, dict[str, float]]]:
    settings = search.settings
    end_perf = search.perf_by_guest()
    gains: dict[str, float] = {}
    linear: dict[str, float] = {}
    reasons: dict[str, list[str]] = {}
    costs: dict[str, dict[str, float]] = {}
    for move in search.moves:
        share = 1.0 / len(move.changes)
        for change in move.changes:
            gains[change.guest] = gains.get(change.guest, 0.0) + move.gain * share
            linear[change.guest] = linear.get(change.guest, 0.0) + move.linear_gain * share
            reasons.setdefault(change.guest, []).append(move.reason)
            if move.cost:
                costs[change.guest] = dict(move.cost)
    confidence = _confidences(search, model)

    actions: list[Action] = []
    by_guest: dict[str, list[int]] = {}

    def add(**kwargs) -> Action:
        action = Action(index=len(actions), **kwargs)
        actions.append(action)
        by_guest.setdefault(action.guest or "", []).append(action.index)
        return action

    def action_confidence(name: str) -> float:
        total, lin = gains.get(name, 0.0), linear.get(name, 0.0)
        rest = abs(total - lin)
        if abs(lin) + rest <= _EPS:
            return 1.0
        return float(min(1.0, max(0.0, (abs(lin) + confidence.get(name, 0.0) * rest) / (abs(lin) + rest))))

    order = []
    for move in search.moves:
        for change in move.changes:
            if change.guest not in order:
                order.append(change.guest)
    migrations_first = [n for n in order if n in search.migrated] + [n for n in order if n not in search.migrated]
    for name in migrations_first:
        original = search.original[name].placement
        host = search.hosts[search.host_of[name]]
        final = _with_pins(search, name, host, host.pins[name], original)
        if search.memory_nodes.get(name) is not None:
            final = replace(final, memory_nodes=search.memory_nodes[name],
                            cells=_relocated_cells(original, search.memory_nodes[name]))
        engine = next((c.placement for m in search.moves for c in m.changes
                       if c.guest == name and c.placement is not None), None)
        if engine is not None and final.host == engine.host:
            final = replace(engine, vcpupin=dict(sorted(host.pins[name].items())))
        text = "; ".join(reasons.get(name, []))
        gain = gains.get(name, 0.0)
        conf = action_confidence(name)
        if name in search.migrated:
            arrived = replace(original, host=final.host)
            add(kind="migrate", host=original.host, target_host=final.host, guest=name, before=original,
                after=arrived, reason=text, predicted_gain=gain, cost=costs.get(name, {}), confidence=conf)
            previous = arrived
            first = len(actions) - 1
            if (previous.vcpupin, previous.emulatorpin) != (final.vcpupin, final.emulatorpin):
                add(kind="repin", host=final.host, guest=name, before=previous,
                    after=replace(previous, vcpupin=final.vcpupin, emulatorpin=final.emulatorpin,
                                  exclusive_cpus=final.exclusive_cpus, dedicated=final.dedicated),
                    reason=f"pin {name} on arrival", predicted_gain=0.0, confidence=conf, depends_on=(first,))
                previous = actions[-1].after
            if previous.memory_nodes != final.memory_nodes and final.memory_nodes:
                add(kind="set_memory_nodes", host=final.host, guest=name, before=previous,
                    after=replace(previous, memory_nodes=final.memory_nodes, cells=final.cells),
                    reason=f"memory of {name} follows its vCPUs", confidence=conf,
                    depends_on=(len(actions) - 1,))
            continue
        pinned = replace(original, vcpupin=final.vcpupin, emulatorpin=final.emulatorpin,
                         exclusive_cpus=final.exclusive_cpus, dedicated=final.dedicated)
        if (original.vcpupin, original.emulatorpin) != (pinned.vcpupin, pinned.emulatorpin):
            add(kind="repin", host=original.host, guest=name, before=original, after=pinned, reason=text,
                predicted_gain=gain, cost=costs.get(name, {}), confidence=conf)
            gain = 0.0
        if name in search.memory_moved and final.memory_nodes != original.memory_nodes:
            previous = actions[-1].after if actions and actions[-1].guest == name else original
            deps = (len(actions) - 1,) if actions and actions[-1].guest == name else ()
            add(kind="set_memory_nodes", host=original.host, guest=name, before=previous,
                after=replace(previous, memory_nodes=final.memory_nodes, cells=final.cells),
                reason=f"memory of {name} follows its vCPUs", predicted_gain=gain,
                cost=costs.get(name, {}), confidence=conf, depends_on=deps)

    actions = _narrow_floating(search, actions)
    actions = _exclusive_dependencies(actions)
    affected = [n for n in search.guests
                if n in order or abs(search.start_perf.get(n, 0.0) - end_perf.get(n, 0.0)) > 1e-9]
    predicted = {name: {"before": search.start_perf.get(name, 0.0), "after": end_perf.get(name, 0.0)}
                 for name in sorted(affected)}
    if actions and min(a.confidence for a in actions) < settings.probe_below_confidence:
        hosts = sorted({a.target_host or a.host for a in actions})
        for host in hosts:
            deps = tuple(a.index for a in actions if (a.target_host or a.host) == host)
            actions.append(Action(index=len(actions), kind="probe", host=host,
                                  reason="measure the new layout with Freeze'nSense: the model's confidence "
                                         "in these moves is low",
                                  depends_on=deps, parameters={"seconds": settings.probe_seconds}))
    return actions, predicted


def _narrow_floating(search: _Search, actions: list[Action]) -> list[Action]:
    """Floating guests leave pCPUs that exclusive guests now own (refresh_shared_pins)."""
    result = list(actions)
    touched_hosts = {a.target_host or a.host for a in actions
                     if a.after is not None and (a.after.exclusive_cpus or a.before.exclusive_cpus)}
    for name in sorted(touched_hosts):
        host = search.hosts[name]
        current = [_current_for_refresh(search, n) for n in host.guests]
        for before, after in zip(current, refresh_shared_pins(host.topology, current)):
            if before == after or search.guests[before.guest].mode != FLOATING:
                continue
            if any(a.guest == before.guest for a in result):
                continue
            deps = tuple(a.index for a in result if (a.target_host or a.host) == name)
            result.append(Action(index=len(result), kind="repin", host=name, guest=before.guest,
                                 before=search.original[before.guest].placement,
                                 after=replace(search.original[before.guest].placement, vcpupin=after.vcpupin,
                                               emulatorpin=after.emulatorpin),
                                 reason="its shared pool shrank: pCPUs became exclusive to another guest",
                                 depends_on=deps))
    return result


def _current_for_refresh(search: _Search, name: str) -> Placement:
    guest = search.guests[name]
    host = search.hosts[search.host_of[name]]
    placement = search._current_placement(name)
    if guest.mode == EXCLUSIVE:
        return _with_pins(search, name, host, host.pins[name], placement)
    return replace(placement, exclusive_cpus=frozenset(), dedicated=False)


def _exclusive_dependencies(actions: list[Action]) -> list[Action]:
    """An exclusive guest moving onto pCPUs another action vacates waits for that action."""
    result = []
    for action in actions:
        deps = set(action.depends_on)
        if action.kind == "repin" and action.after is not None and action.after.exclusive_cpus:
            host = action.host
            target = action.after.exclusive_cpus
            for earlier in result:
                if earlier.guest == action.guest or earlier.kind not in ("repin", "migrate"):
                    continue
                if earlier.host == host and earlier.before is not None and earlier.before.pcpus & target:
                    deps.add(earlier.index)
        result.append(replace(action, depends_on=tuple(sorted(deps))))
    return result


def _confidences(search: _Search, model: InterferenceModel) -> dict[str, float]:
    """The model's confidence in each guest's prediction in the final layout."""
    result: dict[str, float] = {}
    for host in search.hosts.values():
        result.update(_host_confidences(host, model, search.betas))
    return result


def _host_confidences(host: _Host, model: InterferenceModel, betas: BetaTable) -> dict[str, float]:
    """Per guest on `host`: how much of its predicted interference rests on observed data.

    With no data at all every β is 0 and predictions are time sharing only;
    confidence is then 0 for interference, which the moves never rely on.
    """
    if betas.empty or not host.guests:
        return {name: 0.0 for name in host.guests}
    tenants = [Tenant(n, {v: (p or frozenset(host.usable)) for v, p in host.pins[n].items()},
                      key=g.key, workload_class=g.workload_class, load=g.load)
               for n, g in host.guests.items() if host.pins[n]]
    return {name: p.confidence for name, p in model.predict(host.topology, tenants).items()}


# --------------------------------------------------------------------------- public entry points
def plan_rebalance(
    state: ClusterState,
    model: InterferenceModel,
    settings: RebalanceSettings | None = None,
    *,
    now: float | None = None,
    last_moved: Mapping[str, float] | None = None,
    scope: Iterable[str] | None = None,
    hosts: Iterable[str] | None = None,
) -> Plan:
    """Search moves on a what-if copy of `state`; the resulting Plan (state "proposed").

    `now` and `last_moved` (guest -> epoch seconds of its last move) drive the
    cool-down; `scope` limits which guests may move (the others still count
    as load); `hosts` limits the hosts the plan may touch.
    """
    settings = settings or RebalanceSettings()
    if hosts is not None:
        allowed = set(hosts)
        unknown = sorted(allowed - set(state.hosts))
        if unknown:
            raise RebalanceInputError(f"hosts {unknown} are not in the cluster state")
        state = ClusterState({n: h for n, h in state.hosts.items() if n in allowed},
                             {n: g for n, g in state.guests.items() if g.host in allowed})
    search = _Search(state, model, settings, now, last_moved or {}, scope)
    before = search.total_objective()
    search.run()
    after = search.total_objective()
    actions, predicted = _build_actions(search, model)
    fixed = sorted(f"{g.name} ({g.why_fixed})" for g in search.guests.values() if g.mode == FIXED and g.why_fixed)
    moved = sum(1 for a in actions if a.kind != "probe")
    summary = (f"{moved} action(s); predicted objective {before:.3f} → {after:.3f}" if moved
               else f"no move clears the minimum gain of {settings.min_gain:g}: nothing to do")
    notes = {"fixed": fixed, "rejected": search.rejected[:20]}
    return Plan(
        actions=tuple(actions),
        hosts=tuple(sorted(state.hosts)),
        objective_before=before,
        objective_after=after,
        predicted=predicted,
        summary=summary,
        settings={**settings.to_dict(), "notes": notes},
        created_at=now,
    )


def evaluate_cluster(state: ClusterState, model: InterferenceModel,
                     settings: RebalanceSettings | None = None) -> tuple[float, dict[str, float]]:
    """(objective, each guest's predicted performance) of the state as it is."""
    search = _Search(state, model, settings or RebalanceSettings(), None, {}, None)
    return search.total_objective(), search.perf_by_guest()


def exhaustive_best(state: ClusterState, model: InterferenceModel, settings: RebalanceSettings | None = None,
                    host: str | None = None) -> tuple[float, dict[str, dict[int, frozenset[int]]]]:
    """The best layout of one host's movable pinned vCPUs by enumeration (tiny hosts, for checking).

    Every movable guest keeps its host; each of its single-pinned vCPUs may go
    to any pCPU its rules allow. Returns (objective of that host, guest -> pins).
    Raises RebalanceInputError when the host has more layouts than `exhaustive_limit`.
    """
    settings = settings or RebalanceSettings()
    search = _Search(state, model, settings, None, {}, None)
    name = host or next(iter(sorted(search.hosts)))
    target = search.hosts[name]
    slots = [(n, v) for n, g in target.guests.items() if g.mode in (PINNED, EXCLUSIVE)
             for v, pins in sorted(target.pins[n].items()) if len(pins) == 1]
    options = []
    for guest, vcpu in slots:
        nodes = _locality_nodes(target, target.guests[guest], target.pins[guest])
        cpus = set(target.usable)
        if nodes:
            cpus &= set().union(*(target.node_cpus[n] for n in nodes))
        options.append(sorted(cpus))
    count = math.prod(len(o) for o in options) if options else 1
    if count > settings.exhaustive_limit:
        raise RebalanceInputError(f"host {name}: {count} layouts exceed the exhaustive limit "
                                  f"{settings.exhaustive_limit}")
    base_pins = {n: dict(p) for n, p in target.pins.items()}
    best_value, best_layout = -math.inf, base_pins
    for choice in itertools.product(*options):
        layout = {n: dict(p) for n, p in base_pins.items()}
        for (guest, vcpu), cpu in zip(slots, choice):
            layout[guest][vcpu] = frozenset({cpu})
        for guest, pins in layout.items():
            target.set_pins(guest, pins)
        if search.violations(target, [g for g, _ in slots]):
            continue
        value = search.host_objective(target)
        if value > best_value + 1e-12:
            best_value, best_layout = value, layout
    for guest, pins in base_pins.items():
        target.set_pins(guest, pins)
    return best_value, best_layout
