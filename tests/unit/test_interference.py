"""The interference model on hand-computed cases (seed eq. 3.1–3.5) and its contracts."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from vmplacer.core.model.interference import (
    Exposure,
    InterferenceModel,
    ModelConfig,
    Observation,
    Tenant,
    interference_terms,
)
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import DistanceClass, uniform_topology

LLC = DistanceClass.SAME_LLC
REMOTE = DistanceClass.REMOTE_NODE

# β[background][foreground]: loss the background causes the foreground (not symmetric)
BETA = {
    "A": {"A": 0.10, "B": 0.30, "C": 0.05},
    "B": {"A": 0.20, "B": 0.15, "C": 0.02},
    "C": {"A": -0.03, "B": 0.08, "C": 0.01},
}


def pair_observations(beta=BETA, distance=LLC, repeat=1):
    """Noise-free pair measurements: foreground alone on one core, background on another."""
    return [
        Observation(fg, zeta=1.0 - value, zeta_b=1.0, neighbours=(Exposure(bg, distance, 1.0),))
        for bg, row in beta.items()
        for fg, value in row.items()
        for _ in range(repeat)
    ]


def exact_model(beta=BETA):
    """β data complete and taken as measured (no shrinkage): the seed's model exactly."""
    return InterferenceModel(ModelConfig(pair_shrinkage=0.0)).fit(pair_observations(beta))


TWO_CORES = uniform_topology(nodes=1, cores_per_node=2)


def test_complete_pairs_are_reproduced_exactly():
    model = exact_model()
    for bg, row in BETA.items():
        for fg, value in row.items():
            assert model.beta(bg, fg) == pytest.approx(value, abs=1e-12)


@pytest.mark.parametrize(("load_a", "load_b"), [(1.0, 1.0), (0.6, 0.8), (0.25, 1.0)])
def test_two_tasks_on_two_cores_follow_eq_3_1_and_3_2(load_a, load_b):
    model = exact_model()
    tenants = [Tenant("a", [0], key="A", load=load_a), Tenant("b", [1], key="B", load=load_b)]
    result = model.predict(TWO_CORES, tenants)
    # eq. 3.2, per task: L_A·L_B·β_{B→A} is the overhead A suffers, relative to L_A
    assert result["a"].perf == pytest.approx(1 - BETA["B"]["A"] * load_b, abs=1e-12)
    assert result["b"].perf == pytest.approx(1 - BETA["A"]["B"] * load_a, abs=1e-12)
    # eq. 3.1: L_sys = L_A + L_B − β_{A|B}·L_A·L_B with β_{A|B} = β_{A→B} + β_{B→A}
    l_sys = load_a + load_b - (BETA["A"]["B"] + BETA["B"]["A"]) * load_a * load_b
    assert result["a"].throughput + result["b"].throughput == pytest.approx(l_sys, abs=1e-12)


def seed_system_load(cores: list[dict[str, float]]) -> float:
    """Eq. 3.5 literally: Σ|T_i| − Σ_i Σ_{j≠i} T_iᵀ B T_j with task-load vectors per core."""
    names = sorted(BETA)
    b = np.array([[BETA[r][c] for c in names] for r in names])
    vectors = [np.array([core.get(n, 0.0) for n in names]) for core in cores]
    total = sum(v.sum() for v in vectors)
    overhead = sum(vectors[i] @ b @ vectors[j] for i in range(len(vectors)) for j in range(len(vectors)) if i != j)
    return float(total - overhead)


@pytest.mark.parametrize(
    "cores",
    [
        # the seed's own example: A, B, C on core 1; B and C on core 2
        [{"A": 0.3, "B": 0.3, "C": 0.4}, {"B": 0.5, "C": 0.5}],
        [{"A": 0.2, "C": 0.1}, {"B": 0.9}],
        [{"A": 1.0}, {"A": 1.0}],  # replicas: the diagonal β_{A→A}
    ],
)
def test_tasks_sharing_cores_follow_eq_3_5(cores):
    model = exact_model()
    tenants = [
        Tenant(f"{name}{index}", [index], key=name, load=load)
        for index, core in enumerate(cores)
        for name, load in core.items()
    ]
    result = model.predict(TWO_CORES, tenants)
    assert sum(p.throughput for p in result.values()) == pytest.approx(seed_system_load(cores), abs=1e-12)


