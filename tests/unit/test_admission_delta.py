"""Admission judges a candidate as a change to the kept neighbours (`admission_delta.KeptHost`):
the losses equal a full rebuild of the host with the candidate, to 1e-9 relative, on random
hosts, neighbours (pinned, dedicated, floating over the host, a node, a set, each vCPU its own
set; busy and half-idle; overcommitted), candidates and both model forms — and the engine
chooses the same placement either way."""

from __future__ import annotations

import random
from dataclasses import replace as changed

import pytest

from tests.admission_model import learned, observations
from vmplacer.core.model.class_priors import ShrunkBetas
from vmplacer.core.model.interference import InterferenceModel, ModelConfig
from vmplacer.core.placement.allocate import NoFit, allocate
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.interference_scorer import GuestProfile, InterferenceScorer, admission_scorer, \
    AdmissionSettings
from vmplacer.core.topology.host import uniform_topology

KEYS = ["noisy0", "noisy1", "quiet0", "victim0", "victim1"]


def topology_of(kind: str):
    """Levels that nest; an LLC spanning both nodes (groups do not nest); no caches reported."""
    topology = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2, llc_per_node=kind != "snc", name="h")
    if kind == "no-caches":
        topology = changed(topology, cpus={i: changed(c, l2=None, llc=None) for i, c in topology.cpus.items()})
    return topology


def neighbours(rng: random.Random, topology, count: int) -> list[Placement]:
    cpus = sorted(topology.cpus)
    nodes = [frozenset(c for c in cpus if topology.cpus[c].node == n) for n in (0, 1)]
    others, owned = [], set()
    for i in range(count):
        kind = rng.choice(("pinned", "pinned", "pinned", "dedicated", "host", "node", "set", "set", "mixed"))
        vcpus = 1 if kind == "pinned" and rng.random() < 0.8 else rng.randint(1, 3)
        extra: dict = {}
        if kind == "pinned":
            pins = {v: frozenset({rng.choice(cpus)}) for v in range(vcpus)}
        elif kind == "dedicated":
            free = [c for c in cpus if c not in owned]
            if len(free) < vcpus + 4:
                continue
            chosen = rng.sample(free, vcpus)
            owned.update(chosen)
            pins = {v: frozenset({c}) for v, c in enumerate(chosen)}
            extra = {"dedicated": True, "exclusive_cpus": frozenset(chosen)}
        elif kind == "host":
            pins = {v: frozenset() for v in range(vcpus)}
        elif kind == "node":
            pool = rng.choice(nodes)
            pins = {v: pool for v in range(vcpus)}
        elif kind == "set":
            pool = frozenset(rng.sample(cpus, rng.randint(2, 10)))
            pins = {v: pool for v in range(vcpus)}
        else:
            pins = {v: frozenset(rng.sample(cpus, rng.randint(1, 4))) for v in range(vcpus)}
        if kind == "mixed" and rng.random() < 0.5:
            continue  # some hosts have none: a candidate cutting one is rebuilt
        others.append(Placement(guest=f"{kind}{i}", host="h", vcpupin=pins, memory_kib=512 * 1024, **extra))
    return others


def candidates(rng: random.Random, topology, others: list[Placement], count: int) -> list[Placement]:
    owned = {c for p in others for c in p.exclusive_cpus}
    free = [c for c in sorted(topology.cpus) if c not in owned]
    found = []
    for _ in range(count):
        if rng.random() < 0.75:  # dedicated: exclusive pCPUs (floating neighbours leave them)
            chosen = rng.sample(free, min(len(free), rng.randint(1, 4)))
            found.append(Placement(guest="new", host="h", vcpupin={v: frozenset({c}) for v, c in enumerate(chosen)},
                                   dedicated=True, exclusive_cpus=frozenset(chosen), memory_kib=512 * 1024))
        else:  # shared: floats over a set, takes nothing
            pool = frozenset(rng.sample(free, rng.randint(1, len(free))))
            found.append(Placement(guest="new", host="h", vcpupin={v: pool for v in range(rng.randint(1, 3))},
                                   memory_kib=512 * 1024))
    return found


def model(form: str) -> InterferenceModel:
    return InterferenceModel(ModelConfig(form=form)).fit(observations(300, seed=3))


def agree(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-3)


@pytest.mark.parametrize("form", ["additive", "multiplicative"])
@pytest.mark.parametrize("kind", ["nested", "snc", "no-caches"])
@pytest.mark.parametrize("seed", range(6))
def test_a_candidate_judged_as_a_change_loses_what_a_rebuild_loses(seed, kind, form):
    rng = random.Random(f"{seed}/{kind}/{form}")
    topology = topology_of(kind)
    others = neighbours(rng, topology, rng.randint(3, 14))
    profiles = {p.guest: GuestProfile(p.guest, rng.choice(KEYS), "", rng.choice([1.0, 1.0, 0.5, 0.2]))
                for p in others}
    betas = ShrunkBetas(model(form))
    kept = InterferenceScorer(betas, GuestProfile("new", rng.choice(KEYS)), profiles)
    rebuilt = InterferenceScorer(betas, kept.guest, profiles)
    rebuilt.judge_as_changes = False
    judged = 0
    for candidate in candidates(rng, topology, others, 12):
        fast = kept.loss(topology, candidate, others)
        judged += kept._kept is not None and kept._judged(topology, candidate, frozenset(candidate.exclusive_cpus)) is not None
        full = rebuilt.loss(topology, candidate, others)
        assert agree(fast.guest, full.guest), (candidate, fast.guest, full.guest)
        for name in set(fast.joined) | set(full.joined):
            assert agree(fast.joined.get(name, 0.0), full.joined.get(name, 0.0)), (name, fast, full)
    JUDGED.append(judged)


