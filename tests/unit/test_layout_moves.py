"""One-vCPU moves judged per guest (`core/rebalance/layout_moves.py`) predict what the
piece-by-piece arithmetic predicts: the same random hosts — pinned guests beside guests floating
over the host, a node, a set, and vCPUs each their own — scored both ways, every one-vCPU move to
every other pCPU, with the model's table and the blind view's, compared to 1e-9 relative."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from tests.unit.test_rebalance_big_layouts import host_state, model
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance import layout as layout_module
from vmplacer.core.rebalance import layout_moves
from vmplacer.core.rebalance.layout import BetaTable, HostLayout
from vmplacer.core.rebalance.policy import ClusterState, HostState, RebalanceSettings, describe_guest, plan_rebalance
from vmplacer.core.topology.host import uniform_topology


def _layout(state: ClusterState, fitted, merge: bool) -> HostLayout:
    host = HostLayout(state.hosts["h"], BetaTable(fitted))
    for guest in state.guests.values():
        host.add(guest, guest.placement.vcpupin)
    return host


def _moves(host: HostLayout, pieces) -> tuple[np.ndarray, np.ndarray]:
    slots = pieces.slot_of()
    moves = [(piece, target) for _, piece in sorted(slots.items())
             for target in range(len(host.cpus)) if target != pieces.cpu[piece]]
    return (np.array([m for m, _ in moves], dtype=np.int64), np.array([t for _, t in moves], dtype=np.int64))


def _blind(host: HostLayout, pieces):
    return layout_module.replace(pieces, key=np.zeros_like(pieces.key), table=host.betas.prior, matrix=None,
                                 current=None, blind=None, terms=None, spread=None, load=None, by_cpu=None,
                                 guest_sums=None)


def _scored(host: HostLayout, threshold: int, monkeypatch) -> tuple[np.ndarray, ...] | None:
    monkeypatch.setattr(layout_moves, "PER_GUEST_ABOVE", threshold)
    pieces = host.pieces()
    moved, targets = _moves(host, pieces)
    if not len(moved):
        return None
    blind = _blind(host, pieces)
    blocks = [(i, i + 1) for i in range(len(moved))]
    return host.perf_moves_blind_many(pieces, blind, moved, targets, blocks)


def _assert_same(new, old) -> None:
    for got, want in zip(new, old):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("merge", [False, True])
@pytest.mark.parametrize("seed", range(24))
def test_moves_per_guest_equal_piece_by_piece(seed: int, merge: bool, monkeypatch) -> None:
    monkeypatch.setattr(layout_module, "MERGE_ABOVE", 0 if merge else 10**9)
    state = host_state(seed, guests=random.Random(seed).randint(4, 14))
    fitted = model(seed)
    old = _scored(_layout(state, fitted, merge), 10**9, monkeypatch)
    host = _layout(state, fitted, merge)
    new = _scored(host, 0, monkeypatch)
    if old is None:
        assert new is None
        return
    assert layout_moves.applies(host, host.pieces())
    assert isinstance(host.pieces().guest_sums, layout_moves.GuestSums)  # the per-guest path answered
    _assert_same(new, old)


def _crowded(seed: int, guests: int) -> ClusterState:
    """A 2 × 4 × 2 host overcommitted: pinned one-vCPU guests stacked on a few pCPUs beside
    guests floating over the host and over a node, loads from idle to full."""
    rng = random.Random(seed)
    topology = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2, name="h")
    cpus = sorted(topology.cpus)
    node0 = frozenset(c for c in cpus if topology.cpus[c].node == 0)
    states = {}
    for index in range(guests):
        kind = index % 3
        pins = ({0: frozenset({rng.choice(cpus[:4])})} if kind == 0 else
                {v: frozenset() for v in range(2)} if kind == 1 else {v: node0 for v in range(3)})
        placement = Placement(guest=f"g{index}", host="h", vcpupin=pins, memory_kib=1024 * 1024)
        states[f"g{index}"] = describe_guest(placement, labels={"workload": rng.choice("abcd"),
                                                                "load": f"{rng.uniform(0.0, 1.0):.2f}"})
    return ClusterState({"h": HostState("h", topology)}, states)


@pytest.mark.parametrize("seed", range(8))
def test_overcommitted_hosts_equal_piece_by_piece(seed: int, monkeypatch) -> None:
    state = _crowded(seed, guests=18)
    fitted = model(seed)
    old = _scored(_layout(state, fitted, False), 10**9, monkeypatch)
    new = _scored(_layout(state, fitted, False), 0, monkeypatch)
    assert old is not None and new is not None
    _assert_same(new, old)


def test_multiplicative_form_keeps_piece_by_piece(monkeypatch) -> None:
    monkeypatch.setattr(layout_moves, "PER_GUEST_ABOVE", 0)
    host = _layout(host_state(3), model(3, form="multiplicative"), False)
    assert not layout_moves.applies(host, host.pieces())


def test_small_layouts_keep_piece_by_piece() -> None:
    host = _layout(host_state(5), model(5), False)
    pieces = host.pieces()
    assert len(pieces.cpu) <= layout_moves.PER_GUEST_ABOVE
    assert not layout_moves.applies(host, pieces)


@pytest.mark.parametrize("seed", range(3))
def test_plans_agree_either_way(seed: int, monkeypatch) -> None:
    """The planner over a host scored per guest picks the moves it picks scored per piece."""
    state = host_state(seed, guests=12)
    fitted = model(seed)
    plans = []
    for threshold in (10**9, 0):
        monkeypatch.setattr(layout_moves, "PER_GUEST_ABOVE", threshold)
        plan = plan_rebalance(state, fitted, RebalanceSettings(), now=0.0)
        plans.append(([(a.kind, a.guest, str(a.after)) for a in plan.actions], round(plan.objective_after, 9)))
    assert plans[0] == plans[1]


@pytest.mark.parametrize("seed", range(12))
def test_pair_lines_are_the_pair_terms_entries(seed: int) -> None:
    """A move's confidence reads the changed pieces' rows and columns of the pair terms alone
    (`HostLayout.pair_lines`): the very floats of the whole arrays, for the layout and for one
    derived from it by a move."""
    host = _layout(host_state(seed, guests=10), model(seed), False)
    rng = np.random.default_rng(seed)
    for step in range(2):
        pieces = host.pieces()
        size = len(pieces.cpu)
        which = rng.choice(size, size=min(size, 5), replace=False)
        lines = [host.pair_lines(pieces, which, columns) for columns in (False, True)]
        _, terms, conf = host.pair_terms(pieces)
        assert np.array_equal(lines[0][0], terms[which]) and np.array_equal(lines[0][1], conf[which])
        assert np.array_equal(lines[1][0], terms[:, which].T) and np.array_equal(lines[1][1], conf[:, which].T)
        slots = sorted(pieces.slot_of())
        if not slots or step:
            break
        name, vcpu = slots[0]
        pins = dict(host.pins[name])
        pins[vcpu] = frozenset({host.cpus[-1]})
        host.set_pins(name, pins)


def _candidates(host: HostLayout, pieces, rng: np.random.Generator, moved: int, count: int) -> np.ndarray:
    """`count` candidate layouts, each moving up to `moved` one-pCPU pieces to random pCPUs
    (swaps among them: two pieces trading pCPUs)."""
    singles = np.flatnonzero(pieces.single)
    cand = np.repeat(pieces.cpu[None, :], count, axis=0)
    for row in range(count):
        chosen = rng.choice(singles, size=min(len(singles), int(rng.integers(1, moved + 1))), replace=False)
        if row % 3 == 0 and len(chosen) >= 2:
            a, b = chosen[:2]
            cand[row, a], cand[row, b] = pieces.cpu[b], pieces.cpu[a]
        else:
            cand[row, chosen] = rng.integers(0, len(host.cpus), size=len(chosen))
    return cand


@pytest.mark.parametrize("form", ["additive", "multiplicative"])
@pytest.mark.parametrize("seed", range(12))
def test_moved_pieces_loss_equals_piece_by_piece(seed: int, form: str, monkeypatch) -> None:
    """Swaps and moves of up to three pieces (any pCPUs, several on one) scored from the per-guest
    sums equal the piece × piece arithmetic, in both forms."""
    state = host_state(seed, guests=random.Random(seed).randint(5, 14)) if seed % 2 else _crowded(seed, 16)
    fitted = model(seed, form=form)
    rng = np.random.default_rng(seed)
    results = []
    for threshold in (10**9, 0):
        monkeypatch.setattr(layout_moves, "PER_GUEST_ABOVE", threshold)
        host = _layout(state, fitted, False)
        pieces = host.pieces()
        cand = _candidates(host, pieces, np.random.default_rng(seed), 3, 40)
        results.append(host.perf(pieces, cand))
        assert layout_moves.scored_big(host, pieces) == (threshold == 0)
    del rng
    _assert_same(results[1], results[0])


@pytest.mark.parametrize("form", ["additive", "multiplicative"])
@pytest.mark.parametrize("seed", range(8))
def test_layouts_and_moves_equal_piece_by_piece(seed: int, form: str, monkeypatch) -> None:
    """The layout as it stands, its pair factors and one-vCPU moves (all at once and one piece at
    a time) scored from the per-guest sums equal the matrix's arithmetic, in both forms."""
    state = host_state(seed, guests=random.Random(seed).randint(5, 14)) if seed % 2 else _crowded(seed, 16)
    fitted = model(seed, form=form)
    results = []
    for threshold in (10**9, 0):
        host = _layout(state, fitted, False)
        found = list(_scored(host, threshold, monkeypatch) or ())
        pieces = host.pieces()
        found += list(host.perf(pieces, pieces.cpu))
        found.append(host.pair_factors(pieces)[1])
        moved, targets = _moves(host, pieces)
        if len(moved):
            found.append(host.perf_moves(pieces, int(moved[0]), targets[moved == moved[0]])[0])
        results.append(found)
    _assert_same(results[1], results[0])


