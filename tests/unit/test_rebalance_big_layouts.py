"""Big hosts' layouts are scored in bounded forms — a floating guest's vCPUs that share their pCPUs
as one piece per pCPU, one-piece moves from the layout's own loss, swaps without a matrix per
candidate, candidates a bounded number at a time — and predict what the plain forms predict.

Each test scores the same random hosts twice: with the bounds' thresholds forced to 0 (every
bounded form used, on hosts small enough for the plain ones) and forced out of reach (the plain
forms), and compares to 1e-9 relative."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pytest

from vmplacer.core.model.interference import Exposure, InterferenceModel, ModelConfig, Observation
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance import layout as layout_module
from vmplacer.core.rebalance.layout import BetaTable, HostLayout
from vmplacer.core.rebalance.policy import ClusterState, HostState, RebalanceSettings, describe_guest, plan_rebalance
from vmplacer.core.topology.host import DistanceClass, uniform_topology

KEYS = ("a", "b", "c", "d")
DISTANCES = (DistanceClass.SAME_CORE, DistanceClass.SAME_LLC, DistanceClass.REMOTE_NODE)
BOUNDED = {"MERGE_ABOVE": 0, "INCREMENTAL_ABOVE": 0, "STACKED_CELLS": 0, "CANDIDATE_CELLS": 7}
PLAIN = {"MERGE_ABOVE": 10**9, "INCREMENTAL_ABOVE": 10**9, "STACKED_CELLS": 10**12, "CANDIDATE_CELLS": 10**12}


def model(seed: int, form: str = "additive") -> InterferenceModel:
    rng = random.Random(seed)
    observations = []
    for _ in range(120):
        neighbours = tuple(Exposure(rng.choice(KEYS), rng.choice(DISTANCES), rng.uniform(0.3, 1.0))
                           for _ in range(rng.randint(1, 3)))
        observations.append(Observation(rng.choice(KEYS), rng.uniform(0.5, 1.1), 1.0, neighbours))
    return InterferenceModel(ModelConfig(form=form)).fit(observations)


def host_state(seed: int, guests: int = 9) -> ClusterState:
    """One host of 2 nodes × 3 cores × 2 threads: pinned one-vCPU guests, and guests of 2–4 vCPUs
    floating over the host, over a node, over a random set (all vCPUs alike, or each its own)."""
    rng = random.Random(seed)
    topology = uniform_topology(nodes=2, cores_per_node=3, threads_per_core=2, name="h")
    cpus = sorted(topology.cpus)
    nodes = {n: frozenset(c for c in cpus if topology.cpus[c].node == n) for n in (0, 1)}
    states = {}
    for index in range(guests):
        name = f"g{index}"
        kind = rng.choice(("pinned", "pinned", "host", "node", "set", "mixed"))
        vcpus = 1 if kind == "pinned" else rng.randint(2, 4)
        if kind == "pinned":
            pins = {0: frozenset({rng.choice(cpus)})}
        elif kind == "host":
            pins = {v: frozenset() for v in range(vcpus)}
        elif kind == "node":
            pins = {v: nodes[rng.randrange(2)] for v in range(1)}
            pins = {v: pins[0] for v in range(vcpus)}
        elif kind == "set":
            chosen = frozenset(rng.sample(cpus, rng.randint(2, 6)))
            pins = {v: chosen for v in range(vcpus)}
        else:  # each vCPU its own: some alone on one pCPU, some sharing a set
            chosen = frozenset(rng.sample(cpus, 3))
            pins = {v: (frozenset({rng.choice(cpus)}) if v % 2 else chosen) for v in range(vcpus)}
        placement = Placement(guest=name, host="h", vcpupin=pins, memory_kib=1024 * 1024)
        states[name] = describe_guest(placement, labels={"workload": rng.choice(KEYS),
                                                          "load": f"{rng.uniform(0.3, 1.0):.2f}"})
    return ClusterState({"h": HostState("h", topology)}, states)


def laid_out(state: ClusterState, fitted: InterferenceModel, constants: dict, monkeypatch) -> HostLayout:
    for name, value in constants.items():
        monkeypatch.setattr(layout_module, name, value)
    host = HostLayout(state.hosts["h"], BetaTable(fitted))
    for guest in state.guests.values():
        host.add(guest, guest.placement.vcpupin)
    return host


def close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.allclose(a, b, rtol=1e-9, atol=1e-12))


def single_moves(host: HostLayout) -> list[tuple[tuple[str, int], int]]:
    """Every vCPU pinned to one pCPU, to every other pCPU: ((guest, vCPU), local pCPU)."""
    pieces = host.pieces()
    return [(where, target) for where, piece in sorted(pieces.slot_of().items())
            for target in range(len(host.cpus)) if target != pieces.cpu[piece]]


def scored(host: HostLayout) -> dict[str, np.ndarray]:
    """What the search reads of a layout: performance as it stands, of every one-vCPU move (one
    pass and one piece at a time), of swaps, of three-vCPU moves, and the pair terms' sums per
    pair of guests."""
    pieces = host.pieces()
    slots = pieces.slot_of()
    result = {}
    result["now"], result["now_linear"] = host.perf(pieces, pieces.cpu)
    moves = single_moves(host)
    if moves:
        moved = np.array([slots[where] for where, _ in moves], dtype=np.int64)
        targets = np.array([target for _, target in moves], dtype=np.int64)
        blocks = [(i, i + 1) for i in range(len(moves))]
        blind = layout_module.replace(pieces, key=np.zeros_like(pieces.key), table=host.betas.prior, matrix=None,
                                      current=None, blind=None, terms=None, spread=None, load=None, by_cpu=None)
        many, linear, blind_many = host.perf_moves_blind_many(pieces, blind, moved, targets, blocks)
        result["moves"], result["moves_linear"], result["moves_blind"] = many, linear, blind_many
        result["moves_alone"] = np.concatenate([host.perf_moves(pieces, int(m), np.array([t]))[0]
                                                for m, t in zip(moved, targets)])
    singles = sorted(slots.items())
    swaps = [(a, b) for i, (wa, a) in enumerate(singles) for wb, b in singles[i + 1:]
             if wa[0] != wb[0] and pieces.cpu[a] != pieces.cpu[b]]
    if swaps:
        cand = np.repeat(pieces.cpu[None, :], len(swaps), axis=0)
        for row, (a, b) in enumerate(swaps):
            cand[row, a], cand[row, b] = pieces.cpu[b], pieces.cpu[a]
        pairs = np.array([sorted(pair) for pair in swaps], dtype=np.int64)
        result["swaps"], result["swaps_linear"] = host.perf(pieces, cand, pairs, [(0, len(swaps))])
        result["swaps_unnamed"] = host.perf(pieces, cand)[0]
    if len(singles) >= 3:
        rng = random.Random(len(singles))
        cand = np.repeat(pieces.cpu[None, :], 6, axis=0)
        for row in range(6):
            for _, piece in rng.sample(singles, 3):
                cand[row, piece] = rng.randrange(len(host.cpus))
        result["three"] = host.perf(pieces, cand)[0]
    for name in ("terms", "spread"):
        keys, values, extra = (host.pair_terms if name == "terms" else host.pair_spread)(pieces)
        index = {g: i for i, g in enumerate(sorted(host.guests))}
        owner = np.array([index[key[0]] for key in keys], dtype=np.int64)
        sums = np.zeros((len(index), len(index)))
        np.add.at(sums, (owner[:, None], owner[None, :]), values)
        result[name] = sums
        if name == "spread":
            spread_sums = np.zeros((len(index), len(index)))
            np.add.at(spread_sums, (owner[:, None], owner[None, :]), extra)
            result["variance"] = spread_sums
    return result


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("form", ["additive", "multiplicative"])
def test_bounded_forms_predict_what_the_plain_forms_predict(seed, form, monkeypatch):
    state, fitted = host_state(seed), model(seed, form)
    plain = scored(laid_out(state, fitted, PLAIN, monkeypatch))
    bounded_host = laid_out(state, fitted, BOUNDED, monkeypatch)
    bounded = scored(bounded_host)
    assert plain.keys() == bounded.keys()
    for name in plain:
        assert close(plain[name], bounded[name]), name
    # the bounded form did merge: fewer pieces than vCPU × pCPU pairs when a guest floats with
    # more than one vCPU over the same pCPUs
    merged = any(len({cpus for cpus in pins.values() if len(cpus) != 1}) < sum(len(c) != 1 for c in pins.values())
                 for pins in bounded_host.pins.values())
    counts = laid_out(state, fitted, PLAIN, monkeypatch).pieces().cpu.size, bounded_host.pieces().cpu.size
    assert (counts[1] < counts[0]) == merged


@pytest.mark.parametrize("seed", range(6))
def test_layouts_after_moves_predict_alike(seed, monkeypatch):
    """Moves taken and taken back (derived evaluations, kept ones) score alike in both forms."""
    state, fitted = host_state(seed + 100, guests=8), model(seed)
    hosts = {}
    for label, constants in (("plain", PLAIN), ("bounded", BOUNDED)):
        host = laid_out(state, fitted, constants, monkeypatch)
        step = random.Random(seed)
        values = []
        for _ in range(6):
            pinned = [n for n, pins in host.pins.items() if all(len(c) == 1 for c in pins.values())]
            if not pinned:
                break
            name = step.choice(pinned)
            vcpu = step.choice(sorted(host.pins[name]))
            host.set_pins(name, {**host.pins[name], vcpu: frozenset({step.choice(host.cpus)})})
            pieces = host.pieces()
            values.append(host.perf(pieces, pieces.cpu)[0])
        hosts[label] = values
    assert len(hosts["plain"]) == len(hosts["bounded"])
    for a, b in zip(hosts["plain"], hosts["bounded"]):
        assert close(a, b)


@pytest.mark.parametrize("seed", range(6))
def test_a_plan_is_as_good_in_both_forms(seed, monkeypatch):
    """The same objective before and after, the same number of actions of each kind. (Where two
    pCPUs are alike — SMT siblings of one core — their predictions tie exactly, and the last bit
    of rounding may pick either: the actions' pCPUs may differ, not what they are worth.)"""
    state, fitted = host_state(seed + 200, guests=10), model(seed)
    plans = {}
    for label, constants in (("plain", PLAIN), ("bounded", BOUNDED)):
        for name, value in constants.items():
            monkeypatch.setattr(layout_module, name, value)
        plan = plan_rebalance(state, fitted, RebalanceSettings(), now=0.0)
        plans[label] = (sorted((a.kind, a.guest or "") for a in plan.actions), plan.objective_before,
                        plan.objective_after)
    assert plans["plain"][0] == plans["bounded"][0]
    assert plans["plain"][1] == pytest.approx(plans["bounded"][1], rel=1e-9)
    assert plans["plain"][2] == pytest.approx(plans["bounded"][2], rel=1e-9)


def test_a_guest_group_is_one_piece_per_pcpu(monkeypatch):
    """A 4-vCPU guest floating over a 6-pCPU node is 6 pieces, not 24, each standing for 4 vCPUs."""
    topology = uniform_topology(nodes=2, cores_per_node=3, threads_per_core=2, name="h")
    node = frozenset(c for c in topology.cpus if topology.cpus[c].node == 0)
    guest = describe_guest(Placement(guest="f", host="h", vcpupin={v: node for v in range(4)}, memory_kib=1 << 20),
                           labels={"workload": "a"})
    counts = defaultdict(int)
    for label, constants in (("plain", PLAIN), ("bounded", BOUNDED)):
        state = ClusterState({"h": HostState("h", topology)}, {"f": guest})
        pieces = laid_out(state, model(0), constants, monkeypatch).pieces()
        counts[label] = len(pieces.cpu)
        if label == "bounded":
            assert pieces.vcpus_per_piece is not None and set(pieces.vcpus_per_piece.tolist()) == {4.0}
            assert pieces.demand.sum() == pytest.approx(guest.load * 4)
    assert counts == {"plain": 24, "bounded": 6}


# --------------------------------------------------------------------------- the model's own sums
@pytest.mark.parametrize("seed", range(8))
def test_the_models_prediction_summed_per_pcpu_equals_the_pairwise_sum(seed, monkeypatch):
    """`InterferenceModel.predict` and admission's scoring on layouts past `DENSE_PIECES` sum
    neighbours per pCPU and key: the same predictions as the piece × piece sums."""
    from vmplacer.core.model import interference
    from vmplacer.core.model.interference import Tenant

    state, fitted = host_state(seed + 300, guests=12), model(seed)
    topology = state.hosts["h"].topology
    usable = frozenset(topology.usable_cpus)
    tenants = [Tenant(g.name, {v: (p or usable) for v, p in g.placement.vcpupin.items()}, key=g.key,
                      workload_class=g.workload_class, load=g.load) for g in state.guests.values()]
    layout = interference.TenantLayout.build(topology, tenants)
    keys = np.array([i % 3 for i in layout.owner], dtype=np.int64)
    table = np.random.default_rng(seed).uniform(-0.1, 0.4, size=(len(interference.DistanceClass), 3, 3))
    monkeypatch.setattr(interference, "DENSE_PIECES", 10**9)
    dense_sum = layout.neighbour_sum(table, keys)
    dense = fitted.predict(topology, tenants)
    monkeypatch.setattr(interference, "DENSE_PIECES", 0)
    assert close(dense_sum, layout.neighbour_sum(table, keys))
    summed = fitted.predict(topology, tenants)
    assert dense.keys() == summed.keys()
    for name in dense:
        for field in ("perf", "confidence", "share", "throughput"):
            assert getattr(summed[name], field) == pytest.approx(getattr(dense[name], field), rel=1e-9, abs=1e-12)


def test_a_tenants_vcpus_on_one_pcpu_are_one_piece():
    """Flattening counts a tenant's vCPUs that may run on one pCPU as one piece: a 4-vCPU tenant
    floating over 12 pCPUs is 12 pieces, with the demand of its four vCPUs."""
    from vmplacer.core.model.interference import Tenant, TenantLayout

    topology = uniform_topology(nodes=2, cores_per_node=3, threads_per_core=2, name="h")
    everywhere = frozenset(topology.cpus)
    layout = TenantLayout.build(topology, [Tenant("f", {v: everywhere for v in range(4)}, load=0.6),
                                           Tenant("p", {0: frozenset({3})})])
    assert len(layout.owner) == 13
    assert layout.demand[layout.owner == 0] == pytest.approx([0.6 * 4 / 12] * 12)


# --------------------------------------------------------------------------- the memory budget
def floating_host(name: str, floating: int) -> tuple[HostState, dict]:
    topology = uniform_topology(nodes=2, cores_per_node=8, threads_per_core=2, name=name)
    guests = {}
    for index in range(6 + floating):
        guest = f"{name}-g{index}"
        pins = {0: frozenset({index % 32})} if index < 6 else {v: frozenset() for v in range(2)}
        guests[guest] = describe_guest(Placement(guest=guest, host=name, vcpupin=pins, memory_kib=1 << 20),
                                       labels={"workload": KEYS[index % len(KEYS)]})
    return HostState(name, topology), guests


def test_a_host_over_the_memory_budget_is_left_out_named():
    small, small_guests = floating_host("small", 1)
    big, big_guests = floating_host("big", 12)
    state = ClusterState({"small": small, "big": big}, {**small_guests, **big_guests})
    # small: 70 pieces, about 97 MiB; big: 6 pinned + 12 floating guests over 32 pCPUs = 390
    # pieces, about 96 + 390² · 8 B · 16 = 115 MiB (core/rebalance/budget.py)
    plan = plan_rebalance(state, model(1), RebalanceSettings(memory_budget_mib=105), now=0.0)
    left_out = plan.settings["notes"]["left_out"]
    assert [entry["host"] for entry in left_out] == ["big"]
    assert "390 pieces" in left_out[0]["why"] and "rebalance.search.memory_budget_mib" in left_out[0]["why"]
    assert "1 host left out, over the memory budget of 105 MiB: big" in plan.summary
    assert all(action.host == "small" for action in plan.actions)
    roomy = plan_rebalance(state, model(1), RebalanceSettings(memory_budget_mib=1024), now=0.0)
    assert roomy.settings["notes"]["left_out"] == []
    # the big host's 18 guests count in the roomy plan's objective, not in the budgeted one's
    assert abs(roomy.objective_before - plan.objective_before) > 1.0


def test_evaluations_let_go_under_a_small_budget_give_the_same_plan():
    """Hosts that drop their kept evaluations (the budget's `keep_cells`) compute them again
    from the same pieces: the plan is the same, float for float."""
    hosts, guests = {}, {}
    for index in range(5):
        host, on_it = floating_host(f"h{index}", index + 1)
        hosts[host.name] = host
        guests.update(on_it)
    state = ClusterState(hosts, guests)
    plans = []
    for keep in (None, 1):
        import vmplacer.core.rebalance.search as search

        original = search.budget_cells
        if keep is not None:
            search.budget_cells = lambda settings: keep  # type: ignore[assignment]
        try:
            plan = plan_rebalance(state, model(2), RebalanceSettings(), now=0.0)
        finally:
            search.budget_cells = original  # type: ignore[assignment]
        plans.append(([repr(a) for a in plan.actions], plan.objective_before, plan.objective_after, plan.summary))
    assert plans[0] == plans[1]
    assert plans[0][0]


def test_a_host_past_its_search_budget_keeps_the_moves_found_and_is_named():
    """The per-host budget counts work, not wall time: the same plan on any machine, and a
    dry run stops where the real run stops."""
    host, guests = floating_host("h0", 4)
    state = ClusterState({"h0": host}, guests)
    free = plan_rebalance(state, model(0), RebalanceSettings(), now=0.0)
    assert free.settings["notes"]["cut_short"] == []
    tight = [plan_rebalance(state, model(0), RebalanceSettings(host_budget_s=1e-9), now=0.0) for _ in range(2)]
    assert [repr(a) for a in tight[0].actions] == [repr(a) for a in tight[1].actions]
    cut = tight[0].settings["notes"]["cut_short"]
    assert [entry["host"] for entry in cut] == ["h0"]
    assert "rebalance.search.host_budget_s" in cut[0]["why"]
    assert "search cut short on 1 host" in tight[0].summary
    # anytime: a bigger budget finds as many moves or more, and some budget stops the search
    # after moves were found, which stand
    moved = lambda plan: sum(1 for a in plan.actions if a.kind != "probe")  # noqa: E731
    counts = []
    for budget in (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1.0):
        plan = plan_rebalance(state, model(0), RebalanceSettings(host_budget_s=budget), now=0.0)
        counts.append((moved(plan), bool(plan.settings["notes"]["cut_short"])))
    assert [n for n, _ in counts] == sorted(n for n, _ in counts)
    assert any(cut and 0 < n < moved(free) for n, cut in counts), counts


def test_a_pool_over_the_memory_budget_is_not_evaluated():
    """Pooling the pinned vCPUs of a crowded node makes each of them one piece per pCPU of the
    pool: a candidate layout of many more pieces than the host's. Past the budget it is refused
    by name before it is built."""
    topology = uniform_topology(nodes=1, cores_per_node=8, threads_per_core=2, name="h")
    guests = {}
    for index in range(40):
        guest = f"g{index}"
        guests[guest] = describe_guest(Placement(guest=guest, host="h", vcpupin={0: frozenset({index % 16})},
                                                 memory_kib=1 << 20), labels={"workload": KEYS[index % len(KEYS)]})
    state = ClusterState({"h": HostState("h", topology)}, guests)
    roomy = plan_rebalance(state, model(4), RebalanceSettings(), now=0.0)
    # 40 pinned pieces as the host stands (about 96 MiB); pooled: 40 × 16 = 640 pieces, 146 MiB
    tight = plan_rebalance(state, model(4), RebalanceSettings(memory_budget_mib=120), now=0.0)
    assert tight.settings["notes"]["left_out"] == []
    assert not any("over the memory budget" in r for r in roomy.settings["notes"]["rejected"])
    assert any(r.startswith("pool on host h") and "over the memory budget, not evaluated" in r
               for r in tight.settings["notes"]["rejected"])


def _topology_variant(kind: str):
    """A 2-node host whose cache levels nest (as reported), whose one LLC spans both nodes (as with
    sub-NUMA clustering: the groups do not nest), or which reports no caches at all."""
    from dataclasses import replace as changed

    topology = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2, llc_per_node=kind != "snc", name=kind)
    if kind == "no-caches":
        topology = changed(topology, cpus={i: changed(c, l2=None, llc=None) for i, c in topology.cpus.items()})
    return topology