JUDGED: list[int] = []


def test_most_candidates_above_were_judged_as_changes():
    """(Runs after the cases above.) The kept host answered for most candidates: the equality
    above tested it, not only the rebuild it falls back to."""
    assert len(JUDGED) == 36 and sum(JUDGED) >= 0.5 * 12 * len(JUDGED), f"{sum(JUDGED)} of {12 * len(JUDGED)}: {JUDGED}"


@pytest.mark.parametrize("seed", range(4))
def test_the_engine_chooses_the_same_pcpus_either_way(seed, monkeypatch):
    rng = random.Random(seed)
    topology = uniform_topology(nodes=2, cores_per_node=6, threads_per_core=2, name="h")
    others = [p for p in neighbours(rng, topology, 16)]
    labels = {p.guest: GuestProfile(p.guest, rng.choice(KEYS), "") for p in others}
    betas = ShrunkBetas(learned())
    spec = GuestSpec.from_mapping({"name": "new", "vcpus": rng.randint(1, 4), "memory_mib": 512,
                                   "cpu_policy": "dedicated", "labels": {"workload": rng.choice(KEYS)}})
    chosen = []
    for as_changes in (True, False):
        monkeypatch.setattr(InterferenceScorer, "judge_as_changes", as_changes)
        try:
            placement = allocate(topology, spec, others, scorer=admission_scorer(betas, spec, labels, AdmissionSettings()))
        except NoFit as refused:
            placement = refused  # both ways must refuse alike
        chosen.append(placement)
    assert repr(chosen[0]) == repr(chosen[1])


def test_a_guest_of_several_pieces_on_a_pcpu_whose_share_changes_is_judged_alike():
    """A candidate narrowing a floating guest changes the time share of an overcommitted pCPU that a
    guest pinned to two pCPUs runs on: that guest's own pieces' shares change, and are judged so."""
    topology = uniform_topology(nodes=1, cores_per_node=2, threads_per_core=2, name="h")
    wide = Placement(guest="wide", host="h", vcpupin={0: frozenset({0}), 1: frozenset({1})}, memory_kib=1 << 19)
    busy = Placement(guest="busy", host="h", vcpupin={0: frozenset({0})}, memory_kib=1 << 19)
    floating = Placement(guest="float", host="h", vcpupin={0: frozenset({0, 2, 3})}, memory_kib=1 << 19)
    others = [wide, busy, floating]
    profiles = {"wide": GuestProfile("wide", "victim0"), "busy": GuestProfile("busy", "noisy0"),
                "float": GuestProfile("float", "noisy1")}
    scorer = InterferenceScorer(ShrunkBetas(learned()), GuestProfile("new", "victim1"), profiles)
    candidate = Placement(guest="new", host="h", vcpupin={0: frozenset({2})}, dedicated=True,
                          exclusive_cpus=frozenset({2}), memory_kib=1 << 19)
    loss = scorer.loss(topology, candidate, others)
    assert scorer._judged(topology, candidate, frozenset({2})) is not None
    rebuilt = InterferenceScorer(scorer.betas, scorer.guest, profiles)
    rebuilt.judge_as_changes = False
    full = rebuilt.loss(topology, candidate, others)
    assert agree(loss.guest, full.guest) and loss.joined.keys() == full.joined.keys()
    assert all(agree(loss.joined[name], full.joined[name]) for name in full.joined)
    assert loss.joined["wide"] != 0.0


def test_a_cut_into_a_guest_whose_vcpus_float_over_different_sets_is_rebuilt():
    topology = uniform_topology(nodes=1, cores_per_node=2, threads_per_core=2, name="h")
    mixed = Placement(guest="mixed", host="h", vcpupin={0: frozenset({0, 2}), 1: frozenset({1, 2, 3})},
                      memory_kib=1 << 19)
    scorer = InterferenceScorer(ShrunkBetas(learned()), GuestProfile("new", "victim1"), {})
    candidate = Placement(guest="new", host="h", vcpupin={0: frozenset({2})}, dedicated=True,
                          exclusive_cpus=frozenset({2}), memory_kib=1 << 19)
    loss = scorer.loss(topology, candidate, [mixed])
    assert scorer._judged(topology, candidate, frozenset({2})) is None
    rebuilt = InterferenceScorer(scorer.betas, scorer.guest, {})
    rebuilt.judge_as_changes = False
    assert loss == rebuilt.loss(topology, candidate, [mixed])
