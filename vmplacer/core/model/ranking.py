"""Rank workloads by sensitivity and interference from isolated counter profiles (seed ch. 4).

The seed found that a few counters, taken while a VM runs alone, correlate
with how much it suffers (sensitivity) and how much it hurts (interference)
next to others. Here that is turned into a prediction and judged honestly:
leave one workload out, choose the counters most correlated with the target
on the others (Pearson's r), fit a linear regression on them, predict the
left-out workload; repeat for each, then compare predicted with actual by
Spearman's rank correlation (the use is ranking, not exact values).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from vmplacer.core.model.pairs import PairTable
from vmplacer.core.model.counter_profiles import Profiles
from vmplacer.core.model.stats import pearson, spearman

MIN_WORKLOADS = 4


@dataclass(frozen=True)
class CounterChoice:
    event: str
    chosen_in: int  # folds (left-out workloads) that chose it
    pearson: float  # its correlation with the target over all workloads


@dataclass(frozen=True)
class RankTarget:
    """Leave-one-workload-out prediction of one score (sensitivity or interference)."""

    spearman: float
    counters: tuple[CounterChoice, ...]
    predicted: dict[str, float]
    actual: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "spearman": round(self.spearman, 4),
            "counters": [
                {"event": c.event, "chosen_in": c.chosen_in, "pearson": round(c.pearson, 4)}
                for c in self.counters
            ],
            "predicted": {k: round(v, 5) for k, v in self.predicted.items()},
            "actual": {k: round(v, 5) for k, v in self.actual.items()},
        }


@dataclass(frozen=True)
class RankResult:
    workloads: tuple[str, ...]
    sensitivity: RankTarget
    interference: RankTarget
    without_profile: tuple[str, ...]  # workloads in the pair file the profiles lack

    def to_dict(self) -> dict[str, Any]:
        return {
            "workloads": list(self.workloads),
            "sensitivity": self.sensitivity.to_dict(),
            "interference": self.interference.to_dict(),
            "without_profile": list(self.without_profile),
        }


def _choose(features: dict[str, np.ndarray], target: np.ndarray, rows: np.ndarray, top_k: int) -> list[str]:
    scored = []
    for event, values in features.items():
        if np.ptp(values[rows]) == 0:
            continue
        scored.append((-abs(pearson(values[rows], target[rows])), event))
    scored.sort()
    return [event for _, event in scored[:top_k]]


def _fit_predict(features: dict[str, np.ndarray], chosen: list[str], target: np.ndarray,
                 rows: np.ndarray, left_out: int) -> float:
    if not chosen:
        return float(target[rows].mean())
    x = np.stack([features[e] for e in chosen], axis=1)
    mean, std = x[rows].mean(axis=0), x[rows].std(axis=0)
    std[std == 0] = 1.0
    z = (x - mean) / std
    design = np.hstack([np.ones((rows.size, 1)), z[rows]])
    # a whisper of ridge: with a handful of workloads two counters can be collinear
    gram = design.T @ design + 1e-6 * np.eye(design.shape[1])
    coef = np.linalg.solve(gram, design.T @ target[rows])
    return float(coef[0] + z[left_out] @ coef[1:])


def _predict_target(names: list[str], features: dict[str, np.ndarray], target: np.ndarray,
                    top_k: int) -> RankTarget:
    n = len(names)
    predicted = np.empty(n)
    chosen_count: Counter[str] = Counter()
    for left_out in range(n):
        rows = np.array([i for i in range(n) if i != left_out])
        chosen = _choose(features, target, rows, top_k)
        chosen_count.update(chosen)
        predicted[left_out] = _fit_predict(features, chosen, target, rows, left_out)
    counters = tuple(
        CounterChoice(event, count, pearson(features[event], target) if np.ptp(features[event]) else 0.0)
        for event, count in sorted(chosen_count.items(), key=lambda item: (-item[1], item[0]))
    )
    return RankTarget(
        spearman=spearman(predicted, target),
        counters=counters,
        predicted={name: float(p) for name, p in zip(names, predicted)},
        actual={name: float(a) for name, a in zip(names, target)},
    )


def rank_workloads(table: PairTable, profiles: Profiles, top_k: int = 2) -> RankResult:
    """Leave-one-workload-out prediction of sensitivity and interference from profiles."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    sensitivity = table.sensitivity()
    interference = table.interference()
    scored = [w for w in table.workloads if w in sensitivity and w in interference]
    names = [w for w in scored if w in profiles.counts]
    missing = tuple(w for w in scored if w not in profiles.counts)
    if len(names) < MIN_WORKLOADS:
        raise ValueError(
            f"{profiles.source}: only {len(names)} workload(s) of {table.source} have a profile "
            f"({', '.join(names) or 'none'}); leave-one-out ranking needs at least {MIN_WORKLOADS}"
        )
    rates = profiles.rates()
    common = set.intersection(*(set(rates[w]) for w in names))
    if not common:
        raise ValueError(f"{profiles.source}: the profiled workloads share no event besides cycles")
    features = {event: np.array([rates[w][event] for w in names]) for event in sorted(common)}
    return RankResult(
        workloads=tuple(names),
        sensitivity=_predict_target(names, features, np.array([sensitivity[w] for w in names]), top_k),
        interference=_predict_target(names, features, np.array([interference[w] for w in names]), top_k),
        without_profile=missing,
    )