@pytest.mark.parametrize("kind", ["nested", "snc", "no-caches"])
@pytest.mark.parametrize("seed", range(4))
def test_sums_by_cache_groups_equal_the_pairwise_sum(kind, seed, monkeypatch):
    """Past `DENSE_PIECES` a pCPU's neighbours at one distance are a difference of two group sums
    when the levels nest; when they do not (an LLC wider than a node), or when a tenant's pieces
    carry several keys, the per-distance matrices are used. Every form sums what the pairwise sum does."""
    from vmplacer.core.model import interference
    from vmplacer.core.model.interference import Tenant, TenantLayout

    rng = random.Random(seed)
    topology = _topology_variant(kind)
    cpus = sorted(topology.cpus)
    tenants = [Tenant(f"t{i}", {v: frozenset(rng.sample(cpus, rng.choice([1, 1, 3, 8, 16]))) for v in range(rng.randint(1, 3))},
                      load=rng.choice([1.0, 0.4])) for i in range(14)]
    layout = TenantLayout.build(topology, tenants)
    table = np.random.default_rng(seed).uniform(-0.1, 0.4, size=(len(interference.DistanceClass), 3, 3))
    assert (layout.cpu_groups() is None) == (kind == "snc")
    per_tenant = np.array([i % 3 for i in layout.owner], dtype=np.int64)
    per_piece = np.arange(len(layout.owner), dtype=np.int64) % 3
    monkeypatch.setattr(interference, "DENSE_PIECES", 10**9)
    dense = [layout.neighbour_sum(table, keys) for keys in (per_tenant, per_piece)]
    monkeypatch.setattr(interference, "DENSE_PIECES", 0)
    for keys, expected in zip((per_tenant, per_piece), dense):
        assert close(expected, layout.neighbour_sum(table, keys))


