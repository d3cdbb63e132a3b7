"""Online fitting: every Freeze'nSense sample pair becomes one model observation.

A ζb sample (neighbours frozen) next to the ζ sample taken closest in time
(neighbours running) is one equation in the β's of the neighbours that were
frozen: ζ/ζb = own_share − Σ β·load. Neighbours that share the VM's pCPU
are time sharing, not interference, so they lower `own_share` instead of
adding an exposure. Samples whose neighbours' distance is unknown (unpinned
guests) are skipped and counted: guessing a distance would teach the model
the wrong class.

A pair sample (ζp: everything frozen but the guest and one neighbour) next to
the guest's nearest ζb is an equation in that one neighbour's β alone: the
neighbours running during ζp that were frozen during ζb.

Samples name guests; the model is keyed by workload. Each sampled guest (and each
neighbour) is learned under the key and class the planner looks it up by
(core/model/identity.py): replicas sharing a `workload` label teach one key. The
caller says who is who (`identify`, app/learn/identities.py); a guest it does not
know (gone since it was sampled) is learned under its name, class unknown.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from vmplacer.core.model.interference import (
    UNKNOWN_CLASS,
    Exposure,
    InterferenceModel,
    ModelConfig,
    Observation,
)
from vmplacer.core.model.identity import ModelIdentity
from vmplacer.core.topology.host import DistanceClass

SAME_CPU = DistanceClass.SAME_CPU.value
DEFAULT_MODEL = "default"


class ModelRepository(Protocol):
    def load(self, name: str = "default") -> tuple[InterferenceModel, int | None]: ...
    def save(self, model: InterferenceModel, last_run_id: int | None, name: str = "default") -> None: ...


# The model identity of each of the named guests it knows (the others are learned by name).
Identify = Callable[[Collection[str]], Mapping[str, ModelIdentity]]


class SampleSource(Protocol):
    def samples(self, run_id: int, guest: str | None = None) -> list[dict[str, Any]]: ...


@dataclass
class LearnReport:
    runs: list[int] = field(default_factory=list)
    observations: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    total_observations: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "observations": self.observations,
                "skipped": dict(self.skipped), "total_observations": self.total_observations}


def observations_from_samples(
    samples: Iterable[Mapping[str, Any]],
    workload_classes: Mapping[str, str] | None = None,
    skipped: Counter[str] | None = None,
    identities: Mapping[str, ModelIdentity] | None = None,
) -> list[Observation]:
    """Pair each ζb with the nearest-in-time ζ of the same guest (same metric). A guest in
    `identities` is learned under its key and class, any other under its name and its class
    in `workload_classes` (default unknown)."""
    classes = _Identities(identities or {}, workload_classes or {})
    skipped = skipped if skipped is not None else Counter()
    by_guest: dict[tuple[str, str], dict[str, list[Mapping[str, Any]]]] = {}
    for sample in samples:
        slot = by_guest.setdefault((sample["guest"], sample["metric"]), {"zeta": [], "zeta_b": [], "zeta_p": []})
        if sample["kind"] in slot:
            slot[sample["kind"]].append(sample)
    result: list[Observation] = []
    for (guest, _metric), kinds in sorted(by_guest.items()):
        result += _pair_observations(guest, kinds["zeta_p"], kinds["zeta_b"], classes, skipped)
        shared = sorted(kinds["zeta"], key=lambda s: s["at"])
        if not shared:
            skipped["no-zeta"] += len(kinds["zeta_b"])
            continue
        for alone in kinds["zeta_b"]:
            if alone["value"] <= 0:
                skipped["zero-zeta-b"] += 1
                continue
            nearest = min(shared, key=lambda s: abs(s["at"] - alone["at"]))
            frozen = [n for n in alone.get("neighbours", []) if n.get("frozen", True)]
            observation = _observation(guest, float(nearest["value"]), float(alone["value"]), frozen, classes)
            if observation is None:
                skipped["unknown-distance"] += 1
                continue
            result.append(observation)
    return result


def _pair_observations(
    guest: str,
    pairs: list[Mapping[str, Any]],
    alone_samples: list[Mapping[str, Any]],
    classes: _Identities,
    skipped: Counter[str],
) -> list[Observation]:
    """Each ζp with the guest's nearest-in-time ζb: the neighbours running in the first and
    frozen in the second are the exposures (those never frozen cancel out)."""
    alone_samples = [s for s in alone_samples if s["value"] > 0]
    result = []
    for pair in pairs:
        if not alone_samples:
            skipped["pair-without-zeta-b"] += 1
            continue
        alone = min(alone_samples, key=lambda s: abs(s["at"] - pair["at"]))
        frozen_then = {n["name"] for n in alone.get("neighbours", []) if n.get("frozen", True)}
        exposed = [n for n in pair.get("neighbours", []) if not n.get("frozen", True) and n["name"] in frozen_then]
        if not exposed:
            skipped["pair-without-neighbour"] += 1
            continue
        observation = _observation(guest, float(pair["value"]), float(alone["value"]), exposed, classes)
        if observation is None:
            skipped["unknown-distance"] += 1
            continue
        result.append(observation)
    return result


@dataclass(frozen=True)
class _Identities:
    known: Mapping[str, ModelIdentity]
    classes: Mapping[str, str]

    def of(self, name: str) -> ModelIdentity:
        found = self.known.get(name)
        return found if found is not None else ModelIdentity(name, self.classes.get(name, UNKNOWN_CLASS))


def _observation(guest: str, zeta: float, zeta_b: float, exposed: list[Mapping[str, Any]],
                 identities: _Identities) -> Observation | None:
    """ζ/ζb = own_share − Σ β over `exposed`; None when a distance is unknown."""
    if any(n["distance"] == "unknown" for n in exposed):
        return None
    same_cpu = sum(1 for n in exposed if n["distance"] == SAME_CPU)
    exposures = []
    for n in exposed:
        if n["distance"] != SAME_CPU:
            neighbour = identities.of(n["name"])
            exposures.append(Exposure(key=neighbour.key, distance=DistanceClass(n["distance"]), load=1.0,
                                      workload_class=neighbour.workload_class))
    own = identities.of(guest)
    return Observation(
        key=own.key,
        zeta=zeta,
        zeta_b=zeta_b,
        neighbours=tuple(exposures),
        own_share=1.0 / (1 + same_cpu),
        workload_class=own.workload_class,
    )


def _names(samples: Iterable[Mapping[str, Any]]) -> set[str]:
    """Every guest a run's samples name: the sampled ones and their neighbours."""
    names: set[str] = set()
    for sample in samples:
        names.add(sample["guest"])
        names.update(n["name"] for n in sample.get("neighbours") or ())
    return names


