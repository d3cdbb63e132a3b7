"""The interference scorer in the placement engine: with data it steers new guests away from
the neighbours the model says hurt them (or that they hurt); without data nothing changes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.admission_model import learned
from vmplacer.core.placement.allocate import NoFit, allocate
from vmplacer.core.model.class_priors import ShrinkageSettings, ShrunkBetas
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.model.interference import InterferenceModel, Tenant
from vmplacer.core.placement.interference_scorer import (
    AdmissionSettings,
    GuestProfile,
    InterferenceScorer,
    admission_scorer,
    interference_part,
    predicted_performance,
    profile_from_labels,
    profile_of_spec,
)
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.scoring import default_scorer
from vmplacer.core.topology.host import uniform_topology

HOST = uniform_topology(nodes=1, cores_per_node=4, threads_per_core=2, name="h")  # siblings n and n+4


def pinned(name: str, cpu: int) -> Placement:
    return Placement(guest=name, host="h", vcpupin={0: frozenset({cpu})}, dedicated=True,
                     exclusive_cpus=frozenset({cpu}), memory_kib=512 * 1024)


def spec(name: str, workload_class: str = "victim", **extra) -> GuestSpec:
    return GuestSpec.from_mapping({"name": name, "vcpus": 1, "memory_mib": 512, "cpu_policy": "dedicated",
                                   "labels": {"workload_class": workload_class}, **extra})


# ----- without data ---------------------------------------------------------------------------------------
MIXED_GUESTS = [
    {"name": "d1", "vcpus": 1, "memory_mib": 512, "cpu_policy": "dedicated"},
    {"name": "d2", "vcpus": 3, "memory_mib": 512, "cpu_policy": "dedicated"},
    {"name": "iso", "vcpus": 2, "memory_mib": 512, "cpu_policy": "dedicated", "thread_policy": "isolate"},
    {"name": "req", "vcpus": 2, "memory_mib": 512, "cpu_policy": "dedicated", "thread_policy": "require"},
    {"name": "s1", "vcpus": 2, "memory_mib": 512},
    {"name": "mix", "vcpus": 3, "memory_mib": 512, "cpu_policy": "mixed", "dedicated_vcpus": "0"},
    {"name": "wide", "vcpus": 10, "memory_mib": 1024, "cpu_policy": "dedicated"},
    {"name": "lc", "vcpus": 1, "memory_mib": 512, "workload_class": "latency-critical"},
    {"name": "s2", "vcpus": 4, "memory_mib": 512, "labels": {"workload_class": "victim"}},
]


@pytest.mark.parametrize("betas", [ShrunkBetas(InterferenceModel()), None], ids=["empty-model", "no-model"])
def test_without_data_placements_are_exactly_the_topology_ones(betas):
    topology = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2, name="h2")
    assert admission_scorer(betas, spec("x"), {}, AdmissionSettings()) == default_scorer()
    rng = random.Random(3)
    for _ in range(5):
        order = rng.sample(MIXED_GUESTS, len(MIXED_GUESTS))
        plain: list[Placement] = []
        aware: list[Placement] = []
        for data in order:
            guest = GuestSpec.from_mapping(data)
            try:
                expected = allocate(topology, guest, plain)
            except NoFit as refusal:
                with pytest.raises(NoFit) as same:
                    allocate(topology, guest, aware, scorer=admission_scorer(betas, guest, {}, AdmissionSettings()))
                assert same.value.reasons == refusal.reasons
                continue
            got = allocate(topology, guest, aware, scorer=admission_scorer(betas, guest, {}, AdmissionSettings()))
            assert got == expected  # pins, nodes and score alike
            plain.append(expected)
            aware.append(got)


def test_weight_zero_with_data_changes_nothing():
    betas = ShrunkBetas(learned())
    others = [pinned("a", 0), pinned("b", 2)]
    profiles = {"a": GuestProfile("a", "a", "noisy"), "b": GuestProfile("b", "b", "quiet")}
    scorer = admission_scorer(betas, spec("new"), profiles, AdmissionSettings(weight=0))
    assert scorer == default_scorer()
    assert allocate(HOST, spec("new"), others, scorer=scorer) == allocate(HOST, spec("new"), others)


# ----- with data --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("noisy, quiet", [("a", "b"), ("b", "a")])
def test_a_new_victim_avoids_the_noisy_guests_sibling(noisy, quiet):
    betas = ShrunkBetas(learned())
    others = [pinned("a", 0), pinned("b", 2)]  # cores 0 and 2 half used: siblings 4 and 6 are free
    profiles = {noisy: GuestProfile(noisy, noisy, "noisy"), quiet: GuestProfile(quiet, quiet, "quiet")}
    topology_only = allocate(HOST, spec("new"), others)
    assert topology_only.pcpus == {4}  # packing: the first half-used core, whoever runs there
    noisy_sibling = 4 if noisy == "a" else 6
    candidates: list[Placement] = []
    aware = allocate(HOST, spec("new"), others, scorer=admission_scorer(betas, spec("new"), profiles,
                                                                       AdmissionSettings()), candidates=candidates)
    assert aware.pcpus != {noisy_sibling}
    part = interference_part(admission_scorer(betas, spec("new"), profiles, AdmissionSettings()))
    assert part is not None
    losses = {next(iter(c.pcpus)): part.loss(HOST, c, others).total for c in candidates}
    assert losses[noisy_sibling] == max(losses.values())
    assert part.loss(HOST, aware, others).total < losses[noisy_sibling]
    # one candidate per core with free threads, so every choice is on the table
    assert set(losses) >= {1, 3, 4, 6}


def test_a_noisy_newcomer_keeps_off_the_victims_it_would_hurt():
    betas = ShrunkBetas(learned())
    others = [pinned("v", 0), pinned("q", 2)]
    profiles = {"v": GuestProfile("v", "v", "victim"), "q": GuestProfile("q", "q", "quiet")}
    newcomer = spec("new", "noisy")
    scorer = admission_scorer(betas, newcomer, profiles, AdmissionSettings())
    chosen = allocate(HOST, newcomer, others, scorer=scorer)
    assert chosen.pcpus != {4}  # the victim's sibling
    loss = interference_part(scorer).loss(HOST, pinned("new", 4), others)
    assert loss.joined["v"] > loss.joined.get("q", 0.0) > 0  # it is the victim who would pay


def test_loss_matches_the_model_prediction_for_profiled_guests():
    model = learned()
    betas = ShrunkBetas(model, ShrinkageSettings(guest_evidence=1e-9))  # own data only
    others = [pinned("noisy0", 0), pinned("quiet1", 2), pinned("victim2", 5)]
    profiles = {p.guest: GuestProfile(p.guest, p.guest, "") for p in others}
    scorer = InterferenceScorer(betas, GuestProfile("victim3", "victim3"), profiles)
    candidate = pinned("victim3", 4)
    loss = scorer.loss(HOST, candidate, others)
    tenants = [Tenant(p.guest, dict(p.vcpupin)) for p in others]
    before = model.predict(HOST, tenants)
    after = model.predict(HOST, [*tenants, Tenant("victim3", {0: frozenset({4})})])
    assert loss.guest == pytest.approx(1 - after["victim3"].perf, abs=1e-6)
    for name in ("noisy0", "quiet1", "victim2"):
        assert loss.joined.get(name, 0.0) == pytest.approx(before[name].perf - after[name].perf, abs=1e-6)
    assert scorer.score(HOST, candidate, others) == pytest.approx(1 / (1 + loss.total))


def test_floating_neighbours_lose_the_pcpus_the_candidate_takes():
    betas = ShrunkBetas(learned())
    floating = Placement(guest="f", host="h", vcpupin={0: frozenset({0, 4}), 1: frozenset({0, 4})},
                         memory_kib=512 * 1024)
    scorer = InterferenceScorer(betas, GuestProfile("new", "new", "victim"), {"f": GuestProfile("f", "f", "quiet")})
    loss = scorer.loss(HOST, pinned("new", 4), [floating])
    # two floating vCPUs squeezed from 2 pCPUs onto 1: half their time, whatever the β's
    assert loss.joined["f"] >= 0.5 - 1e-9


def test_predicted_performance_of_a_host():
    betas = ShrunkBetas(learned())
    placements = [pinned("v", 0), pinned("n", 4)]
    perf = predicted_performance(betas, HOST, placements, {"v": GuestProfile("v", "v", "victim"),
                                                           "n": GuestProfile("n", "n", "noisy")})
    assert perf["v"] < perf["n"] < 1.0
    assert predicted_performance(ShrunkBetas(InterferenceModel()), HOST, placements, {}) == {"v": 1.0, "n": 1.0}


def test_profiles_from_labels_and_specs():
    assert profile_from_labels("g", {"workload": "web", "workload_class": "batchy", "load": "0.5"}) == \
        GuestProfile("g", "web", "batchy", 0.5)
    assert profile_from_labels("g", {"load": "lots"}) == GuestProfile("g", "g", "unknown", 1.0)
    assert profile_from_labels("g", {"load": "7"}).load == 1.0
    assert profile_of_spec(spec("n", "victim")) == GuestProfile("n", "n", "victim", 1.0)
    assert profile_of_spec(GuestSpec.from_mapping({"name": "b", "vcpus": 1, "memory_mib": 64,
                                                   "workload_class": "batch"})).workload_class == "batch"


def test_flavor_class_feeds_the_class_priors():
    """A guest whose flavor names its class (`vmplacer:workload_class`) is predicted from that
    class's profiled guests, exactly as one labelled with it; without it, from the fleet."""
    betas = ShrunkBetas(learned())
    flavored = GuestSpec.from_mapping({"name": "n1", "vcpus": 1, "memory_mib": 64,
                                       "extra_specs": {"vmplacer:workload_class": "victim"}})
    profile = profile_of_spec(flavored)
    assert profile == profile_of_spec(spec("n1", "victim"))
    plain = profile_of_spec(GuestSpec.from_mapping({"name": "n1", "vcpus": 1, "memory_mib": 64}))
    as_class = betas.identity(profile.name, profile.key, profile.workload_class)
    as_nobody = betas.identity(plain.name, plain.key, plain.workload_class)
    assert betas.weights(as_class)["class"] > 0.5 and betas.weights(as_nobody)["class"] == 0.0
    noisy = betas.identity("x", "x", "noisy")
    assert not np.allclose(betas.beta(noisy, as_class), betas.beta(noisy, as_nobody))


