"""Hierarchical shrinkage guest → workload class → global for guests without samples."""

from __future__ import annotations

import numpy as np
import pytest

from tests.admission_model import LOSS, SCALE, guests, learned
from vmplacer.core.model.class_priors import Identity, ShrinkageSettings, ShrunkBetas
from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.topology.host import DistanceClass

LLC = DistanceClass.SAME_LLC.rank


def _mean_beta(model: InterferenceModel, backgrounds: list[str], foregrounds: list[str]) -> np.ndarray:
    """The evidence-weighted mean of the model's own β's, computed pair by pair."""
    evidence = model.evidence()
    total = np.zeros(len(DistanceClass))
    weight = 0.0
    for u in backgrounds:
        for v in foregrounds:
            w = evidence[u] * evidence[v]
            total += w * np.array([0.0] + [model.beta(u, v, c) for c in list(DistanceClass)[1:]])
            weight += w
    return total / weight


def test_no_data_gives_zero_and_all_weight_to_the_global_level():
    betas = ShrunkBetas(InterferenceModel())
    assert betas.empty
    assert betas.weights(Identity("new", "victim")) == {"own": 0.0, "class": 0.0, "global": 1.0}
    assert not betas.beta(Identity("a", "noisy"), Identity("b", "victim")).any()


def test_a_guest_of_unknown_class_gets_the_fleet_mean():
    model = learned()
    betas = ShrunkBetas(model)
    everyone = model.known_keys()
    got = betas.beta(Identity("new1", "unknown"), Identity("new2", "unknown"))
    assert betas.weights(Identity("new1", "unknown")) == {"own": 0.0, "class": 0.0, "global": 1.0}
    np.testing.assert_allclose(got, _mean_beta(model, list(everyone), list(everyone)), atol=1e-12)


def test_a_new_guest_of_a_known_class_is_its_class_shrunk_toward_the_fleet_by_evidence():
    model = learned()
    settings = ShrinkageSettings(class_evidence=50.0)
    betas = ShrunkBetas(model, settings)
    evidence = model.evidence()
    names = guests()
    n_victim = sum(evidence[k] for k in names["victim"])
    n_noisy = sum(evidence[k] for k in names["noisy"])
    w_victim = n_victim / (n_victim + 50.0)
    w_noisy = n_noisy / (n_noisy + 50.0)
    assert betas.weights(Identity("new", "victim")) == pytest.approx(
        {"own": 0.0, "class": w_victim, "global": 1 - w_victim})
    everyone = list(model.known_keys())
    levels = {"noisy": (names["noisy"], w_noisy), "victim": (names["victim"], w_victim)}
    expected = np.zeros(len(DistanceClass))
    for bg_members, bg_w in ((levels["noisy"][0], w_noisy), (everyone, 1 - w_noisy)):
        for fg_members, fg_w in ((levels["victim"][0], w_victim), (everyone, 1 - w_victim)):
            expected += bg_w * fg_w * _mean_beta(model, list(bg_members), list(fg_members))
    got = betas.beta(Identity("new-noisy", "noisy"), Identity("new-victim", "victim"))
    np.testing.assert_allclose(got, expected, atol=1e-12)
    # the class teaches the new guest: noisy → victim is far above quiet → victim
    quiet = betas.beta(Identity("new-quiet", "quiet"), Identity("new-victim", "victim"))
    assert got[LLC] > 3 * quiet[LLC]


def test_class_weight_grows_with_the_class_samples():
    few = ShrunkBetas(learned(count=60))
    many = ShrunkBetas(learned(count=600))
    identity = Identity("new", "victim")
    assert 0 < few.weights(identity)["class"] < many.weights(identity)["class"] < 1


def test_class_estimate_approaches_the_truth_with_data():
    betas = ShrunkBetas(learned(count=800), ShrinkageSettings(class_evidence=1.0))
    got = betas.beta(Identity("n", "noisy"), Identity("v", "victim"))
    truth = LOSS[("noisy", "victim")]
    assert got[LLC] == pytest.approx(truth, rel=0.25)
    assert got[DistanceClass.SAME_CORE.rank] == pytest.approx(truth * SCALE[DistanceClass.SAME_CORE], rel=0.25)


def test_a_profiled_guest_is_mostly_itself():
    model = learned()
    betas = ShrunkBetas(model, ShrinkageSettings(guest_evidence=1e-9))
    assert betas.weights(Identity("noisy0", "noisy"))["own"] == pytest.approx(1.0)
    got = betas.beta(Identity("noisy0", "noisy"), Identity("victim1", "victim"))
    np.testing.assert_allclose(got[LLC], model.beta("noisy0", "victim1", DistanceClass.SAME_LLC), atol=1e-6)
    default = ShrunkBetas(model).weights(Identity("noisy0", "noisy"))
    n = model.evidence()["noisy0"]
    assert default["own"] == pytest.approx(n / (n + 3.0))


def test_identity_prefers_the_learned_name_then_the_workload_key():
    betas = ShrunkBetas(learned())
    assert betas.identity("noisy0", "web", "quiet") == Identity("noisy0", "quiet")
    assert betas.identity("new", "quiet1", "quiet") == Identity("quiet1", "quiet")  # a replica's key
    assert betas.identity("new", "web", "quiet") == Identity("", "quiet")  # never seen: its class speaks
    assert betas.identity("new", "", "") == Identity("", "unknown")


def test_evidence_counts_observations_as_target_and_as_neighbour():
    model = learned(count=200)
    evidence = model.evidence()
    assert sum(evidence.values()) == pytest.approx(2 * model.observations)  # one target, one neighbour each


@pytest.mark.parametrize("field", ["guest_evidence", "class_evidence"])
@pytest.mark.parametrize("value", [0, -1, float("nan"), "3"])
def test_shrinkage_settings_refuse_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        ShrinkageSettings(**{field: value})