def learn_from_runs(
    runs: Iterable[int],
    source: SampleSource,
    repository: ModelRepository,
    workload_classes: Mapping[str, str] | None = None,
    name: str = DEFAULT_MODEL,
    config: ModelConfig | None = None,
    identify: Identify | None = None,
) -> LearnReport:
    """Update the stored model with the samples of `runs` (older runs first); idempotent
    per run: a run at or before the model's last learned run is not learned twice. A model
    not stored yet starts with `config` (default: the default configuration). `identify`
    gives the model key and class of the guests a run names (default: each its own name)."""
    model, last_run = repository.load(name)
    if last_run is None and model.observations == 0 and config is not None:
        model = InterferenceModel(config)
    report = LearnReport()
    newest = last_run
    for run_id in sorted(set(runs)):
        if last_run is not None and run_id <= last_run:
            report.skipped["already-learned-run"] += 1
            continue
        samples = source.samples(run_id)
        identities = identify(_names(samples)) if identify is not None else None
        observations = observations_from_samples(samples, workload_classes, report.skipped, identities)
        for observation in observations:
            model.update(observation)
        report.observations += len(observations)
        report.runs.append(run_id)
        newest = run_id if newest is None else max(newest, run_id)
    if report.runs:
        repository.save(model, newest, name)
    report.total_observations = model.observations
    return report