def test_time_sharing_divides_throughput_without_data():
    model = InterferenceModel()
    tenants = [Tenant(f"vm{i}", [0], key="A") for i in range(3)] + [Tenant("half", [1], key="B", load=0.5)]
    result = model.predict(TWO_CORES, tenants)
    for i in range(3):
        assert result[f"vm{i}"].perf == pytest.approx(1 / 3)
        assert result[f"vm{i}"].share == pytest.approx(1 / 3)
    assert result["half"].perf == pytest.approx(1.0)  # asks for half a pCPU, gets it
    # with no data at all every β is 0: the linear predictor, confidence 0 where neighbours exist
    assert all(p.confidence == 0.0 for p in result.values())


def test_undersubscribed_pcpu_is_not_divided():
    result = InterferenceModel().predict(TWO_CORES, [Tenant("x", [0], load=0.4), Tenant("y", [0], load=0.5)])
    assert result["x"].perf == result["y"].perf == pytest.approx(1.0)


def test_alone_is_perfect_and_certain():
    model = exact_model()
    result = model.predict(TWO_CORES, [Tenant("solo", {0: {0}, 1: {1}}, key="A")])
    assert result["solo"] == pytest.approx(result["solo"])  # a value, not None
    assert result["solo"].perf == 1.0 and result["solo"].confidence == 1.0


def test_own_vcpus_do_not_interfere_with_each_other():
    model = exact_model()
    two_vcpus = Tenant("big", {0: {0}, 1: {1}}, key="A")
    other = Tenant("other", [2], key="B")
    three = uniform_topology(nodes=1, cores_per_node=3)
    result = model.predict(three, [two_vcpus, other])
    # each of A's vCPUs is hurt by B once; B is hurt by both of A's vCPUs
    assert result["big"].perf == pytest.approx(1 - BETA["B"]["A"])
    assert result["other"].perf == pytest.approx(1 - 2 * BETA["A"]["B"])


def test_floating_vcpu_is_spread_over_its_pcpus():
    model = exact_model()
    floating = Tenant("f", {0: {0, 1}}, key="A")
    fixed = Tenant("p", [1], key="B")
    result = model.predict(TWO_CORES, [floating, fixed])
    # half of f runs on pCPU 0 (next to B), half shares pCPU 1 with B
    assert 0.0 < result["f"].perf < 1.0
    assert result["p"].share < 1.0


def test_unknown_workload_gets_class_and_global_average_never_an_error():
    model = InterferenceModel().fit(pair_observations(repeat=5))
    tenants = [Tenant("new", [0], key="NEVER-SEEN"), Tenant("b", [1], key="B")]
    result = model.predict(TWO_CORES, tenants)
    assert 0.0 < result["new"].perf < 1.0  # B is a known interferer: some loss is predicted
    known = model.predict(TWO_CORES, [Tenant("a", [0], key="A"), Tenant("b", [1], key="B")])
    assert result["new"].confidence < known["a"].confidence


def test_workload_class_average_is_used_for_an_unseen_member():
    heavy = {f"H{i}": {f"V{j}": 0.30 for j in range(3)} for i in range(3)}
    light = {f"L{i}": {f"V{j}": 0.01 for j in range(3)} for i in range(3)}
    observations = []
    for group, wclass in ((heavy, "memory"), (light, "compute")):
        for bg, row in group.items():
            for fg, value in row.items():
                observations += [Observation(fg, 1 - value, 1.0, (Exposure(bg, LLC, 1.0, wclass),))] * 3
    model = InterferenceModel().fit(observations)
    new_heavy = model.beta("H-new", "V0", background_class="memory")
    new_light = model.beta("L-new", "V0", background_class="compute")
    assert new_heavy > new_light + 0.1


def test_placement_conversion_and_validation():
    placement = Placement(guest="g1", host="h", vcpupin={0: frozenset({0}), 1: frozenset({1})})
    tenant = Tenant.from_placement(placement, key="A", load=0.5)
    assert tenant.cpus == {0: frozenset({0}), 1: frozenset({1})} and tenant.key == "A"
    with pytest.raises(ValueError, match=r"'g1'.*'cpus'.*pCPU 7"):
        InterferenceModel().predict(TWO_CORES, [Tenant("g1", [7])])
    with pytest.raises(ValueError, match=r"'x'.*'load'"):
        Tenant("x", [0], load=0.0)
    with pytest.raises(ValueError, match=r"'x'.*appears twice"):
        InterferenceModel().predict(TWO_CORES, [Tenant("x", [0]), Tenant("x", [1])])
    with pytest.raises(ValueError, match="zeta_b"):
        Observation("A", 0.9, 0.0, ())
    with pytest.raises(ValueError, match="distance"):
        Observation("A", 0.9, 1.0, (Exposure("B", DistanceClass.SAME_CPU, 1.0),))
    with pytest.raises(ValueError, match="pair_shrinkage"):
        ModelConfig(pair_shrinkage=-1)
    with pytest.raises(ValueError, match="distance_prior"):
        ModelConfig(distance_prior={"far-away": 1.0})


