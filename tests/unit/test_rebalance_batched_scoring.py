"""The search's shortcuts give the very floats of the plain computation: a host's single moves
and its swaps scored in one pass equal each piece's scored alone, the pool's pair changes gathered equal them
scattered, and the spread's heap picks what a scan of every pCPU picks."""

from __future__ import annotations

import random

import numpy as np
import pytest

from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.policy import ClusterState, HostState, RebalanceSettings, describe_guest
from vmplacer.core.rebalance.pessimistic import LeastLoadedPicker
from vmplacer.core.rebalance.draft import Draft, PlanInputs
from vmplacer.core.rebalance.search import start_search
from vmplacer.core.rebalance import whatif
from vmplacer.core.rebalance.whatif import blind_view, pair_changes
from vmplacer.core.topology.host import uniform_topology

from tests.unit.test_rebalance_pessimism import GUESTS, learned

TOPO = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2, name="h")


def crowded_search(seed: int) -> tuple[Draft, PlanInputs]:
    """The model's four workloads, twice each, on random pCPUs (some shared); one guest of two vCPUs."""
    rng = random.Random(seed)
    guests = {}
    for i in range(8):
        name = f"{GUESTS[i % 4]}{i}"
        pins = {v: frozenset({rng.randrange(len(TOPO.cpus))}) for v in range(2 if i == 3 else 1)}
        guests[name] = describe_guest(Placement(guest=name, host="h", vcpupin=pins, memory_kib=1024),
                                      labels={"workload": GUESTS[i % 4]})
    return start_search(ClusterState({"h": HostState("h", TOPO)}, guests), learned(sibling_rounds=20, seed=seed),
                        RebalanceSettings(), 0.0, {}, None)


def test_single_moves_scored_in_one_pass_equal_each_piece_scored_alone():
    for seed in range(6):
        draft, inputs = crowded_search(seed)
        host = draft.hosts["h"]
        pieces = host.pieces()
        blind = blind_view(inputs, pieces)
        singles = []
        for m in range(len(pieces.cpu)):
            name, vcpu = pieces.guests[pieces.vm[m]], int(pieces.vcpu[m])
            targets = sorted(host.allowed(name, vcpu) - {host.cpus[pieces.cpu[m]]})
            if targets:
                singles.append((m, np.array([host.index[c] for c in targets], dtype=np.int64)))
        assert len(singles) >= 5
        blocks, start = [], 0
        for _, local in singles:
            blocks.append((start, start + len(local)))
            start += len(local)
        moved = np.repeat([m for m, _ in singles], [len(local) for _, local in singles])
        batched = host.perf_moves_blind_many(pieces, blind, moved, np.concatenate([t for _, t in singles]), blocks)
        assert blind is not None and batched[2] is not None
        for (m, local), (begin, end) in zip(singles, blocks):
            alone = host.perf_moves_blind(pieces, blind, m, local)
            for got, want in zip(batched, alone):
                assert want is not None
                assert np.array_equal(got[begin:end], want), (seed, m)


def scattered(keys_b, terms_b, conf_b, keys_a, terms_a, conf_a) -> tuple[float, float]:
    """The plain computation: both layouts' terms scattered into zeros, pair by pair."""
    union = {k: i for i, k in enumerate(dict.fromkeys([*keys_b, *keys_a]))}
    n = len(union)
    delta, trust = np.zeros((n, n)), np.ones((n, n))
    for keys, terms, conf, sign in ((keys_b, terms_b, conf_b, -1.0), (keys_a, terms_a, conf_a, 1.0)):
        at = np.ix_([union[k] for k in keys], [union[k] for k in keys])
        delta[at] += sign * terms
        trust[at] = np.minimum(trust[at], np.where(terms != 0, conf, 1.0))
    change = np.abs(delta)
    return float(change.sum()), float((change * trust).sum())


def test_pair_changes_gathered_equal_them_scattered():
    rng = np.random.default_rng(3)
    before = [("g", i, i) for i in range(12)]
    for after in (before + [("f", i, i) for i in range(30)],  # a pool: the pinned pieces among the new ones
                  before[:11] + [("g", 11, 99)],  # a single move
                  list(reversed(before))):  # the same pieces in another order
        after = list(after)
        random.Random(len(after)).shuffle(after)
        terms_b = rng.random((12, 12)) * (rng.random((12, 12)) > 0.4)
        terms_a = rng.random((len(after), len(after))) * (rng.random((len(after), len(after))) > 0.4)
        conf_b, conf_a = rng.random(terms_b.shape), rng.random(terms_a.shape)
        change, trust = pair_changes(before, terms_b, conf_b, after, terms_a, conf_a)
        assert change is not None and trust is not None
        total = float(change.sum())
        assert (total, float(np.multiply(change, trust).sum())) == scattered(before, terms_b, conf_b, after,
                                                                              terms_a, conf_a)