def test_kept_tenant_pieces_build_the_same_layout(monkeypatch):
    """Admission keeps its neighbours' pieces between candidates (and floating tenants are
    flattened by array operations): a layout built from kept pieces is the one built pin by pin,
    float for float, and a pCPU the host lacks is refused alike."""
    from vmplacer.core.model import interference
    from vmplacer.core.model.interference import Tenant, TenantLayout

    monkeypatch.setattr(interference, "_LOOPED_PINS", 10**9)  # `build` without kept pieces: pin by pin

    topology = _topology_variant("nested")
    rng = random.Random(7)
    cpus = sorted(topology.cpus)
    tenants = [Tenant(f"t{i}", {v: frozenset(rng.sample(cpus, rng.choice([1, 2, 5, 16]))) for v in range(rng.randint(1, 4))},
                      load=rng.choice([1.0, 0.3])) for i in range(10)]
    kept: dict = {}
    for chosen in (tenants, tenants[3:], tenants[::-1]):
        fresh, reused = TenantLayout.build(topology, chosen), TenantLayout.build(topology, chosen, kept)
        for name in ("owner", "cpu", "demand", "granted", "alone", "cpu_slot", "cpu_ids"):
            assert np.array_equal(getattr(fresh, name), getattr(reused, name)), name
    stray = [Tenant("stray", {0: frozenset({1}), 1: frozenset({2, 99})})]
    with pytest.raises(ValueError) as plain:
        TenantLayout.build(topology, stray)
    with pytest.raises(ValueError) as memo:
        TenantLayout.build(topology, stray, {})
    assert str(plain.value) == str(memo.value) and "vCPU 1 pinned to pCPU 99" in str(memo.value)
    with pytest.raises(ValueError, match="'t1': field 'name' appears twice"):
        TenantLayout.build(topology, [tenants[1], tenants[1]], {})
