"""Learning keys sampled guests as the planner looks them up: replicas sharing a `workload`
label teach one key, which `describe_guest`'s GuestStates then find; unlabelled guests are
learned exactly as before; hostile label values are refused the same way on both sides."""

from __future__ import annotations

from collections import Counter

import re

import pytest

from vmplacer.app.learn.online import DEFAULT_MODEL, learn_from_runs, observations_from_samples
from vmplacer.app.learn.identities import GuestIdentities
from vmplacer.core.placement.guest import MAX_LABEL_VALUE, GuestSpec
from vmplacer.core.model.interference import InterferenceModel, Tenant
from vmplacer.core.placement.interference_scorer import profile_from_labels, profile_of_spec
from vmplacer.core.model.identity import ModelIdentity, model_identity
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.state import RebalanceInputError, describe_guest
from vmplacer.core.topology.host import DistanceClass, uniform_topology

LLC = DistanceClass.SAME_LLC
WEB = {"workload": "web", "workload_class": "batch"}
WEB_2_SPEC = {"name": "web-2", "vcpus": 1, "memory_mib": 512, "labels": WEB}
NOISY = {"workload": "stress"}
LOSS = 0.3  # what the noisy neighbour costs a web replica on the other core of the LLC


def pinned(name: str, cpu: int) -> Placement:
    return Placement(guest=name, host="h1", vcpupin={0: frozenset({cpu})}, memory_kib=512 * 1024)


def sample(guest, kind, value, at, neighbours=()):
    return {"guest": guest, "kind": kind, "metric": "cpu", "value": value, "at": at,
            "neighbours": [{"name": n, "distance": LLC.value, "frozen": True} for n in neighbours]}


def replica_samples(rounds: int = 20) -> list[dict]:
    """web-1 and web-2 (on either side of noisy-1) each lose LOSS to it; they cost it nothing."""
    samples = []
    for i in range(rounds):
        t = 10.0 * i
        for web in ("web-1", "web-2"):
            samples += [sample(web, "zeta", 1.0 - LOSS, t), sample(web, "zeta_b", 1.0, t + 1, ["noisy-1"])]
        samples += [sample("noisy-1", "zeta", 1.0, t), sample("noisy-1", "zeta_b", 1.0, t + 1, ["web-1", "web-2"])]
    return samples


class Runs:
    def __init__(self, runs: dict[int, list[dict]]):
        self.runs = runs

    def samples(self, run_id: int, guest: str | None = None) -> list[dict]:
        return self.runs[run_id]


class Models:
    def __init__(self):
        self.stored: dict[str, tuple[InterferenceModel, int | None]] = {}

    def load(self, name: str = DEFAULT_MODEL):
        return self.stored.get(name, (InterferenceModel(), None))

    def save(self, model, last_run_id, name: str = DEFAULT_MODEL):
        self.stored[name] = (model, last_run_id)


def identities() -> GuestIdentities:
    """web-1 and noisy-1 labelled on their domains; web-2's labels only on its placement record."""
    domains = {"web-1": dict(WEB), "web-2": {}, "noisy-1": dict(NOISY)}
    return GuestIdentities(lambda: domains, lambda name: WEB_2_SPEC if name == "web-2" else None)


def planner_guests():
    spec = GuestSpec.from_mapping(WEB_2_SPEC)
    return [describe_guest(pinned("web-1", 0), labels=WEB), describe_guest(pinned("web-2", 2), spec=spec),
            describe_guest(pinned("noisy-1", 1), labels=NOISY)]


def test_replicas_sharing_a_workload_label_teach_the_key_the_planner_looks_up():
    models = Models()
    learn_from_runs([1], Runs({1: replica_samples()}), models, identify=identities())
    model, _ = models.load()
    assert sorted(model.known_keys()) == ["stress", "web"]
    assert model.workload_class_of("web") == "batch"

    web_1, web_2, noisy = planner_guests()
    assert (web_1.key, web_1.workload_class) == (web_2.key, web_2.workload_class) == ("web", "batch")
    prior = InterferenceModel().beta(noisy.key, web_1.key, LLC, background_class=noisy.workload_class,
                                     foreground_class=web_1.workload_class)
    for web in (web_1, web_2):
        beta = model.beta(noisy.key, web.key, LLC, background_class=noisy.workload_class,
                          foreground_class=web.workload_class)
        assert beta != prior and beta == pytest.approx(LOSS, abs=0.02)
    # what the planner predicts for the GuestStates (rebalance/layout builds these tenants)
    topology = uniform_topology(nodes=1, cores_per_node=4)
    tenants = [Tenant(g.name, g.placement.vcpupin, key=g.key, workload_class=g.workload_class)
               for g in (web_1, noisy)]
    assert model.predict(topology, tenants)["web-1"].perf == pytest.approx(1.0 - LOSS, abs=0.03)


def test_learned_by_name_the_planner_would_not_find_them():
    """The same samples without identities: keys are the names, and the planner's lookup for
    the labelled GuestStates is the same as for a pair the model never saw."""
    models = Models()
    learn_from_runs([1], Runs({1: replica_samples()}), models)
    model, _ = models.load()
    assert sorted(model.known_keys()) == ["noisy-1", "web-1", "web-2"]
    web_1, _, noisy = planner_guests()
    unseen = model.beta("never-a", "never-b", LLC, background_class=noisy.workload_class,
                        foreground_class=web_1.workload_class)
    assert model.beta(noisy.key, web_1.key, LLC, background_class=noisy.workload_class,
                      foreground_class=web_1.workload_class) == unseen


