"""Admission's candidates judged as changes to one kept host, not as hosts built anew.

A search scores a few hundred candidate placements of one new guest against the same
neighbours. Rebuilding the whole host for each (a floating guest is one piece per pCPU it
may use: 25,000 pieces on a 512-pCPU host with 50 unpinned guests) costs milliseconds a
candidate. What a candidate changes is structured:

* the new guest's few pieces add demand on its pCPUs;
* a guest floating over a pool that the candidate's exclusive pCPUs cut into leaves those
  pCPUs, and its demand on the rest grows by |pool| / |pool left| — the same factor for
  every guest of that pool;
* where a pCPU's demand changes and it is asked for more than its time, every piece on it
  gets a new time share.

So the change is a [pCPU, key] array of granted time. What it costs every piece is that
array spread over distance classes — from group sums (core ⊂ L2 ⊂ LLC ⊂ node ⊂ host, pCPUs
ordered so that every group is one run) or, for a few changed pCPUs, from their distance
rows — and a pooled guest's own pieces (which never interfere with it) come off the same
way. A candidate then costs O(pCPUs × keys + pieces) array work: no layout set-up, no sort,
no pCPU × pCPU product. The arithmetic is `InterferenceModel.predict`'s, summed in another
order: results equal the full rebuild to rounding (tested to 1e-9 relative).

Where only a rebuild can tell — a candidate cutting into a guest whose vCPUs float over
different sets (each vCPU would narrow on its own) — `judge` answers None and the caller
rebuilds that candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from vmplacer.core.model.class_priors import Identity, ShrunkBetas
from vmplacer.core.model.interference import TenantLayout, distance_matrix, host_groups, remaining
from vmplacer.core.topology.host import DistanceClass, HostTopology

_SAME_CPU = DistanceClass.SAME_CPU.rank
POINT_ROWS = 24  # a change on at most this many pCPUs is spread from their distance rows


@dataclass(frozen=True)
class CandidateWork:
    """Per kept guest its work before and with the candidate; the new guest's work and work alone."""

    before: np.ndarray
    after: np.ndarray
    guest_work: float
    guest_alone: float


class _Spreader:
    """What granted time on pCPUs costs a unit piece of each key on every pCPU of one host."""

    def __init__(self, topology: HostTopology, cpus: np.ndarray):
        self.distance = distance_matrix(topology, cpus)  # [pCPU, pCPU] rank, in `cpus` order
        groups = host_groups(topology)
        self.order: np.ndarray | None = None
        if groups is not None:
            order = np.lexsort(groups)  # by host, node, LLC, L2, core: every group one run
            self.order = order
            self.runs = []
            for group in groups:
                ordered = group[order]
                starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
                self.runs.append((starts, np.diff(np.r_[starts, ordered.size])))

    def spread(self, granted: np.ndarray, table: np.ndarray) -> np.ndarray:
        """[pCPU, fg key]: Σ over other pCPUs c' and bg keys j of table[rank(c, c'), j, fg] · granted[c', j]."""
        rows = np.flatnonzero(granted.any(axis=1))
        if rows.size <= POINT_ROWS or self.order is None:
            return self.points(rows, granted[rows], table)
        ordered = granted[self.order]
        inner = ordered
        total = np.zeros((granted.shape[0], table.shape[2]))
        for level, (starts, sizes) in enumerate(self.runs):  # level l: what shares its group, less the last
            around = np.repeat(np.add.reduceat(ordered, starts, axis=0), sizes, axis=0)
            total += (around - inner) @ table[level + 1]
            inner = around
        result = np.empty_like(total)
        result[self.order] = total
        return result

    def points(self, rows: np.ndarray, granted: np.ndarray, table: np.ndarray) -> np.ndarray:
        """`spread` of granted time on the pCPUs `rows` only, from their distance rows."""
        if rows.size == 0:
            return np.zeros((self.distance.shape[0], table.shape[2]))
        per_rank = np.einsum("ij,rjk->irk", granted, table)  # [point, rank, fg key]
        per_rank[:, _SAME_CPU] = 0.0
        return per_rank[np.arange(rows.size)[:, None], self.distance[rows]].sum(axis=0)