@pytest.mark.parametrize("field, value", [("weight", -1), ("weight", float("inf")), ("candidates", -1),
                                          ("candidates", 2.5), ("candidates", 5000)])
def test_settings_refuse_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        AdmissionSettings(**{field: value})


def test_extra_candidates_keep_every_placement_rule():
    """With data the engine builds candidates from other starting cores; each placed guest still
    owns whole cores under isolate, sibling pairs under require, and nobody's pCPUs overlap."""
    from vmplacer.core.placement.allocate import owners_disjoint, refresh_shared_pins

    topology = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2, name="h2")
    betas = ShrunkBetas(learned())
    classes = ("noisy", "quiet", "victim")
    placed: list[Placement] = []
    profiles: dict[str, GuestProfile] = {}
    for index, data in enumerate(MIXED_GUESTS):
        guest = GuestSpec.from_mapping({**data, "labels": {"workload_class": classes[index % 3]}})
        candidates: list[Placement] = []
        try:
            placement = allocate(topology, guest, placed, scorer=admission_scorer(betas, guest, profiles,
                                                                                  AdmissionSettings()),
                                 candidates=candidates)
        except NoFit:
            continue
        assert placement in candidates
        for candidate in candidates:
            # floating guests leave the pCPUs a dedicated newcomer takes, as after every placement
            assert not owners_disjoint(refresh_shared_pins(topology, [*placed, candidate])), candidate
        if guest.effective_thread_policy in ("isolate", "require") and guest.dedicated_vcpu_set:
            cores = {topology.cpus[c].core for c in placement.pcpus}
            owned = {c for core in cores for c in topology.cores[core].cpus}
            assert owned <= placement.exclusive_cpus
        placed = refresh_shared_pins(topology, [*placed, placement])
        profiles[guest.name] = profile_of_spec(guest)
    assert len(placed) >= 6