def test_interference_terms_are_the_observation_equation():
    topo = uniform_topology(nodes=2, cores_per_node=2)
    tenants = [
        Tenant("a", [0], key="A"), Tenant("a2", [0], key="A"),
        Tenant("b", [1], key="B"), Tenant("c", [2], key="C", load=0.5),
    ]
    terms = interference_terms(topo, tenants)
    share, exposures = terms["a"]
    assert share == pytest.approx(0.5)
    weights = {(e.key, e.distance): e.load for e in exposures}
    # a gets half of pCPU 0; B runs all the time next door, C half the time on the other node
    assert weights == {("B", LLC): pytest.approx(0.5), ("C", REMOTE): pytest.approx(0.25)}
    model = exact_model()
    # the model's prediction is exactly share − Σ β·w
    expected = share - sum(model.beta(e.key, "A", e.distance) * e.load for e in exposures)
    assert model.predict(topo, tenants)["a"].perf == pytest.approx(expected)


def test_smt_siblings_are_same_core_neighbours():
    topo = uniform_topology(nodes=1, cores_per_node=2, threads_per_core=2)  # siblings n and n+2
    terms = interference_terms(topo, [Tenant("x", [0]), Tenant("y", [2]), Tenant("z", [1])])
    classes = {e.key: e.distance for e in terms["x"][1]}
    assert classes == {"y": DistanceClass.SAME_CORE, "z": DistanceClass.SAME_LLC}


SMALL_BETA = {bg: {fg: 0.3 * v for fg, v in row.items()} for bg, row in BETA.items()}


def additive_truth_observations(rng: random.Random, beta, scale, n_hosts: int):
    """Noise-free observations of random placements under an additive ground truth.

    Cores get 0–3 VMs each: with the same count on every core, an offset between
    distance classes would be invisible (every VM then sees the same total
    exposure per class), and so would the class scales.
    """
    topo = uniform_topology(nodes=2, cores_per_node=4)
    observations = []
    names = sorted(beta)
    for h in range(n_hosts):
        tenants = [
            Tenant(f"h{h}-c{core}-{s}", [core], key=rng.choice(names))
            for core in range(8) for s in range(rng.randint(0, 3))
        ]
        for tenant in tenants:
            share, exposures = interference_terms(topo, tenants, [tenant.name])[tenant.name]
            loss = sum(scale[e.distance] * beta[e.key][tenant.key] * e.load for e in exposures)
            observations.append(Observation(tenant.key, share - loss, 1.0, exposures, share))
    return observations


def test_fitting_recovers_known_betas_and_distance_scales_from_noiseless_samples():
    rng = random.Random(7)
    scale = {LLC: 1.0, REMOTE: 0.4}
    observations = additive_truth_observations(rng, SMALL_BETA, scale, 60)
    model = InterferenceModel().fit(observations)
    assert model.reference_distance in (LLC, REMOTE)  # the better observed one, its scale fixed
    for bg, row in SMALL_BETA.items():
        for fg, value in row.items():
            assert model.beta(bg, fg, LLC) == pytest.approx(value, abs=2e-3)
            assert model.beta(bg, fg, REMOTE) == pytest.approx(0.4 * value, abs=2e-3)
    assert model.distance_scale(REMOTE) / model.distance_scale(LLC) == pytest.approx(0.4, abs=0.05)


def test_online_updates_equal_a_batch_fit():
    observations = additive_truth_observations(random.Random(3), SMALL_BETA, {LLC: 1.0, REMOTE: 0.5}, 10)
    batch = InterferenceModel().fit(observations)
    online = InterferenceModel()
    for obs in observations:
        online.update(obs)
    assert online.observations == batch.observations == len(observations)
    topo = uniform_topology(nodes=2, cores_per_node=4)
    tenants = [Tenant(f"t{i}", [i], key=k) for i, k in enumerate("ABCABCAB")]
    a, b = batch.predict(topo, tenants), online.predict(topo, tenants)
    for name in a:
        assert a[name].perf == pytest.approx(b[name].perf, abs=1e-9)
        assert a[name].confidence == pytest.approx(b[name].confidence, abs=1e-9)