class KeptHost:
    """One search's neighbours, flattened once, with what a candidate needs to judge its change."""

    def __init__(self, betas: ShrunkBetas, topology: HostTopology, layout: TenantLayout,
                 pools: Mapping[str, tuple[np.ndarray, int]], floating: set[str],
                 identity_of: Callable[[str], Identity], guest: Identity):
        """`layout`: the neighbours flattened (`TenantLayout.build`); `pools`: those whose every
        vCPU floats over one set (name -> the set, sorted; vCPUs); `floating`: every guest whose
        vCPUs may move, pools or not."""
        self.tenants = list(layout.tenants)
        self.form = betas.form
        identities: dict[Identity, int] = {}
        kind = np.array([identities.setdefault(identity_of(t.name), len(identities)) for t in self.tenants],
                        dtype=np.int64)
        self.guest_kind = identities.setdefault(guest, len(identities))
        self.table = betas.table(tuple(identities)).copy()  # [rank, background key, foreground key]
        self.table[_SAME_CPU] = 0.0  # a pCPU's own time sharing is in the shares, not in β
        keys = self.table.shape[1]
        self.own_table = np.stack([np.diagonal(t) for t in self.table])[:, None, :]  # [rank, 1, key]: same key
        cpus = np.asarray(sorted(topology.cpus), dtype=np.int64)
        self.size = cpus.size
        column = np.full(int(cpus.max()) + 1, -1, dtype=np.int64)
        column[cpus] = np.arange(cpus.size)
        self.column = column
        self.spreader = _Spreader(topology, cpus)

        self.owner = layout.owner
        self.piece_cpu = column[layout.cpu]
        self.piece_kind = kind[layout.owner]
        self.demand = layout.demand
        self.load = np.bincount(self.piece_cpu, weights=self.demand, minlength=self.size)
        self.share = np.minimum(1.0, 1.0 / np.maximum(self.load, 1e-300))  # [pCPU] granted per demand
        self.loss = layout.neighbour_sum(betas.table(tuple(identities)), self.piece_kind)
        self.granted = layout.granted
        self.before = self._work(self.granted, self.loss, len(self.tenants))
        self.asked = np.zeros((self.size, keys))  # [pCPU, key] demand
        np.add.at(self.asked, (self.piece_cpu, self.piece_kind), self.demand)
        self.felt = self.spreader.spread(self.asked * self.share[:, None], self.table)  # [pCPU, fg key]

        # pools: guests whose every vCPU floats over one set, grouped by the set
        pool_id: dict[bytes, int] = {}
        tenant_pool = np.full(len(self.tenants), -1, dtype=np.int64)
        masks: list[np.ndarray] = []
        single = {t.name for t in self.tenants if len(frozenset().union(*t.cpus.values())) == 1}  # never cut
        for index, tenant in enumerate(self.tenants):
            if tenant.name in pools and tenant.name not in single:
                pool = pools[tenant.name][0]
                found = pool_id.setdefault(pool.tobytes(), len(pool_id))
                if found == len(masks):
                    mask = np.zeros(self.size, dtype=bool)
                    mask[column[pool]] = True
                    masks.append(mask)
                tenant_pool[index] = found
        self.pool_mask = np.asarray(masks, dtype=bool).reshape(len(masks), self.size)
        self.pool_size = self.pool_mask.sum(axis=1)
        self.piece_pool = tenant_pool[self.owner]
        self.pool_pieces = [np.flatnonzero(self.piece_pool == p) for p in range(len(masks))]
        self.pool_keyload = np.zeros((len(masks), keys))  # [pool, key]: demand on each of its pCPUs
        for p, at in enumerate(self.pool_pieces):
            first = at[np.r_[True, self.owner[at][1:] != self.owner[at][:-1]]]
            np.add.at(self.pool_keyload[p], self.piece_kind[first], self.demand[first])
        self.pool_own = [self._own(p, self.pool_mask[p] * self.share) for p in range(len(masks))]

        # pCPUs where a changed time share would change a guest's own pieces outside the pool rules
        pieces_of = np.bincount(self.owner, minlength=len(self.tenants))
        self.fragile = np.zeros(self.size, dtype=bool)
        several = (pieces_of[self.owner] > 1) & (self.piece_pool < 0)
        self.fragile[self.piece_cpu[several]] = True
        self.cut_forbidden = np.zeros(self.size, dtype=bool)  # floating guests that are not pools
        for tenant in self.tenants:
            if tenant.name in floating and tenant.name not in pools and tenant.name not in single:
                for allowed in tenant.cpus.values():
                    self.cut_forbidden[column[np.fromiter(allowed, dtype=np.int64)]] = True
        self._judge_alike_once(tenant_pool)

    def _judge_alike_once(self, tenant_pool: np.ndarray) -> None:
        """Pooled guests of one pool, key and demand have the same pieces and losses before and with
        any candidate (each is the other's neighbour): only the first of them is judged."""
        first_piece = np.r_[0, np.flatnonzero(np.diff(self.owner)) + 1] if self.owner.size else np.zeros(0, int)
        alike: dict[tuple, int] = {}
        delegate = np.arange(len(self.tenants))
        for index in range(len(self.tenants)):
            if tenant_pool[index] >= 0:
                piece = first_piece[index]
                key = (int(tenant_pool[index]), int(self.piece_kind[piece]), float(self.demand[piece]))
                delegate[index] = alike.setdefault(key, index)
        judged = np.flatnonzero(delegate == np.arange(len(self.tenants)))
        compact = np.full(len(self.tenants), -1, dtype=np.int64)
        compact[judged] = np.arange(judged.size)
        self.judged_of = compact[delegate]  # [tenant] -> its row among the judged
        keep = compact[self.owner] >= 0
        for p, at in enumerate(self.pool_pieces):
            self.pool_own[p] = self.pool_own[p][keep[at]]
        self.owner = compact[self.owner[keep]]
        self.judged = judged.size
        for name in ("piece_cpu", "piece_kind", "demand", "loss", "piece_pool"):
            setattr(self, name, getattr(self, name)[keep])
        counts = np.bincount(self.owner, minlength=self.judged)
        self.several = (counts[self.owner] > 1) & (self.piece_pool < 0)
        starts = np.r_[0, np.cumsum(counts)]
        self.pieces_of = {t: np.arange(starts[t], starts[t + 1]) for t in np.unique(self.owner[self.several]).tolist()}
        self.pool_pieces = [np.flatnonzero(self.piece_pool == p) for p in range(len(self.pool_pieces))]

    def _work(self, granted: np.ndarray, loss: np.ndarray, rows: int) -> np.ndarray:
        got = np.bincount(self.owner, weights=granted * remaining(loss, self.form), minlength=rows)
        return np.maximum(got, 0.0)

    def _own(self, pool: int, granted_per_demand: np.ndarray) -> np.ndarray:
        """[piece of the pool]: what a pooled guest's own pieces cost each of its pieces, for granted
        time `granted_per_demand` [pCPU] per unit of its demand."""
        at = self.pool_pieces[pool]
        felt = self.spreader.spread(granted_per_demand[:, None], self.own_table)  # [pCPU, key]
        return self.demand[at] * felt[self.piece_cpu[at], self.piece_kind[at]]

    def judge(self, taken: frozenset[int], guest_cpus: np.ndarray, guest_demand: np.ndarray) -> CandidateWork | None:
        """Every kept guest's work and the new guest's once the candidate (exclusive pCPUs `taken`,
        pieces on `guest_cpus` with `guest_demand`) is placed; None where only a rebuild can tell."""
        taken_cols = self.column[np.fromiter(taken, dtype=np.int64, count=len(taken))]
        if bool(self.cut_forbidden[taken_cols].any()):
            return None
        taken_mask = np.zeros(self.size, dtype=bool)
        taken_mask[taken_cols] = True
        cut = self.pool_mask[:, taken_cols].sum(axis=1)
        narrowed = np.flatnonzero((cut > 0) & (cut < self.pool_size)).tolist()
        scale = np.ones(len(self.pool_size) + 1)  # index -1: pieces of no pool
        stays = {}
        asked = self.asked.copy()
        guest_cols = self.column[guest_cpus]
        for p in narrowed:
            scale[p] = self.pool_size[p] / (self.pool_size[p] - cut[p])
            stays[p] = self.pool_mask[p] & ~taken_mask
            asked += np.outer(scale[p] * stays[p] - self.pool_mask[p], self.pool_keyload[p])
        np.add.at(asked[:, self.guest_kind], guest_cols, guest_demand)
        load = asked.sum(axis=1)
        share = np.minimum(1.0, 1.0 / np.maximum(load, 1e-300))
        reshared = share != self.share
        change = self.spreader.spread(asked * share[:, None] - self.asked * self.share[:, None], self.table)

        piece_scale = scale[self.piece_pool]
        granted = self.demand * piece_scale * share[self.piece_cpu]
        loss = self.loss + change[self.piece_cpu, self.piece_kind]
        for p, at in enumerate(self.pool_pieces):
            if p in stays:
                after = self._own(p, scale[p] * stays[p] * share)
                granted[at[taken_mask[self.piece_cpu[at]]]] = 0.0
            elif bool((reshared & self.pool_mask[p]).any()):
                after = self._own(p, self.pool_mask[p] * share)
            else:
                continue
            loss[at] -= after - self.pool_own[p]
        if bool((reshared & self.fragile).any()):  # guests of several pieces: their own shares change
            touched = np.unique(self.owner[self.several & reshared[self.piece_cpu]])
            for tenant in touched.tolist():
                at = self.pieces_of[tenant]
                gained = self.demand[at] * (share - self.share)[self.piece_cpu[at]]
                near = self.spreader.distance[self.piece_cpu[at]][:, self.piece_cpu[at]]
                kind = self.piece_kind[at[0]]
                loss[at] -= self.table[near, kind, kind] @ gained
        after_work = self._work(granted, loss, self.judged)[self.judged_of]

        guest_granted = guest_demand * share[guest_cols]
        felt = self.felt[guest_cols, self.guest_kind] + change[guest_cols, self.guest_kind]
        between = self.spreader.distance[guest_cols][:, guest_cols]
        felt -= self.table[between, self.guest_kind, self.guest_kind] @ guest_granted  # its own pieces
        work = max(float((guest_granted * remaining(felt, self.form)).sum()), 0.0)
        alone = float(np.minimum(guest_demand, 1.0).sum())
        return CandidateWork(self.before, after_work, work, alone)