@pytest.mark.parametrize("seed", range(6))
def test_line_sums_of_many_changed_pieces_equal_the_whole_arrays(seed: int, monkeypatch) -> None:
    """A big layout judges every move on its changed pieces' lines, however many changed (a pool
    adds hundreds of pieces), a bounded number of lines at a time: the whole arrays' sums."""
    from vmplacer.core.rebalance import whatif

    monkeypatch.setattr(whatif, "LINE_CELLS", 13)
    host = _layout(host_state(seed, guests=10), model(seed), False)
    before_pieces = host.pieces()
    keys_b, terms_b = host.pair_keys(before_pieces), host.pair_terms(before_pieces)
    factors_b = np.stack(host.pair_factors(before_pieces), axis=1)
    name = sorted(host.pins)[0]
    host.set_pins(name, {v: frozenset(host.cpus[: 4 + seed]) for v in host.pins[name]})  # onto a pool
    after_pieces = host.pieces()
    keys_a, terms_a = host.pair_keys(after_pieces), host.pair_terms(after_pieces)
    factors_a = np.stack(host.pair_factors(after_pieces), axis=1)
    changed = whatif.changed_pieces(keys_b, factors_b, keys_a, factors_a, 1.0)
    assert changed is not None and changed.sum() >= 2
    lines = whatif.pair_line_sums(keys_b, lambda w, c: host.pair_lines(before_pieces, w, c),
                                  keys_a, lambda w, c: host.pair_lines(after_pieces, w, c), changed)
    change, trust = whatif.pair_changes(keys_b, *terms_b[1:], keys_a, *terms_a[1:])
    assert change is not None
    assert lines[0] == pytest.approx(float(change.sum()), rel=1e-9)
    assert lines[1] == pytest.approx(float((change * trust).sum()), rel=1e-9)


