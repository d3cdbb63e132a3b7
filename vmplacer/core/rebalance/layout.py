"""One host's what-if layout and the predicted performance of its guests.

The rebalance search judges thousands of candidate layouts per round, so a
layout must be cheap to evaluate: a host's static facts (pCPU indexes,
distances, usable pCPUs) are computed once, a layout is flattened into numpy
arrays (one "piece" per vCPU and pCPU it may run on), and the model's
interference coefficients are cached per guest identity. `utility` (from
`layout_problem`, shared with the exact solver) is each guest's term of the
objective described in `rebalance`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from vmplacer.core.model.interference import MULTIPLICATIVE, InterferenceModel, Tenant, distance_matrix, remaining
from vmplacer.core.rebalance import layout_moves
from vmplacer.core.rebalance.layout_problem import utility  # noqa: F401  (the search imports it from here)
from vmplacer.core.rebalance.state import EXCLUSIVE, FIXED, GuestState, HostState


# --------------------------------------------------------------------------- β table
_KEEPING_HOSTS = 8  # hosts at a time that keep their recent layouts' evaluations (`HostLayout.pieces`)
KEEP_CELLS = 1 << 24  # pair entries kept evaluations may hold (each several arrays of 8 bytes): 128 MiB an array
class BetaTable:
    """Interference coefficients β_c(u → v) between the guests' model identities, cached.

    Two workloads the model never observed but of the same workload class get
    the same coefficients, so identities are (known key) or (unknown, class):
    the number of distinct identities is bounded by what the model learned.
    """

    def __init__(self, model: InterferenceModel, optimism: float = 0.0, keep_cells: int | None = None):
        from vmplacer.core.topology.host import DistanceClass

        self.model = model
        # > 0: each β lowered by this many of its standard deviations (what the model may be
        # wrong by, as `HostLayout.pair_spread` counts it), never below min(β, 0): the layout the model
        # would pick were its doubtful pairs harmless, for exploration by trial
        self.optimism = optimism
        self.form = model.config.form  # how a guest's neighbours' losses combine (`remaining`)
        self.empty = model.observations == 0
        self._known = set(model.known_keys()) if not self.empty else set()
        self._classes = list(DistanceClass)
        self._pairs: dict[tuple[tuple[str, str], tuple[str, str], bool], np.ndarray] = {}
        # tensors per tuple of identities: a fleet's hosts draw their guests from the few identities
        # the model learned, so the same tuples recur on host after host (read only once made)
        self._tensors: dict[tuple[tuple[tuple[str, str], ...], bool], np.ndarray] = {}
        self.prior = None if self.empty else self._prior()
        # hosts keeping recent layouts' evaluations, the least lately used first: only a few at a
        # time, so a fleet's plan holds a few hosts' worth of them, not every host's
        self._keepers: dict[HostLayout, None] = {}
        # pair entries (piece × piece) the kept evaluations may hold together: past it, the hosts
        # used least lately drop theirs (computed again, the same floats, when asked again)
        self.keep_cells = KEEP_CELLS if keep_cells is None else keep_cells

    def keeping(self, host: HostLayout) -> None:
        """`host` keeps evaluations of its recent layouts; the hosts that kept some the least
        lately drop theirs once more than `_KEEPING_HOSTS` do, or once they hold more than
        `keep_cells` pair entries together (never the host just used)."""
        self._keepers.pop(host, None)
        self._keepers[host] = None
        cells = sum(keeper.kept_cells() for keeper in self._keepers)
        while len(self._keepers) > 1 and (len(self._keepers) > _KEEPING_HOSTS or cells > self.keep_cells):
            oldest = next(iter(self._keepers))
            del self._keepers[oldest]
            cells -= oldest.kept_cells()
            oldest.let_go()

    def _prior(self) -> np.ndarray:
        """[rank, 1, 1]: what any guest costs any other at each distance when nothing is known
        of either — the model's global mean, never less near than far (the topology's order)."""
        values = np.maximum(self._pair(("class", "\x00any"), ("class", "\x00any")), 0.0)
        for rank in range(len(values) - 2, 0, -1):
            values[rank] = max(values[rank], values[rank + 1])
        return values.reshape(-1, 1, 1)

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
        return self._tensor(tuple(identities), confidence=False)

    def confidence_tensor(self, identities: Sequence[tuple[str, str]]) -> np.ndarray | None:
        """[distance rank, background, foreground]: how much of each β rests on data."""
        if self.empty:
            return None
        return self._tensor(tuple(identities), confidence=True)

    def _tensor(self, identities: tuple[tuple[str, str], ...], confidence: bool) -> np.ndarray:
        found = self._tensors.get((identities, confidence))
        if found is None:
            k = len(identities)
            found = np.ones((len(self._classes), k, k)) if confidence else np.zeros((len(self._classes), k, k))
            for i, background in enumerate(identities):
                for j, foreground in enumerate(identities):
                    found[:, i, j] = self._pair(background, foreground, confidence=confidence)
            found.flags.writeable = False  # shared by every layout with these identities
            self._tensors[(identities, confidence)] = found
        return found

    def _pair(self, background: tuple[str, str], foreground: tuple[str, str], confidence: bool = False) -> np.ndarray:
        key = (background, foreground, confidence)
        found = self._pairs.get(key)
        if found is None:
            bg_key = background[1] if background[0] == "key" else f"\x00unknown:{background[1]}"
            fg_key = foreground[1] if foreground[0] == "key" else f"\x00unknown:{foreground[1]}"
            bg_class = background[1] if background[0] == "class" else "unknown"
            fg_class = foreground[1] if foreground[0] == "class" else "unknown"
            query = self.model.beta_confidence if confidence else self.model.beta
            found = np.array([1.0 if confidence else 0.0] + [
                query(bg_key, fg_key, cls, background_class=bg_class, foreground_class=fg_class)
                for cls in self._classes[1:]
            ])
            if self.optimism > 0 and not confidence:
                doubt = np.clip(1.0 - self._pair(background, foreground, confidence=True), 0.0, 1.0)
                k = max(self.model.config.confidence_evidence, 1e-9)
                sd = np.sqrt(self.model.noise_sd ** 2 * doubt / k + (doubt * np.abs(found).max()) ** 2)
                found = np.maximum(found - self.optimism * sd, np.minimum(found, 0.0))
                found[0] = 0.0
            self._pairs[key] = found
        return found


# --------------------------------------------------------------------------- one host's layout
PairTerms = tuple[list[tuple[str, int, int]], np.ndarray, np.ndarray]
_FEW_MOVED = 2  # candidates moving at most this many pieces get their interference matrix by update
# Bounds on what scoring candidates holds at once (entries of an array): a host of floating guests
# has thousands of pieces, and a stacked matrix per candidate would be C×P×P of them
CANDIDATE_CELLS = 1 << 20  # candidates × pieces scored in one pass (8 MiB per float array)
STACKED_CELLS = 1 << 22  # candidates × pieces × pieces stacked; above it, the loss is computed without
# layouts of more pieces than this score one-piece moves from the layout's own loss (O(P) per
# candidate, `HostLayout._moved_loss`) instead of a product per candidate (O(P²))
INCREMENTAL_ABOVE = 128
_RECENT_LAYOUTS = 4  # evaluated layouts kept per host: a fleet's worth stays well under its memory bound
RECENT_CELLS = 1 << 22  # … fewer on big layouts: as many as hold this many pair entries (at least one)
@dataclass
class LayoutPieces:
    """A host layout flattened for scoring: one piece per (vCPU, pCPU it may run on)."""

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
    # floating vCPUs of one guest over the same pCPUs, counted as one piece per pCPU (`MERGE_ABOVE`):
    # how many vCPUs each piece stands for (None: one each)
    vcpus_per_piece: np.ndarray | None = None
    # (loss of each piece as the layout stands, [pCPU, piece]: interference from each pCPU's pieces
    # at their full demand), cached for `HostLayout._moved_loss`
    by_cpu: tuple[np.ndarray, np.ndarray] | None = None
    # per-guest sums one-vCPU moves on big layouts are judged from (`layout_moves.GuestSums`), cached
    guest_sums: object | None = None
    matrix: np.ndarray | None = None  # interference between pieces, computed on first use
    current: tuple[np.ndarray, np.ndarray] | None = None  # `perf` of the layout itself, cached
    identities: tuple[tuple[str, str], ...] = ()  # model identity of each key index
    blind: LayoutPieces | None = None  # the same layout under the topology prior (every guest alike), cached
    terms: PairTerms | None = None  # `HostLayout.pair_terms` of the layout, cached
    spread: PairTerms | None = None  # `HostLayout.pair_spread` of the layout, cached
    load: np.ndarray | None = None  # demand on each pCPU as the layout stands, cached by `perf_moves`
    blind_base: float | None = None  # objective minus time sharing under the topology prior, cached
    reach: np.ndarray | None = None  # [pCPU, piece]: distance of each local pCPU to each piece's, cached
    piece_keys: list[tuple[str, int, int]] | None = None  # `HostLayout.pair_terms` keys, cached
    # (guest, vCPU) -> its piece, for vCPUs pinned to one pCPU (`HostLayout.set_pins` derives layouts by it)
    slots: dict[tuple[str, int], int] | None = None
    # the layout this one was derived from (its matrix made) and the pieces that moved: the
    # interference matrix (and the blind view's) is that one's with the moved rows and columns
    # looked up again
    parent: tuple[LayoutPieces, np.ndarray] | None = None

    def slot_of(self) -> dict[tuple[str, int], int]:
        """(guest, vCPU) -> piece, for the vCPUs pinned to exactly one pCPU (made on first use)."""
        if self.slots is None:
            self.slots = {(self.guests[self.vm[p]], int(self.vcpu[p])): p
                          for p in np.flatnonzero(self.single).tolist()}
        return self.slots


# layouts of more pieces than this count a floating guest's vCPUs that share their pCPUs as one
# piece per pCPU: the same predictions (each such vCPU's pieces are alike), a fraction of the pieces
MERGE_ABOVE = 128


def piece_count(layout: Mapping[str, Mapping[int, frozenset[int]]], usable: int) -> int:
    """How many pieces `HostLayout.pieces` makes of `layout` on a host of `usable` pCPUs (a vCPU
    with no pins floats over all of them)."""
    plain = _plain_count(layout, usable)
    if plain <= MERGE_ABOVE:
        return plain
    return sum(len(pins) or usable for pins_of in layout.values() for _, _, pins in _vcpu_groups(pins_of, True))


def _plain_count(layout: Mapping[str, Mapping[int, frozenset[int]]], usable: int) -> int:
    """Pieces of `layout` with one per vCPU and pCPU it may run on (none merged)."""
    return sum(len(pins) or usable for pins_of in layout.values() for pins in pins_of.values())


def _vcpu_groups(pins: Mapping[int, frozenset[int]], merge: bool) -> list[tuple[int, int, frozenset[int]]]:
    """(first vCPU, how many vCPUs, their pCPUs) in vCPU order: each vCPU alone, or, with
    `merge`, the floating vCPUs (more than one pCPU, or none: the host) that share their pCPUs
    together at the first of them."""
    if not merge:
        return [(v, 1, cpus) for v, cpus in sorted(pins.items())]
    groups: dict[frozenset[int], list[int]] = {}
    result: list[tuple[int, int, frozenset[int]]] = []
    for v, cpus in sorted(pins.items()):
        if len(cpus) == 1:
            result.append((v, 1, cpus))
        else:
            groups.setdefault(cpus, []).append(v)
    result += [(vcpus[0], len(vcpus), cpus) for cpus, vcpus in groups.items()]
    return sorted(result)


class HostLayout:
    """One host's what-if layout and the static facts it is scored with (pCPU indexes,
    distances, usable pCPUs): what every stage of the policy moves guests on and predicts
    performance from, without touching the host."""

    def __init__(self, state: HostState, betas: BetaTable):
        topo = state.topology
        self.state = state
        # candidate × piece entries scored on this host so far: what the search's time on it is
        # made of, counted alike on any machine (`budget.host_work_limit`)
        self.work = 0
        self.name = state.name
        self.topology = topo
        self.cpus = sorted(c for c in topo.cpus if topo.cpus[c].online)
        self.index = {c: i for i, c in enumerate(self.cpus)}
        self.dist = distance_matrix(topo, np.array(self.cpus, dtype=np.int64))
        self.usable = frozenset(topo.usable_cpus)
        self.node_of = {c: topo.cpus[c].node for c in self.cpus}
        online = set(self.cpus)
        self.siblings = {c: topo.siblings(c) & online for c in self.cpus}
        self.node_cpus: dict[int, frozenset[int]] = {}
        for cpu in self.cpus:
            self.node_cpus[self.node_of[cpu]] = self.node_cpus.get(self.node_of[cpu], frozenset()) | {cpu}
        self.betas = betas
        self.reserved_kib = state.options.reserved_memory_mib_per_node * 1024
        self.guests: dict[str, GuestState] = {}
        self.pins: dict[str, dict[int, frozenset[int]]] = {}
        self._pieces: LayoutPieces | None = None
        # since `_pieces` was dropped by `set_pins`: the evaluation it dropped and the one-pCPU
        # vCPUs that moved since, (guest, vCPU) -> local pCPU index; None when the pins changed
        # otherwise (a layout is then flattened anew)
        self._derive: tuple[LayoutPieces, dict[tuple[str, int], int]] | None = None
        # evaluations of the layouts the guests here had lately, by their pins: the search tries a
        # move and takes it back, or sets pins aside and restores them, many times over one layout
        self._recent: dict[tuple[tuple[str, tuple[tuple[int, frozenset[int]], ...]], ...], LayoutPieces] = {}
        self._peers: dict[str, frozenset[str]] | None = None  # anti-affinity peers present, per guest
        # (the guests as they were, the ones among them that own pCPUs): the rules ask who owns
        # pCPUs for every candidate pCPU of every vCPU, and the guests rarely change
        self._owners: tuple[tuple[GuestState, ...], list[str]] = ((), [])

    # ----- layout -------------------------------------------------------------------------
    def add(self, guest: GuestState, pins: Mapping[int, frozenset[int]]) -> None:
        self.guests[guest.name] = guest
        self.pins[guest.name] = dict(pins)
        self._pieces = None
        self._derive = None
        self._recent.clear()
        self._peers = None

    def remove(self, name: str) -> None:
        del self.guests[name]
        del self.pins[name]
        self._pieces = None
        self._derive = None
        self._recent.clear()
        self._peers = None

    def set_pins(self, name: str, pins: Mapping[int, frozenset[int]], *, pieces: LayoutPieces | None = None) -> None:
        """`pieces`: the evaluation of the layout these pins restore (taking a tried move back),
        kept instead of computed again. Else, when only vCPUs pinned to one pCPU move to another
        one, the next evaluation is derived from the last (the same arrays, but their pCPUs)."""
        old = self.pins.get(name)
        self.pins[name] = dict(pins)
        if pieces is None and old == self.pins[name]:
            return  # the same layout: its evaluation stands
        self._pieces, dropped = pieces, self._pieces
        if pieces is not None:
            self._derive = None
            return
        if dropped is not None:
            self._derive = (dropped, {})
        if self._derive is None:
            return
        if old is None or old.keys() != pins.keys():
            self._derive = None
            return
        moved = self._derive[1]
        for vcpu, cpus in pins.items():
            before = old[vcpu]
            if cpus == before:
                continue
            if len(cpus) != 1 or len(before) != 1:
                self._derive = None
                return
            moved[(name, vcpu)] = self.index[next(iter(cpus))]

    def owners(self) -> list[str]:
        """The guests that own pCPUs (exclusive, or fixed with exclusive pCPUs), in guest order;
        recomputed only when a guest here was added, removed or replaced."""
        guests = tuple(self.guests.values())
        if guests != self._owners[0]:
            self._owners = (guests, [name for name, guest in self.guests.items()
                                     if guest.mode == EXCLUSIVE
                                     or guest.mode == FIXED and guest.placement.exclusive_cpus])
        return self._owners[1]

    def owned_by_others(self, name: str | None) -> frozenset[int]:
        """pCPUs exclusive guests other than `name` own (isolate guests: their whole cores)."""
        owned: set[int] = set()
        for other in self.owners():
            guest = self.guests[other]
            if other == name:
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

    def anti_affine_nodes(self, name: str) -> frozenset[int]:
        """Nodes where a guest `name` refuses to share a node with (or that refuses `name`) has pinned vCPUs.

        Anti-affinity is per NUMA node, as in the placement engine; floating
        vCPUs sit on no node in particular and do not count.
        """
        if self._peers is None:
            peers: dict[str, set[str]] = {}
            for other, guest in self.guests.items():
                for peer in guest.anti_affinity:
                    if peer in self.guests and peer != other:
                        peers.setdefault(other, set()).add(peer)
                        peers.setdefault(peer, set()).add(other)
            self._peers = {n: frozenset(p) for n, p in peers.items()}
        return frozenset(self.node_of[c] for peer in self._peers.get(name, ())
                         for cpus in self.pins[peer].values() for c in cpus)

    def allowed(self, name: str, vcpu: int | None = None, node: int | None = None,
                ignore_locality: bool = False) -> frozenset[int]:
        """pCPUs a vCPU of `name` may move to (every rule that concerns one vCPU at a time)."""
        guest = self.guests[name]
        base = set(self.usable)
        if node is not None:
            nodes = {node}
        else:
            nodes = set() if ignore_locality else locality_nodes(self, guest, self.pins[name])
        if nodes:
            base &= set().union(*(self.node_cpus.get(n, frozenset()) for n in nodes))
        base -= self.owned_by_others(name)
        for refused in self.anti_affine_nodes(name):
            base -= self.node_cpus.get(refused, frozenset())
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
               guests: Mapping[str, GuestState] | None = None) -> LayoutPieces:
        if layout is None and self._pieces is not None:
            return self._pieces
        signature = None
        if layout is None:
            signature = tuple((name, tuple(sorted(pins.items()))) for name, pins in self.pins.items())
            self._pieces = self._recent.get(signature)
            if self._pieces is not None:
                self._derive = None
                return self._pieces
            if self._derive is not None:
                result = _derived(*self._derive)
                self._derive = None
                return self._keep(signature, result)
        layout = self.pins if layout is None else layout
        guests = self.guests if guests is None else guests
        names = list(layout)
        identities: dict[tuple[str, str], int] = {}
        vm, vcpu, cpu, demand, key, single = [], [], [], [], [], []
        everywhere = sorted(self.usable) or self.cpus
        merge = _plain_count(layout, len(everywhere)) > MERGE_ABOVE
        times: list[int] = []
        for g, name in enumerate(names):
            guest = guests[name]
            ident = identities.setdefault(self.betas.identity(guest), len(identities))
            for v, count, pins in _vcpu_groups(layout[name], merge):
                allowed = sorted(pins) if pins else everywhere
                share = guest.load / len(allowed) * count
                for c in allowed:
                    vm.append(g)
                    vcpu.append(v)
                    cpu.append(self.index[c])
                    demand.append(share)
                    key.append(ident)
                    single.append(len(allowed) == 1)
                    times.append(count)
        vm_a = np.asarray(vm, dtype=np.int64)
        onehot = np.zeros((len(vm), len(names)))
        if len(vm):
            onehot[np.arange(len(vm)), vm_a] = 1.0
        result = LayoutPieces(
            guests=names, vm=vm_a, vcpu=np.asarray(vcpu, dtype=np.int64),
            cpu=np.asarray(cpu, dtype=np.int64), demand=np.asarray(demand, dtype=float),
            key=np.asarray(key, dtype=np.int64), table=self.betas.tensor(list(identities)),
            onehot=onehot,
            ideal=np.array([guests[n].ideal for n in names], dtype=float),
            weight=np.array([guests[n].weight for n in names], dtype=float),
            single=np.asarray(single, dtype=bool),
            identities=tuple(identities),
            vcpus_per_piece=np.asarray(times, dtype=float) if merge and max(times, default=1) > 1 else None,
        )
        if layout is self.pins:
            self._pieces = result
            if signature is not None:
                self._keep(signature, result)
        return result

    def _keep(self, signature: tuple, result: LayoutPieces) -> LayoutPieces:
        """`result` is the evaluation of the layout as it is, and one of its recent ones (fewer
        of them on big layouts: each holds several piece × piece arrays)."""
        self._pieces = result
        kept = max(1, min(_RECENT_LAYOUTS, RECENT_CELLS // max(self._cells_of(result), 1)))
        while len(self._recent) >= kept:
            del self._recent[next(iter(self._recent))]
        self._recent[signature] = result
        self.betas.keeping(self)
        return result

    def kept_cells(self) -> int:
        """Pair entries (piece × piece) of the evaluations this host keeps."""
        kept = {id(pieces): self._cells_of(pieces) for pieces in self._recent.values()}
        if self._pieces is not None:
            kept[id(self._pieces)] = self._cells_of(self._pieces)
        return sum(kept.values())

    def _cells_of(self, pieces: LayoutPieces) -> int:
        """Entries an evaluation of `pieces` may hold: piece × piece arrays, or past
        `layout_moves.DENSE_JUDGE_PIECES` pCPU × piece ones, for the layout and its blind view."""
        size = len(pieces.cpu)
        return 2 * len(self.cpus) * size if size > layout_moves.DENSE_JUDGE_PIECES else size * size

    def holds(self, pieces: LayoutPieces) -> None:
        """A piece × piece array was just computed on `pieces`: when they are an evaluation this host
        keeps, the host counts against the kept-cells budget again (it may have let go before, and
        arrays computed since would otherwise stay past the budget, host after host)."""
        if pieces is self._pieces or any(pieces is kept for kept in self._recent.values()):
            self.betas.keeping(self)

    def let_go(self) -> None:
        """Drop what was computed of this host's layouts (its recent ones, the matrices of the one
        as it is): asked again, it is computed again from the same pieces, the same floats."""
        self._recent.clear()
        self._derive = None
        if self._pieces is not None:
            _unload(self._pieces)

    def perf(self, pieces: LayoutPieces, cpu: np.ndarray, moved: np.ndarray | None = None,
             blocks: list[tuple[int, int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate (rows of `cpu`, C×P): each guest's predicted performance (C×V), and the
        same from time sharing alone (the linear predictor). `moved` (optional, C×2): the two
        pieces each candidate moves, in increasing order, when the caller knows them (swaps).
        `blocks` (optional): row ranges scored as if each were its own call (the same floats)."""
        same = cpu is pieces.cpu
        if same and pieces.current is not None:
            return pieces.current
        if cpu.ndim == 1:
            cpu = cpu[None, :]
        count, size = cpu.shape
        if size == 0:
            empty = np.zeros((count, len(pieces.guests)))
            return empty, empty
        if not same and count > 1 and count * size > CANDIDATE_CELLS:
            return self._perf_in_chunks(pieces, cpu, moved, blocks)
        return self._perf_rows(pieces, cpu, same, moved, blocks)

    def _perf_rows(self, pieces: LayoutPieces, cpu: np.ndarray, same: bool, moved: np.ndarray | None,
                   blocks: list[tuple[int, int]] | None) -> tuple[np.ndarray, np.ndarray]:
        """`perf` of the candidates `cpu` (C×P) in one pass."""
        count, size = cpu.shape
        self.work += count * size
        n = len(self.cpus)
        slots = (cpu + (np.arange(count) * n)[:, None]).ravel()
        load = np.bincount(slots, weights=np.repeat(pieces.demand[None, :], count, axis=0).ravel(), minlength=count * n)
        granted = pieces.demand[None, :] * np.minimum(1.0, 1.0 / np.maximum(load[slots].reshape(count, size), 1e-12))
        linear = self._per_guest(pieces, granted) if blocks is None else self._per_guest_blocks(pieces, granted, blocks)
        if pieces.table is None:
            result = (linear, linear)
        elif same:
            if layout_moves.scored_big(self, pieces):
                loss = layout_moves.guest_sums(self, pieces).loss[None, :]
            else:
                loss = granted @ _interference_matrix(self, pieces).T
            result = (self._per_guest(pieces, granted * remaining(loss, self.betas.form)), linear)
        else:
            result = (self._interfered(pieces, cpu, granted, moved, blocks), linear)
        if same:
            pieces.current = result
        return result

    def _interfered(self, pieces: LayoutPieces, cpu: np.ndarray, granted: np.ndarray,
                    pairs: np.ndarray | None = None, blocks: list[tuple[int, int]] | None = None) -> np.ndarray:
        assert pieces.table is not None
        loss: np.ndarray | None = None
        if layout_moves.scored_big(self, pieces):
            loss = layout_moves.moved_loss(self, pieces, cpu, granted)
            if loss is not None:
                got = granted * remaining(loss, self.betas.form)
                return self._per_guest(pieces, got) if blocks is None else self._per_guest_blocks(pieces, got, blocks)
        if pairs is None and len(cpu) and (moved := cpu != pieces.cpu[None, :]).sum(axis=1).max() <= _FEW_MOVED:
            # each candidate's moved pieces first; a candidate that moves fewer takes unmoved ones
            # too, whose rows and columns come out as they were
            pairs = np.argsort(~moved, axis=1, kind="stable")[:, :_FEW_MOVED]
        if pairs is not None and len(cpu) * cpu.shape[1] ** 2 > STACKED_CELLS:
            loss = self._loss_moved(pieces, cpu, granted, pairs)
        elif pairs is not None:
            matrix = self._matrices_moved(pieces, cpu, pairs)
        elif len(cpu) * cpu.shape[1] ** 2 > STACKED_CELLS:
            loss = np.stack([granted[c] @ _pair_lookup(self, replace(pieces, cpu=cpu[c]), pieces.table, masked=True).T
                             for c in range(len(cpu))])
        else:
            dist = self.dist[cpu[:, :, None], cpu[:, None, :]]  # [c, x, y]
            k = pieces.table.shape[1]
            beta = pieces.table.reshape(-1)[dist * (k * k) + pieces.key[None, None, :] * k + pieces.key[None, :, None]]
            other = (pieces.vm[:, None] != pieces.vm[None, :])[None, :, :] & (dist != 0)
            matrix = np.where(other, beta, 0.0)
        if loss is None:
            loss = np.einsum("cxy,cy->cx", matrix, granted)
        got = granted * remaining(loss, self.betas.form)
        return self._per_guest(pieces, got) if blocks is None else self._per_guest_blocks(pieces, got, blocks)

    def _matrices_moved(self, pieces: LayoutPieces, cpu: np.ndarray, moved: np.ndarray) -> np.ndarray:
        """[c, x, y]: the interference matrix of each candidate that moves at most `_FEW_MOVED`
        pieces (a swap moves two; `moved`, C×_FEW_MOVED: those pieces): the layout's own matrix
        with only the moved pieces' rows and columns looked up again — the same entries a full
        look-up gives, at a fraction of it."""
        assert pieces.table is not None
        count = len(cpu)
        rows = np.arange(count)
        result = np.repeat(_interference_matrix(self, pieces)[None, :, :], count, axis=0)
        k = pieces.table.shape[1]
        flat = pieces.table.reshape(-1)
        for j in moved.T:
            at = cpu[rows, j][:, None]
            other = pieces.vm[None, :] != pieces.vm[j][:, None]
            dist = self.dist[at, cpu]  # [c, y]: j's pCPU to y's
            result[rows, j, :] = np.where(other & (dist != 0),
                                          flat[dist * (k * k) + pieces.key[None, :] * k + pieces.key[j][:, None]], 0.0)
            dist = self.dist[cpu, at]  # [c, x]: x's pCPU to j's
            result[rows, :, j] = np.where(other & (dist != 0),
                                          flat[dist * (k * k) + pieces.key[j][:, None] * k + pieces.key[None, :]], 0.0)
        return result

    def _loss_moved(self, pieces: LayoutPieces, cpu: np.ndarray, granted: np.ndarray,
                    moved: np.ndarray) -> np.ndarray:
        """[c, x]: what `_matrices_moved` times the granted shares gives, without stacking a
        matrix per candidate: the layout's matrix times each candidate's shares, its moved
        pieces' columns corrected and their rows looked up anew — memory C×P, not C×P×P."""
        assert pieces.table is not None
        matrix = _interference_matrix(self, pieces)
        count = len(cpu)
        rows = np.arange(count)
        k = pieces.table.shape[1]
        flat = pieces.table.reshape(-1)
        loss = granted @ matrix.T
        seen = np.full(count, -1, dtype=np.int64)
        for j in moved.T:
            fresh = j != seen  # a piece named twice in a row is corrected once
            at = cpu[rows, j][:, None]
            other = pieces.vm[None, :] != pieces.vm[j][:, None]
            dist = self.dist[cpu, at]  # [c, x]: x's pCPU to j's
            column = np.where(other & (dist != 0),
                              flat[dist * (k * k) + pieces.key[j][:, None] * k + pieces.key[None, :]], 0.0)
            loss += ((column - matrix[:, j].T) * (granted[rows, j] * fresh)[:, None])
            seen = j
        for j in moved.T:
            at = cpu[rows, j][:, None]
            other = pieces.vm[None, :] != pieces.vm[j][:, None]
            dist = self.dist[at, cpu]  # [c, y]: j's pCPU to y's
            row = np.where(other & (dist != 0),
                           flat[dist * (k * k) + pieces.key[None, :] * k + pieces.key[j][:, None]], 0.0)
            loss[rows, j] = (row * granted).sum(axis=1)
        return loss

    def _perf_in_chunks(self, pieces: LayoutPieces, cpu: np.ndarray, moved: np.ndarray | None,
                        blocks: list[tuple[int, int]] | None) -> tuple[np.ndarray, np.ndarray]:
        """`perf` of many candidates, a bounded number of rows at a time (whole blocks together
        when blocks are given): memory stays near `CANDIDATE_CELLS` per array, whatever the
        number of candidates."""
        step = max(1, CANDIDATE_CELLS // cpu.shape[1])
        spans = blocks or [(start, min(start + step, len(cpu))) for start in range(0, len(cpu), step)]
        parts = []
        for group in _batches(spans, step):
            begin, end = group[0][0], group[-1][1]
            parts.append(self._perf_rows(pieces, cpu[begin:end], False, None if moved is None else moved[begin:end],
                                         None if blocks is None else [(a - begin, b - begin) for a, b in group]))
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def perf_moves(self, pieces: LayoutPieces, m: int, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`perf` for candidates that each move piece `m` to one of `targets` (local pCPU indexes).

        Only row and column m of the interference matrix change, so the loss is
        the current matrix times the new time shares, corrected for m: a
        matrix product instead of a fresh C×P×P gather.
        """
        self.work += len(targets) * len(pieces.cpu)
        cpu, granted, linear = self._moved_shares(pieces, m, targets)
        if pieces.table is None:
            return linear, linear
        return self._moved_interfered(pieces, m, targets, granted), linear

    def perf_moves_blind(self, pieces: LayoutPieces, blind: LayoutPieces | None, m: int,
                         targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """`perf_moves` of the layout and the performance part of `perf_moves` of its `blind` view
        (the same pieces under another table): both share the time shares, computed once."""
        cpu, granted, linear = self._moved_shares(pieces, m, targets)
        if pieces.table is None:
            return linear, linear, None if blind is None else linear
        dist, valid = self._moved_reach(pieces, m, targets)
        perf = self._moved_interfered(pieces, m, targets, granted, dist, valid)
        if blind is None:
            return perf, linear, None
        blind_perf = linear if blind.table is None else self._moved_interfered(blind, m, targets, granted, dist, valid)
        return perf, linear, blind_perf

    def perf_moves_blind_many(self, pieces: LayoutPieces, blind: LayoutPieces | None, moved: np.ndarray,
                              targets: np.ndarray,
                              blocks: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """`perf_moves_blind` for the candidates of several pieces at once: row r moves piece
        `moved[r]` to `targets[r]`; `blocks`: each piece's rows, in order. Every entry is the
        same arithmetic as `perf_moves_blind` of that piece alone — elementwise steps and row
        sums over all rows at once, the matrix products block by block on the very shapes one
        piece alone has — so each block's numbers are the same floats; a host's best single
        moves cost one pass instead of one per piece (or a few, whole blocks at a time, when
        the candidates × pieces would exceed `CANDIDATE_CELLS`)."""
        step = max(1, CANDIDATE_CELLS // max(len(pieces.cpu), 1))
        if len(targets) > step and len(blocks) > 1:
            parts = [self.perf_moves_blind_many(pieces, blind, moved[g[0][0]:g[-1][1]], targets[g[0][0]:g[-1][1]],
                                                [(a - g[0][0], b - g[0][0]) for a, b in g])
                     for g in _batches(blocks, step)]
            joined = [np.concatenate([part[i] for part in parts]) for i in (0, 1)]
            blind_parts = [part[2] for part in parts]
            return (joined[0], joined[1],
                    None if blind_parts[0] is None else np.concatenate(blind_parts))  # type: ignore[arg-type]
        self.work += len(targets) * len(pieces.cpu)
        if layout_moves.applies(self, pieces) and bool((targets != pieces.cpu[moved]).all()):
            perf, linear = layout_moves.moves_perf(self, pieces, moved, targets)
            if blind is None:
                return perf, linear, None
            if blind.table is None:
                return perf, linear, linear
            return perf, linear, layout_moves.moves_perf(self, blind, moved, targets)[0]
        cpu, granted, linear = self._moved_shares_many(pieces, moved, targets, blocks)
        if pieces.table is None:
            return linear, linear, None if blind is None else linear
        if pieces.reach is None:
            pieces.reach = self.dist[:, pieces.cpu]
        dist = pieces.reach.take(targets, axis=0)
        valid = (pieces.vm[None, :] != pieces.vm[moved][:, None]) & (dist != 0)
        perf = self._moved_interfered_many(pieces, moved, targets, granted, dist, valid, blocks)
        if blind is None:
            return perf, linear, None
        blind_perf = linear if blind.table is None else self._moved_interfered_many(blind, moved, targets, granted, dist,
                                                                                    valid, blocks)
        return perf, linear, blind_perf

    def _moved_shares_many(self, pieces: LayoutPieces, moved: np.ndarray, targets: np.ndarray,
                           blocks: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_moved_shares`, row r moving piece `moved[r]` (no target is the piece's own pCPU)."""
        count = len(targets)
        n = len(self.cpus)
        rows = np.arange(count)
        cpu = np.repeat(pieces.cpu[None, :], count, axis=0)
        cpu[rows, moved] = targets
        if pieces.load is None:
            pieces.load = np.bincount(pieces.cpu, weights=pieces.demand, minlength=n)
        load = np.repeat(pieces.load[None, :], count, axis=0)
        share = pieces.demand[moved]
        load[rows, pieces.cpu[moved]] -= share
        load[rows, targets] += share
        granted = pieces.demand[None, :] * np.minimum(1.0, 1.0 / np.maximum(load[rows[:, None], cpu], 1e-12))
        return cpu, granted, self._per_guest_blocks(pieces, granted, blocks)

    def _moved_interfered_many(self, pieces: LayoutPieces, moved: np.ndarray, targets: np.ndarray,
                               granted: np.ndarray, dist: np.ndarray, valid: np.ndarray,
                               blocks: list[tuple[int, int]]) -> np.ndarray:
        """`_moved_interfered`, row r moving piece `moved[r]` to `targets[r]`."""
        assert pieces.table is not None
        if layout_moves.scored_big(self, pieces):
            got = granted * remaining(self._big_moved_loss(pieces, moved, targets, granted), self.betas.form)
            return self._per_guest_blocks(pieces, got, blocks)
        matrix = _interference_matrix(self, pieces)
        loss = self._moved_loss(pieces, matrix, moved, targets, granted)
        if loss is None:
            loss = _blocks_product(granted, matrix.T, blocks)
        rows = np.arange(len(moved))
        mine = granted[rows, moved]  # each row's granted share of its moved piece
        loss -= mine[:, None] * matrix[:, moved].T  # np.outer's products, row by row
        k = pieces.table.shape[1]
        flat = pieces.table.reshape(-1)
        if k == 1:
            caused = suffered = np.where(valid, flat[dist], 0.0)
        else:
            key = pieces.key[moved][:, None]
            caused = np.where(valid, flat[dist * (k * k) + key * k + pieces.key[None, :]], 0.0)
            suffered = np.where(valid, flat[dist * (k * k) + pieces.key[None, :] * k + key], 0.0)
        loss += caused * mine[:, None]
        loss[rows, moved] = (suffered * granted).sum(axis=1)
        return self._per_guest_blocks(pieces, granted * remaining(loss, self.betas.form), blocks)

    def _big_moved_loss(self, pieces: LayoutPieces, moved: np.ndarray, targets: np.ndarray,
                        granted: np.ndarray) -> np.ndarray:
        """Σ β·g per piece of candidates that each move one piece, on a big layout: from its
        per-guest sums (`layout_moves.moved_loss`), no piece × piece matrix."""
        cpu = np.repeat(pieces.cpu[None, :], len(targets), axis=0)
        cpu[np.arange(len(targets)), moved] = targets
        loss = layout_moves.moved_loss(self, pieces, cpu, granted)
        assert loss is not None  # one piece moved
        return loss

    def _moved_loss(self, pieces: LayoutPieces, matrix: np.ndarray, moved: np.ndarray, targets: np.ndarray,
                    granted: np.ndarray) -> np.ndarray | None:
        """granted @ matrix.T of candidates that each move one piece (row r: `moved[r]` to local
        pCPU `targets[r]`; `granted[r]`: the shares that gives), from the layout's own loss: only
        the pieces on the two pCPUs whose load changed get other shares, each pCPU's scaled by
        one factor, so a row costs O(P) instead of O(P²). None on layouts of at most
        `INCREMENTAL_ABOVE` pieces: the product is then computed whole, the same floats as ever."""
        size = len(pieces.cpu)
        if size <= INCREMENTAL_ABOVE:
            return None
        n = len(self.cpus)
        if pieces.load is None:
            pieces.load = np.bincount(pieces.cpu, weights=pieces.demand, minlength=n)
        load = pieces.load
        if pieces.by_cpu is None:
            now = pieces.demand * _speed(load[pieces.cpu])
            order = np.argsort(pieces.cpu, kind="stable")
            held, starts = np.unique(pieces.cpu[order], return_index=True)
            by_cpu = np.zeros((n, size))  # [pCPU, x]: rows, so that a candidate's pCPU is one read
            by_cpu[held] = np.add.reduceat((matrix.T * pieces.demand[:, None])[order], starts, axis=0)
            pieces.by_cpu = (matrix @ now, by_cpu)
        base, by_cpu = pieces.by_cpu
        source = pieces.cpu[moved]
        demand = pieces.demand[moved]
        stays = np.where(source == targets, demand, 0.0)
        left = _speed(load[source] - demand + stays) - _speed(load[source])
        joined = _speed(load[targets] + demand - stays) - _speed(load[targets])
        column = matrix[:, moved].T  # [c, x]: β of the moved piece on x, where it was
        mine = granted[np.arange(len(moved)), moved] - demand * _speed(load[source])
        return (base[None, :] + left[:, None] * (by_cpu[source] - column * demand[:, None])
                + joined[:, None] * by_cpu[targets] + column * mine[:, None])

    @staticmethod
    def _per_guest_blocks(pieces: LayoutPieces, got: np.ndarray, blocks: list[tuple[int, int]]) -> np.ndarray:
        """`_per_guest` of each block of rows (its product on the block's own shape)."""
        return np.maximum(_blocks_product(got, pieces.onehot, blocks), 0.0) / pieces.ideal[None, :]

    def _moved_shares(self, pieces: LayoutPieces, m: int,
                      targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(candidate pCPUs, granted time shares, linear performance) of moving piece `m` to each
        of `targets`."""
        count = len(targets)
        n = len(self.cpus)
        cpu = np.repeat(pieces.cpu[None, :], count, axis=0)
        cpu[:, m] = targets
        if pieces.load is None:
            pieces.load = np.bincount(pieces.cpu, weights=pieces.demand, minlength=n)
        load = np.repeat(pieces.load[None, :], count, axis=0)
        rows = np.arange(count)
        load[:, pieces.cpu[m]] -= pieces.demand[m]
        load[rows, targets] += pieces.demand[m]
        granted = pieces.demand[None, :] * np.minimum(1.0, 1.0 / np.maximum(load[rows[:, None], cpu], 1e-12))
        return cpu, granted, self._per_guest(pieces, granted)

    def _moved_reach(self, pieces: LayoutPieces, m: int, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[c, x]: the distance of x's pCPU to m's new pCPU in each candidate, and whether x and m
        interfere there (other guests, other pCPUs). The pCPUs' distances to every piece are
        looked up once per layout (`LayoutPieces.reach`): each candidate takes its target's row."""
        if pieces.reach is None:
            pieces.reach = self.dist[:, pieces.cpu]
        dist = pieces.reach.take(targets, axis=0)
        return dist, (pieces.vm[None, :] != pieces.vm[m]) & (dist != 0)

    def _moved_interfered(self, pieces: LayoutPieces, m: int, targets: np.ndarray, granted: np.ndarray,
                          dist: np.ndarray | None = None, valid: np.ndarray | None = None) -> np.ndarray:
        """Performance with interference of the candidates of `_moved_shares` (`dist`, `valid`:
        `_moved_reach`, which a layout and its blind view share)."""
        assert pieces.table is not None
        if layout_moves.scored_big(self, pieces):
            big = self._big_moved_loss(pieces, np.full(len(granted), m), targets, granted)
            return self._per_guest(pieces, granted * remaining(big, self.betas.form))
        matrix = _interference_matrix(self, pieces)
        loss = self._moved_loss(pieces, matrix, np.full(len(granted), m), targets, granted)
        if loss is None:
            loss = granted @ matrix.T
        loss -= np.outer(granted[:, m], matrix[:, m])
        if dist is None or valid is None:
            dist, valid = self._moved_reach(pieces, m, targets)
        k = pieces.table.shape[1]
        flat = pieces.table.reshape(-1)
        if k == 1:  # one identity (the blind view): what m causes is what it suffers
            caused = suffered = np.where(valid, flat[dist], 0.0)
        else:
            caused = np.where(valid, flat[dist * (k * k) + pieces.key[m] * k + pieces.key[None, :]], 0.0)
            suffered = np.where(valid, flat[dist * (k * k) + pieces.key[None, :] * k + pieces.key[m]], 0.0)
        loss += caused * granted[:, m][:, None]
        loss[:, m] = (suffered * granted).sum(axis=1)
        return self._per_guest(pieces, granted * remaining(loss, self.betas.form))

    def pair_terms(self, pieces: LayoutPieces) -> PairTerms:
        """Each piece's identity (guest, vCPU, pCPU); per pair [x, y] the weighted performance y's
        interference takes from x, and the model's confidence in that coefficient (cached on the
        layout: every move judged from it asks again; read only)."""
        if pieces.terms is None:
            pieces.terms = _read_only(self._pair_terms(pieces))
            self.holds(pieces)
        return pieces.terms

    def pair_keys(self, pieces: LayoutPieces) -> list[tuple[str, int, int]]:
        """`pair_terms`' keys alone: each piece's (guest, vCPU, pCPU), cached."""
        if pieces.piece_keys is None:
            guests, cpus = pieces.guests, self.cpus
            pieces.piece_keys = [(guests[g], v, cpus[c]) for g, v, c in
                                 zip(pieces.vm.tolist(), pieces.vcpu.tolist(), pieces.cpu.tolist())]
        return pieces.piece_keys

    def pair_lines(self, pieces: LayoutPieces, which: np.ndarray, columns: bool) -> tuple[np.ndarray, np.ndarray]:
        """The rows of `pair_terms`' terms and confidences for the pieces `which` (with `columns`:
        their columns, one line per piece): the same entries, looked up for those pieces alone —
        O(len(which) × P), no P × P array — unless the whole arrays are already at hand."""
        if pieces.terms is not None:
            _, terms, conf = pieces.terms
            return (terms[:, which].T, conf[:, which].T) if columns else (terms[which], conf[which])
        size = len(self.pair_keys(pieces))
        if pieces.table is None or not size:
            zero = np.zeros((len(which), size))
            return zero, zero
        granted, scale = self._pair_scale(pieces)
        conf_table = self.betas.confidence_tensor(list(pieces.identities))
        assert conf_table is not None
        cpu, key, vm = pieces.cpu, pieces.key, pieces.vm
        k = pieces.table.shape[1]
        if columns:  # [x, j]: what piece j of `which` does to every x
            dist = self.dist[cpu[:, None], cpu[which][None, :]]
            index = dist * (k * k) + key[which][None, :] * k + key[:, None]
            other = (vm[:, None] != vm[which][None, :]) & (dist != 0)
            terms = scale[:, None] * np.where(other, pieces.table.reshape(-1)[index], 0.0) * granted[which][None, :]
            return terms.T, conf_table.reshape(-1)[index].T
        dist = self.dist[cpu[which][:, None], cpu[None, :]]  # [j, y]: what every y does to piece j
        index = dist * (k * k) + key[None, :] * k + key[which][:, None]
        other = (vm[None, :] != vm[which][:, None]) & (dist != 0)
        terms = scale[which][:, None] * np.where(other, pieces.table.reshape(-1)[index], 0.0) * granted[None, :]
        return terms, conf_table.reshape(-1)[index]

    def _pair_terms(self, pieces: LayoutPieces) -> PairTerms:
        keys = self.pair_keys(pieces)
        if pieces.table is None or not keys:
            zero = np.zeros((len(keys), len(keys)))
            return keys, zero, zero
        granted, scale = self._pair_scale(pieces)
        terms = scale[:, None] * _interference_matrix(self, pieces) * granted[None, :]
        conf_table = self.betas.confidence_tensor(list(pieces.identities))
        assert conf_table is not None
        parent = pieces.parent
        if parent is not None and parent[0].terms is not None and len(parent[1]) <= _FEW_ROWS:
            return keys, terms, _rows_updated(self, pieces, conf_table, parent[0].terms[2], parent[1], masked=False)
        return keys, terms, _pair_lookup(self, pieces, conf_table, masked=False)

    def pair_spread(self, pieces: LayoutPieces) -> PairTerms:
        """`_pair_spread`, cached on the layout (read only)."""
        if pieces.spread is None:
            pieces.spread = _read_only(self._pair_spread(pieces))
            self.holds(pieces)
        return pieces.spread

    def _pair_spread(self, pieces: LayoutPieces) -> PairTerms:
        """As `pair_terms`, with each term's variance instead of its confidence: what the model
        may be wrong by. A coefficient learned from n observations of noise σ is off by about
        σ/√(n + k) (k: `confidence_evidence`, the shrinkage's weight; confidence is n/(n + k), so
        this is σ·√((1 − confidence)/k)); the part of a coefficient the data do not identify is
        a guess, off by as much as the pair's largest coefficient at any distance."""
        keys, terms, confidence = self.pair_terms(pieces)
        if pieces.table is None or not keys:
            return keys, terms, np.zeros_like(terms)
        model = self.betas.model
        k = max(model.config.confidence_evidence, 1e-9)
        granted, scale = self._pair_scale(pieces)
        dist = self.dist[pieces.cpu[:, None], pieces.cpu[None, :]]
        other = (pieces.vm[:, None] != pieces.vm[None, :]) & (dist != 0)
        reach = scale[:, None] * granted[None, :] * other
        doubt = np.clip(1.0 - confidence, 0.0, 1.0)
        # a guess may be off by as much as the pair's largest coefficient at any distance
        largest = np.abs(pieces.table).max(axis=0)[pieces.key[None, :], pieces.key[:, None]]
        variance = (reach * model.noise_sd) ** 2 * doubt / k + (doubt * reach * largest) ** 2
        if pieces.vcpus_per_piece is not None:
            # a piece standing for m vCPUs holds m equal terms: the sum of their variances is
            # its own squared term's over m, per side of the pair
            variance /= np.outer(pieces.vcpus_per_piece, pieces.vcpus_per_piece)
        return keys, terms, variance

    def pair_spread_lines(self, pieces: LayoutPieces, which: np.ndarray,
                          columns: bool) -> tuple[np.ndarray, np.ndarray]:
        """The rows (with `columns`: the columns, one line per piece) of `pair_spread`'s terms and
        variances for the pieces `which`: the same arithmetic on those lines alone, no P × P array."""
        terms, confidence = self.pair_lines(pieces, which, columns)
        if pieces.table is None or not terms.size:
            return terms, np.zeros_like(terms)
        model = self.betas.model
        k = max(model.config.confidence_evidence, 1e-9)
        granted, scale = self._pair_scale(pieces)
        cpu, vm, key = pieces.cpu, pieces.vm, pieces.key
        biggest = np.abs(pieces.table).max(axis=0)
        if columns:  # line j is column `which[j]`: pairs [x, which[j]]
            dist = self.dist[cpu[None, :], cpu[which][:, None]]
            other = (vm[which][:, None] != vm[None, :]) & (dist != 0)
            reach = scale[None, :] * granted[which][:, None] * other
            largest = biggest[key[which][:, None], key[None, :]]
        else:  # line j is row `which[j]`: pairs [which[j], y]
            dist = self.dist[cpu[which][:, None], cpu[None, :]]
            other = (vm[which][:, None] != vm[None, :]) & (dist != 0)
            reach = scale[which][:, None] * granted[None, :] * other
            largest = biggest[key[None, :], key[which][:, None]]
        doubt = np.clip(1.0 - confidence, 0.0, 1.0)
        variance = (reach * model.noise_sd) ** 2 * doubt / k + (doubt * reach * largest) ** 2
        if pieces.vcpus_per_piece is not None:
            variance /= np.outer(pieces.vcpus_per_piece[which], pieces.vcpus_per_piece)
        return terms, variance

    def pair_factors(self, pieces: LayoutPieces) -> tuple[np.ndarray, np.ndarray]:
        """Per piece, what its row and column of `pair_terms` are made of besides the pairs'
        coefficients: (granted time share, objective scale)."""
        return self._pair_scale(pieces)

    def _pair_scale(self, pieces: LayoutPieces) -> tuple[np.ndarray, np.ndarray]:
        """Each piece's granted time share, and what one unit of β·g from a neighbour costs it in
        the objective (its weight over its ideal, its share, and the speed it keeps)."""
        load = np.bincount(pieces.cpu, weights=pieces.demand, minlength=len(self.cpus))
        granted = pieces.demand * np.minimum(1.0, 1.0 / np.maximum(load[pieces.cpu], 1e-12))
        return granted, (pieces.weight / pieces.ideal)[pieces.vm] * granted * self._kept(pieces, granted)

    def _kept(self, pieces: LayoutPieces, granted: np.ndarray) -> np.ndarray:
        """Per piece: what one more unit of Σ β·g costs it, relative to the additive form — 1
        there; in the multiplicative form the speed it still has (each pair's term is then its
        first-order share of the loss, as the layout stands)."""
        if self.betas.form != MULTIPLICATIVE:
            return np.ones(len(granted))
        if layout_moves.scored_big(self, pieces):
            return remaining(layout_moves.guest_sums(self, pieces).loss, self.betas.form)
        return remaining(_interference_matrix(self, pieces) @ granted, self.betas.form)

    @staticmethod
    def _per_guest(pieces: LayoutPieces, got: np.ndarray) -> np.ndarray:
        return np.maximum(got @ pieces.onehot, 0.0) / pieces.ideal[None, :]


def _blocks_product(a: np.ndarray, b: np.ndarray, blocks: list[tuple[int, int]]) -> np.ndarray:
    """a @ b, block of rows by block of rows: each block the product one piece's candidates alone
    make (a matrix product's rounding may depend on its shape; the blocks keep each one's)."""
    result = np.empty((a.shape[0], b.shape[1]))
    for start, end in blocks:
        result[start:end] = a[start:end] @ b
    return result


def _batches(spans: list[tuple[int, int]], rows: int) -> list[list[tuple[int, int]]]:
    """Consecutive row spans grouped so that a group covers at most `rows` rows (a span longer
    than that alone): candidates scored a bounded batch at a time, never a block split."""
    groups: list[list[tuple[int, int]]] = [[]]
    for span in spans:
        if groups[-1] and span[1] - groups[-1][0][0] > rows:
            groups.append([])
        groups[-1].append(span)
    return groups


def _speed(load: np.ndarray) -> np.ndarray:
    """The share of its demand a piece gets on a pCPU of this load (time sharing)."""
    return np.minimum(1.0, 1.0 / np.maximum(load, 1e-12))


def _read_only(found: PairTerms) -> PairTerms:
    """Cached pair terms, guarded against a caller changing them in place."""
    for array in found[1:]:
        array.flags.writeable = False
    return found


def _unload(pieces: LayoutPieces) -> None:
    """`pieces` without what was computed from it (the pieces themselves stay)."""
    pieces.matrix = pieces.terms = pieces.spread = pieces.by_cpu = None
    pieces.reach = pieces.load = None
    pieces.guest_sums = None
    pieces.blind = pieces.parent = None
    pieces.current = None
    pieces.blind_base = None


def _derived(base: LayoutPieces, moved: Mapping[tuple[str, int], int]) -> LayoutPieces:
    """`base` with the one-pCPU vCPUs in `moved` on their new pCPUs: the same pieces in the same
    order (one per such vCPU before and after), so every array but the pCPUs is base's own (read
    only), and nothing computed from the pCPUs is kept."""
    cpu = base.cpu.copy()
    slots = base.slot_of()
    at = []
    for where, local in moved.items():
        cpu[slots[where]] = local
        at.append(slots[where])
    changed = np.array(sorted(set(at)), dtype=np.int64)
    changed = changed[cpu[changed] != base.cpu[changed]]
    # one generation back at most: what base was derived from is let go
    base.parent = None
    if base.blind is not None:
        base.blind.parent = None
    return replace(base, cpu=cpu, matrix=None, current=None, blind=None, terms=None, spread=None, load=None,
                   blind_base=None, reach=None, piece_keys=None, by_cpu=None, guest_sums=None,
                   parent=(base, changed) if base.matrix is not None or base.guest_sums is not None else None)


_FEW_ROWS = 8  # a derived layout moving at most this many pieces gets its matrix by update


def _interference_matrix(host: HostLayout, pieces: LayoutPieces) -> np.ndarray:
    """[x, y]: β(y → x) at their pCPUs' distance, 0 for pieces of one guest or one pCPU (cached)."""
    parent = pieces.parent
    if pieces.matrix is None and parent is not None and parent[0].matrix is not None and len(parent[1]) <= _FEW_ROWS:
        assert pieces.table is not None
        pieces.matrix = _rows_updated(host, pieces, pieces.table, parent[0].matrix, parent[1], masked=True)
        host.holds(pieces)
    if pieces.matrix is None:
        assert pieces.table is not None
        pieces.matrix = _pair_lookup(host, pieces, pieces.table, masked=True)
        host.holds(pieces)
    return pieces.matrix


_STRUCTURED = 128  # layouts of more pieces than this (floating vCPUs) look pairs up per (pCPU, identity)


def _pair_lookup(host: HostLayout, pieces: LayoutPieces, table: np.ndarray, masked: bool) -> np.ndarray:
    """[x, y]: `table`[distance of x's and y's pCPUs, y's identity, x's identity]; `masked`: 0 for
    pieces of one guest or one pCPU. A pool's floating vCPUs make hundreds of pieces that share a
    few (pCPU, identity) pairs: those are looked up once and spread, the same entries."""
    cpu, key, vm = pieces.cpu, pieces.key, pieces.vm
    k = table.shape[1]
    flat = table.reshape(-1)
    if len(cpu) <= _STRUCTURED:
        dist = host.dist[cpu[:, None], cpu[None, :]]
        found = flat[dist * (k * k) + key[None, :] * k + key[:, None]]
        if not masked:
            return found
        other = (vm[:, None] != vm[None, :]) & (dist != 0)
        return np.where(other, found, 0.0)
    unique, inverse = np.unique(cpu * k + key, return_inverse=True)
    ucpu = unique // k
    ukey = unique - ucpu * k
    dist = host.dist[ucpu[:, None], ucpu[None, :]]
    small = flat[dist * (k * k) + ukey[None, :] * k + ukey[:, None]]
    if masked:
        small = np.where(dist != 0, small, 0.0)
    result = small.take(inverse, axis=0).take(inverse, axis=1)
    if masked:  # pieces of one guest are consecutive
        bounds = [0, *(np.flatnonzero(np.diff(vm)) + 1).tolist(), len(vm)]
        for start, end in zip(bounds[:-1], bounds[1:]):
            result[start:end, start:end] = 0.0
    return result


def _rows_updated(host: HostLayout, pieces: LayoutPieces, table: np.ndarray, matrix: np.ndarray, moved: np.ndarray,
                  masked: bool) -> np.ndarray:
    """`_pair_lookup` of a layout that differs from the one of `matrix` in the pCPUs of the `moved`
    pieces only: the other entries are the same look-ups, so they are copied."""
    result = matrix.copy()
    k = table.shape[1]
    flat = table.reshape(-1)
    cpu, key, vm = pieces.cpu, pieces.key, pieces.vm
    for j in moved.tolist():
        other = vm != vm[j]
        dist = host.dist[cpu[j], cpu]  # [y]: j's pCPU to y's
        row = flat[dist * (k * k) + key * k + key[j]]
        result[j, :] = np.where(other & (dist != 0), row, 0.0) if masked else row
        dist = host.dist[cpu, cpu[j]]  # [x]: x's pCPU to j's
        column = flat[dist * (k * k) + key[j] * k + key]
        result[:, j] = np.where(other & (dist != 0), column, 0.0) if masked else column
    return result


def locality_nodes(host: HostLayout, guest: GuestState, pins: Mapping[int, frozenset[int]]) -> set[int]:
    """Nodes a guest's vCPUs must stay in: where its memory is, when it says where (NUMA locality)."""
    placement = guest.placement
    if placement.cells:
        return {cell.host_node for cell in placement.cells if cell.host_node in host.node_cpus}
    if placement.memory_nodes:
        return {n for n in placement.memory_nodes if n in host.node_cpus}
    return set()


# --------------------------------------------------------------------------- confidence
def layout_confidences(host: HostLayout, model: InterferenceModel, betas: BetaTable) -> dict[str, float]:
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