def test_spread_heap_picks_what_a_scan_picks_as_loads_grow():
    rng = random.Random(5)
    cpus = list(range(32))
    core_of = {c: c % 16 for c in cpus}
    llc_of = {c: (c % 16) // 4 for c in cpus}  # four LLCs of four cores
    node_of = {c: (c % 16) // 8 for c in cpus}  # two nodes of two LLCs
    for _ in range(20):
        cpu_load = {c: rng.choice([0.0, 0.5, 1.0, 1.0 / 3]) for c in cpus}
        loads = [{}, {}, {}]
        for c, load in cpu_load.items():
            for level, group in enumerate((core_of, llc_of, node_of)):
                loads[level][group[c]] = loads[level].get(group[c], 0.0) + load
        least = LeastLoadedPicker(dict(cpu_load), [core_of, llc_of, node_of])
        for _ in range(40):
            allowed = tuple(cpus) if rng.random() < 0.5 else tuple(c for c in cpus if c < 8 or c >= 24)
            want = min(allowed, key=lambda c: (cpu_load[c], loads[0][core_of[c]], loads[1][llc_of[c]],
                                               loads[2][node_of[c]], c))
            assert least.pick(allowed) == want
            least.add(want, 1.0)
            cpu_load[want] += 1.0
            for level, group in enumerate((core_of, llc_of, node_of)):
                loads[level][group[want]] += 1.0


def test_swaps_scored_in_one_pass_equal_each_piece_scored_alone():
    for seed in range(6):
        draft, _ = crowded_search(seed)
        host = draft.hosts["h"]
        pieces = host.pieces()
        alone, cands, pairs, blocks, start = [], [], [], [], 0
        for m in range(len(pieces.cpu)):
            partners = np.flatnonzero(pieces.single & (pieces.cpu != pieces.cpu[m]) & (pieces.vm != pieces.vm[m]))
            if not len(partners):
                continue
            cand = np.repeat(pieces.cpu[None, :], len(partners), axis=0)
            cand[np.arange(len(partners)), m] = pieces.cpu[partners]
            cand[np.arange(len(partners)), partners] = pieces.cpu[m]
            pair = np.stack([np.minimum(partners, m), np.maximum(partners, m)], axis=1)
            alone.append(host.perf(pieces, cand, pair))
            cands.append(cand)
            pairs.append(pair)
            blocks.append((start, start + len(partners)))
            start += len(partners)
        assert len(blocks) >= 5
        batched = host.perf(pieces, np.concatenate(cands), np.concatenate(pairs), blocks)
        for (begin, end), want in zip(blocks, alone):
            for got, expected in zip(batched, want):
                assert np.array_equal(got[begin:end], expected), seed


def _layout_terms(keys, factors, seed_of):
    """Terms as a layout makes them: a pair's coefficient (a function of both pieces) times the
    row piece's scale and the column piece's granted share; confidences a function of the pair."""
    coefficient = np.array([[random.Random(seed_of(x, y)).random() * (x[0] != y[0]) for y in keys] for x in keys])
    confidence = np.array([[random.Random(seed_of(y, x)).random() for y in keys] for x in keys])
    return factors[:, 1][:, None] * coefficient * factors[:, 0][None, :], confidence


@pytest.mark.parametrize("seed", range(6))
def test_pair_change_sums_over_changed_pieces_equal_the_whole_arrays(seed):
    """A move judged on the rows and columns of the pieces it changes sums what the union × union
    arrays sum: every other pair has the same term and confidence before and after."""
    rng = random.Random(seed)
    before = [(f"g{i % 9}", i, rng.randrange(40)) for i in range(36)]
    factors_b = np.array([[rng.choice([1.0, 0.5]), rng.uniform(0.5, 2.0)] for _ in before])
    after, factors_a = list(before), factors_b.copy()
    for _ in range(rng.randint(1, 3)):  # a few pieces move; pieces on their pCPUs get other shares
        m = rng.randrange(len(after))
        after[m] = (after[m][0], after[m][1], 40 + rng.randrange(8))
        factors_a[m] = [rng.choice([1.0, 1 / 3]), rng.uniform(0.5, 2.0)]
        factors_a[rng.randrange(len(after))] *= 0.5
    if seed % 2:
        after.append(("new", 0, 3))
        factors_a = np.vstack([factors_a, [1.0, 1.0]])
    order = list(range(len(after)))
    rng.shuffle(order)
    after, factors_a = [after[i] for i in order], factors_a[order]

    def seed_of(x, y):
        return f"{x}/{y}"

    terms_b, conf_b = _layout_terms(before, factors_b, seed_of)
    terms_a, conf_a = _layout_terms(after, factors_a, seed_of)
    changed = whatif.changed_pieces(before, factors_b, after, factors_a)
    assert changed is not None and 0 < changed.sum() <= 10
    total, weighted = whatif.pair_change_sums(before, terms_b, conf_b, after, terms_a, conf_a, changed)
    want = scattered(before, terms_b, conf_b, after, terms_a, conf_a)
    assert total == pytest.approx(want[0], rel=1e-12) and weighted == pytest.approx(want[1], rel=1e-12)