def test_round_trip_through_a_plain_dict():
    observations = additive_truth_observations(random.Random(5), SMALL_BETA, {LLC: 1.0, REMOTE: 0.3}, 8)
    model = InterferenceModel(ModelConfig(pair_shrinkage=1.0, distance_prior={"remote-node": 0.5})).fit(observations)
    data = json.loads(json.dumps(model.to_dict()))
    restored = InterferenceModel.from_dict(data)
    assert restored.config == model.config
    topo = uniform_topology(nodes=2, cores_per_node=4)
    tenants = [Tenant(f"t{i}", [i], key=k, workload_class="batch") for i, k in enumerate("ABCCBA")]
    a, b = model.predict(topo, tenants), restored.predict(topo, tenants)
    assert {n: p.perf for n, p in a.items()} == pytest.approx({n: p.perf for n, p in b.items()}, abs=1e-12)
    # and it keeps learning after a reload
    restored.update(observations[0])
    assert restored.observations == model.observations + 1
    with pytest.raises(ValueError, match="format"):
        InterferenceModel.from_dict({"format": "something-else"})
    with pytest.raises(ValueError, match=r"blocks\[0\]"):
        InterferenceModel.from_dict({**data, "blocks": [{"key": "A"}]})


def test_confidence_grows_with_evidence():
    few = InterferenceModel().fit(pair_observations(repeat=1))
    many = InterferenceModel().fit(pair_observations(repeat=20))
    tenants = [Tenant("a", [0], key="A"), Tenant("b", [1], key="B")]
    low, high = few.predict(TWO_CORES, tenants)["a"].confidence, many.predict(TWO_CORES, tenants)["a"].confidence
    assert 0.0 < low < high <= 1.0


def test_scores_rank_like_row_and_column_means():
    model = InterferenceModel().fit(pair_observations(repeat=3))
    interference = {k: model.interference(k) for k in BETA}
    sensitivity = {k: model.sensitivity(k) for k in BETA}
    row_mean = {bg: np.mean(list(row.values())) for bg, row in BETA.items()}
    col_mean = {fg: np.mean([BETA[bg][fg] for bg in BETA]) for fg in BETA}
    assert sorted(interference, key=interference.get) == sorted(row_mean, key=row_mean.get)
    assert sorted(sensitivity, key=sensitivity.get) == sorted(col_mean, key=col_mean.get)


def test_unseen_pairs_use_the_factor_model():
    """Leave one pair out of a rank-structured matrix: the factors predict it."""
    pressure = {"P1": 0.05, "P2": 0.2, "P3": 0.4, "P4": 0.1}
    fragility = {"P1": 0.2, "P2": 1.0, "P3": 0.6, "P4": 0.1}
    beta = {u: {v: pressure[u] * fragility[v] for v in pressure} for u in pressure}
    held_out = ("P3", "P2")  # the biggest loss: 0.24
    observations = [o for o in pair_observations(beta, repeat=3)
                    if (o.neighbours[0].key, o.key) != held_out]
    model = InterferenceModel().fit(observations)
    mean = np.mean([v for u, row in beta.items() for k, v in row.items() if (u, k) != held_out])
    error = abs(model.beta(*held_out) - beta[held_out[0]][held_out[1]])
    assert error < abs(mean - beta[held_out[0]][held_out[1]]) / 2


def test_noise_sd_recovers_the_noise_of_the_observations():
    """Losses of a fixed additive form plus Gaussian noise of σ: the residual standard deviation
    the model reports is σ (and 0 with no data)."""
    assert InterferenceModel().noise_sd == 0.0
    rng = random.Random(7)
    keys = ("a", "b", "c", "d")
    cost = {k: 0.05 * (i + 1) for i, k in enumerate(keys)}
    observations = []
    for _ in range(2000):
        key = rng.choice(keys)
        company = rng.sample([k for k in keys if k != key], rng.randint(1, 3))
        loss = sum(cost[k] for k in company) + rng.gauss(0.0, 0.04)
        observations.append(Observation(key, 1.0 - loss, 1.0,
                                        tuple(Exposure(k, DistanceClass.SAME_LLC, 1.0) for k in company)))
    model = InterferenceModel().fit(observations)
    assert 0.036 < model.noise_sd < 0.044