def test_big_layouts_need_memory_in_proportion_to_their_pieces() -> None:
    """Past `DENSE_JUDGE_PIECES` a layout's need grows with pCPUs × pieces, not pieces²: a
    512-pCPU host of 200 guests, 40 of them floating over the whole host (20,640 pieces: a
    piece × piece array alone would be 3.2 GiB), fits 1 GiB; what leaves it out is the time one
    judged change would take, over the host's search budget, and a longer budget lets it in."""
    from vmplacer.core.rebalance import budget

    small, big = layout_moves.DENSE_JUDGE_PIECES + 1, 4 * (layout_moves.DENSE_JUDGE_PIECES + 1)
    grown = budget.host_need_mib(big, True, 512, 200) - budget.host_need_mib(small, True, 512, 200)
    per_piece = (budget.host_need_mib(small, True, 512, 200) - budget.BASE_MIB - budget.LINES_MIB) / small
    assert grown == pytest.approx(per_piece * (big - small))
    topology = uniform_topology(nodes=16, cores_per_node=16, threads_per_core=2, name="h")
    guests = {}
    for index in range(200):
        pins = {v: frozenset() for v in range(2)} if index % 5 == 4 else {0: frozenset({index})}
        placement = Placement(guest=f"g{index}", host="h", vcpupin=pins, memory_kib=1024 * 1024)
        guests[f"g{index}"] = describe_guest(placement, labels={"workload": "a"})
    state = ClusterState({"h": HostState("h", topology)}, guests)
    pieces = 40 * 512 + 160
    assert budget.host_need_mib(pieces, True, 512, 200) < 1024
    slow = budget.hosts_over_budget(state, RebalanceSettings())
    assert list(slow) == ["h"] and f"{pieces} pieces" in slow["h"] and "host_budget_s" in slow["h"]
    roomy = RebalanceSettings(host_budget_s=pieces * pieces / budget.WORK_PER_SECOND + 1)
    assert budget.hosts_over_budget(state, roomy) == {}
    tight = budget.hosts_over_budget(state, replace(roomy, memory_budget_mib=400))
    assert list(tight) == ["h"] and "memory_budget_mib" in tight["h"]