@pytest.mark.parametrize("seed", range(4))
def test_floating_neighbours_narrowed_by_arrays_score_as_rebuilt_ones(seed, monkeypatch):
    """A candidate's floating neighbours (every vCPU over one pool) are narrowed from their kept
    pieces, not rebuilt as tenants: the same losses to the last bit, candidate after candidate
    (the pools of several shapes, some left whole when the candidate takes all of them). Both
    rebuild every candidate: judging it as a change is tested in test_admission_delta.py."""
    from vmplacer.core.placement import interference_scorer

    monkeypatch.setattr(InterferenceScorer, "judge_as_changes", False)

    rng = random.Random(seed)
    topology = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2, name="h")
    cpus = sorted(topology.cpus)
    others = []
    for i in range(10):
        if i % 2:
            pool = frozenset(rng.sample(cpus, rng.choice([2, 3, 8, 16])))
            others.append(Placement(guest=f"f{i}", host="h", vcpupin={v: pool for v in range(rng.randint(1, 3))},
                                    memory_kib=512 * 1024))
        else:
            others.append(Placement(guest=f"p{i}", host="h", vcpupin={0: frozenset({rng.choice(cpus)})},
                                    memory_kib=512 * 1024))
    profiles = {p.guest: GuestProfile(p.guest, rng.choice(["noisy0", "quiet1", "victim2"]), "") for p in others}
    betas = ShrunkBetas(learned())
    candidates = [pinned("new", c) for c in rng.sample(cpus, 6)]
    fast = InterferenceScorer(betas, GuestProfile("new", "victim3"), profiles)
    found = [fast.loss(topology, c, others) for c in candidates]
    assert fast._pools, "some neighbours were narrowed by arrays"
    monkeypatch.setattr(interference_scorer, "_pools", lambda *args: {})
    plain = InterferenceScorer(betas, GuestProfile("new", "victim3"), profiles)
    for candidate, loss in zip(candidates, found):
        again = plain.loss(topology, candidate, others)
        assert (loss.guest, loss.joined) == (again.guest, again.joined)