def test_unlabelled_guests_are_learned_exactly_as_before():
    samples = replica_samples()
    names = {"web-1", "web-2", "noisy-1"}
    plain = GuestIdentities(lambda: {n: {} for n in names}, lambda name: None)(names)
    assert plain == {n: ModelIdentity(n, "unknown") for n in names}
    before, after = Counter(), Counter()
    assert observations_from_samples(samples, skipped=before) == observations_from_samples(
        samples, skipped=after, identities=plain)
    assert before == after
    # and guests nobody lists nor records (gone since they were sampled) keep their names
    assert GuestIdentities(lambda: {}, lambda name: None)(names) == {}


def test_classes_given_by_name_still_apply_to_guests_without_identity():
    [obs, *_] = observations_from_samples(replica_samples(1), {"noisy-1": "batch"},
                                          identities={"web-1": ModelIdentity("web", "batch")})
    assert obs.key == "noisy-1" and obs.workload_class == "batch"
    assert {(e.key, e.workload_class) for e in obs.neighbours} == {("web", "batch"), ("web-2", "unknown")}


@pytest.mark.parametrize("value, words", [
    ("we\x00b", "U+0000 at position 2"),
    ("w" * (MAX_LABEL_VALUE + 1), f"at most {MAX_LABEL_VALUE} characters"),
])
def test_a_hostile_workload_label_is_refused_alike_by_planner_and_learner(value, words):
    labels = {"workload": value, "workload_class": "batch"}
    with pytest.raises(RebalanceInputError, match=f"guest web-1: label 'workload'.*{re.escape(words)}"):
        describe_guest(pinned("web-1", 0), labels=labels)
    # the rebalancer then describes the guest from its record alone; learning keys it the same way
    spec = GuestSpec.from_mapping({**WEB_2_SPEC, "name": "web-1"})
    fallback = describe_guest(pinned("web-1", 0), spec=spec)
    found = GuestIdentities(lambda: {"web-1": labels}, lambda name: {**WEB_2_SPEC, "name": "web-1"})(["web-1"])
    assert found["web-1"] == ModelIdentity(fallback.key, fallback.workload_class) == ModelIdentity("web", "batch")
    # with no record, the name
    assert GuestIdentities(lambda: {"web-1": labels}, lambda name: None)(["web-1"]) == {
        "web-1": ModelIdentity("web-1", "unknown")}
    # admission scores such a neighbour under its name too
    assert profile_from_labels("web-1", labels).key == "web-1"


@pytest.mark.parametrize("labels, spec", [
    ({}, None),
    ({"workload": "web"}, None),
    ({"workload_class": "batch"}, None),
    ({}, {"name": "g", "vcpus": 1, "memory_mib": 512, "workload_class": "latency-critical"}),
    ({"workload": "db"}, {"name": "g", "vcpus": 1, "memory_mib": 512, "labels": {"workload": "web"}}),
    ({"workload": ""}, {"name": "g", "vcpus": 1, "memory_mib": 512, "labels": {"workload_class": "batch"}}),
])
def test_planner_admission_and_learning_take_one_identity(labels, spec):
    parsed = GuestSpec.from_mapping(spec) if spec else None
    state = describe_guest(pinned("g", 0), labels=labels, spec=parsed)
    identity = model_identity("g", labels, parsed)
    assert (state.key, state.workload_class) == (identity.key, identity.workload_class)
    assert GuestIdentities(lambda: {"g": labels}, lambda name: spec)(["g"])["g"] == identity
    if parsed is not None:
        assert (profile_of_spec(parsed).key, profile_of_spec(parsed).workload_class) == \
            (model_identity("g", spec=parsed).key, model_identity("g", spec=parsed).workload_class)
    else:
        assert (profile_from_labels("g", labels).key, profile_from_labels("g", labels).workload_class) == \
            (identity.key, identity.workload_class)


@pytest.mark.parametrize("bad", [
    {"load": "lots"}, {"priority": "5000"}, {"perf_floor": "2"}, {"dirty_mib_s": "-1"}, {"rebalance": "maybe"},
])
def test_any_bad_label_makes_planner_and_learner_fall_back_to_the_record_alike(bad):
    """One bad label and the rebalancer describes the guest from its record alone (its domain's
    `workload` label ignored with the rest); learning must key it the same way."""
    labels = {**WEB, **bad}
    with pytest.raises(RebalanceInputError, match=f"guest web-1: label '{next(iter(bad))}'"):
        describe_guest(pinned("web-1", 0), labels=labels)
    record = {**WEB_2_SPEC, "name": "web-1", "labels": {"workload": "web-record"}}
    fallback = describe_guest(pinned("web-1", 0), spec=GuestSpec.from_mapping(record))
    learned = GuestIdentities(lambda: {"web-1": labels}, lambda name: record)(["web-1"])["web-1"]
    assert learned == ModelIdentity(fallback.key, fallback.workload_class) == ModelIdentity("web-record", "unknown")
    # without a record both fall back to the name
    assert GuestIdentities(lambda: {"web-1": labels}, lambda name: None)(["web-1"])["web-1"] == \
        ModelIdentity(describe_guest(pinned("web-1", 0)).key, "unknown") == ModelIdentity("web-1", "unknown")