@pytest.mark.parametrize("seed", range(10))
def test_sums_of_a_derived_layout_equal_sums_made_whole(seed: int, monkeypatch) -> None:
    """A layout derived from another by moving one-pCPU vCPUs updates the other's per-guest sums
    (the rows and columns the moves touch, the pieces whose share changed); a chain of such moves
    gives what computing the sums whole gives."""
    monkeypatch.setattr(layout_moves, "PER_GUEST_ABOVE", 0)
    state = host_state(seed, guests=random.Random(seed).randint(5, 14)) if seed % 2 else _crowded(seed, 16)
    host = _layout(state, model(seed), False)
    rng = random.Random(seed)
    layout_moves.guest_sums(host, host.pieces())
    derived = 0
    for _ in range(6):
        singles = sorted(host.pieces().slot_of())
        if not singles:
            return
        for name, vcpu in rng.sample(singles, min(len(singles), rng.randint(1, 2))):
            pins = dict(host.pins[name])
            pins[vcpu] = frozenset({rng.choice(host.cpus)})
            host.set_pins(name, pins)
        pieces = host.pieces()
        got = layout_moves.guest_sums(host, pieces)
        derived += got.generation > 0
        whole = layout_moves.guest_sums(host, layout_module.replace(pieces, guest_sums=None, parent=None))
        assert whole.generation == 0
        for field in ("speed", "granted", "loss", "by_cpu", "kept", "granted_sum", "from_load", "from_unit", "caused"):
            np.testing.assert_allclose(getattr(got, field), getattr(whole, field), rtol=1e-9, atol=1e-12,
                                       err_msg=field)
        assert np.array_equal(got.slots, whole.slots)
    assert derived >= 3
