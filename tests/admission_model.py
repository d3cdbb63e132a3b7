"""A small learned interference model with known structure, for the admission tests.

Three workload classes, six profiled guests each (keys = guest names, as online learning
keys them). Guests of class "noisy" hurt "victim" guests badly, "quiet" ones barely; SMT
siblings (same-core) hurt twice as much as a shared LLC. Observations are noise-free
Freeze'nSense equations, so the model's coefficients follow the table closely.
"""

from __future__ import annotations

import random

from vmplacer.core.model.interference import Exposure, InterferenceModel, Observation
from vmplacer.core.topology.host import DistanceClass

CLASSES = ("noisy", "quiet", "victim")
LOSS = {  # (background class, foreground class) -> loss at same-llc
    ("noisy", "victim"): 0.30, ("quiet", "victim"): 0.02, ("victim", "victim"): 0.05,
    ("noisy", "noisy"): 0.10, ("quiet", "noisy"): 0.01, ("victim", "noisy"): 0.02,
    ("noisy", "quiet"): 0.05, ("quiet", "quiet"): 0.01, ("victim", "quiet"): 0.01,
}
SCALE = {DistanceClass.SAME_CORE: 2.0, DistanceClass.SAME_LLC: 1.0, DistanceClass.REMOTE_NODE: 0.1}


def guests(per_class: int = 6) -> dict[str, list[str]]:
    return {cls: [f"{cls}{i}" for i in range(per_class)] for cls in CLASSES}


def observations(count: int = 400, seed: int = 1, per_class: int = 6,
                 only_classes: tuple[str, ...] = CLASSES) -> list[Observation]:
    rng = random.Random(seed)
    names = guests(per_class)
    result = []
    while len(result) < count:
        fg_cls, bg_cls = rng.choice(only_classes), rng.choice(only_classes)
        fg, bg = rng.choice(names[fg_cls]), rng.choice(names[bg_cls])
        if fg == bg:
            continue
        distance = rng.choice(tuple(SCALE))
        loss = LOSS[(bg_cls, fg_cls)] * SCALE[distance]
        result.append(Observation(fg, 1.0 - loss, 1.0, (Exposure(bg, distance, 1.0, bg_cls),),
                                  workload_class=fg_cls))
    return result


def learned(count: int = 400, seed: int = 1, **kwargs) -> InterferenceModel:
    return InterferenceModel().fit(observations(count, seed, **kwargs))
