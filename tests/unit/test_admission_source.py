"""Where placement's scorer comes from: the stored model, reloaded when stale, and placement by
topology alone (with the reason) when the model cannot be read."""

from __future__ import annotations

from tests.admission_model import learned
from vmplacer.app.place.admission import ModelAdmission, profiles_of
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.placement.interference_scorer import AdmissionSettings, GuestProfile, interference_part
from vmplacer.core.placement.scoring import default_scorer
from vmplacer.ports import DomainInfo

SPEC = GuestSpec.from_mapping({"name": "new", "vcpus": 1, "memory_mib": 64, "cpu_policy": "dedicated"})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_model_is_read_once_and_again_when_stale():
    models = [InterferenceModel(), learned()]
    loads: list[int] = []

    def load() -> InterferenceModel:
        loads.append(1)
        return models[min(len(loads), len(models)) - 1]

    clock = Clock()
    admission = ModelAdmission(load, AdmissionSettings(), refresh_s=60.0, clock=clock)
    assert admission.scorer(SPEC, {}) == default_scorer()
    assert admission.status == "no data (topology only)"
    clock.now = 59.0
    assert admission.scorer(SPEC, {}) == default_scorer() and len(loads) == 1
    clock.now = 60.0
    scorer = admission.scorer(SPEC, {})
    assert len(loads) == 2 and interference_part(scorer) is not None
    assert admission.status == f"{models[1].observations} observations"


def test_an_unreadable_model_means_topology_only_and_says_why():
    def load() -> InterferenceModel:
        raise RuntimeError("database is down")

    admission = ModelAdmission(load, AdmissionSettings(), clock=Clock())
    assert admission.scorer(SPEC, {}) == default_scorer()
    assert admission.status == "unavailable (RuntimeError: database is down)"


def test_weight_from_settings_and_profiles_from_labels():
    admission = ModelAdmission(learned, AdmissionSettings(weight=0.0), clock=Clock())
    assert admission.scorer(SPEC, {}) == default_scorer()
    domains = [DomainInfo("a", "u", "running", None, 1, 1024, labels={"workload_class": "noisy", "load": "0.5"}),
               DomainInfo("b", "v", "running", None, 1, 1024)]
    assert profiles_of(domains) == {"a": GuestProfile("a", "a", "noisy", 0.5), "b": GuestProfile("b", "b")}
