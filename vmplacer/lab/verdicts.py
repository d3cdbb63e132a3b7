"""Why vmplacer ended below a simple rule in a simulated case: threshold, declined, search, or
model.

The simulator knows the truth; vmplacer only its model. Comparing the model's
objective of each policy's final layout with the truth tells the causes apart:

* threshold — in truth, going from vmplacer's final layout to the simple rule's
  gains less of the planner's objective (fairness included) than the threshold
  such a step must clear (`min_gain` on one
  host, lower on hosts of few guests by `min_gain_share`; `min_migration_gain`
  when a guest changes host): a perfect model
  declines it too, so the deficit is the hysteresis the operator asked for;
* declined — the model rates the simple rule's layout higher and the last plan
  names the gain it declined and what declined it (hysteresis, confidence, cost,
  action budget): vmplacer chose not to act, and said so;
* search — the model rates the simple rule's layout higher, yet no plan offered
  it: the search did not find it;
* model — the model rates vmplacer's own layout at least as high: the model is
  wrong about the layouts (its samples did not teach it what the truth does).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.rebalance.layout_problem import utility
from vmplacer.core.rebalance.plan import Plan
from vmplacer.core.rebalance.policy import evaluate_cluster
from vmplacer.core.rebalance.state import ClusterState, HostState, RebalanceSettings, describe_guest
from vmplacer.core.text import plural

SIMPLE = ("seed_policy", "blind_spread")
TOLERANCE = 0.005  # below a simple rule by more than 0.5 % counts
VERDICTS = ("threshold", "declined", "search", "model")  # the last two are real losses
REAL_LOSSES = ("search", "model")
MAX_RENAMED_HOSTS = 5  # hosts whose renamings `reach` tries (5! = 120)


@dataclass(frozen=True)
class Reach:
    """What going from vmplacer's final layout to another policy's final layout is worth in
    truth: the gain of the planner's objective over true performance (Σ p − φ·max(0, 1 − p)²,
    every VM weighing 1, as the planner sums predicted ones), how many guests it moves to another
    host, and how many run on the hosts whose guests it changes (the hysteresis of a step on one
    host scales with them)."""

    true_gain: float
    migrations: int
    guests: int = 0


def reach(performance: Mapping[str, Mapping[str, float]], hosts: Mapping[str, Mapping[str, str]],
          policy: str, interchangeable: bool = False, fairness: float = 0.0) -> Reach:
    """`Reach` of `policy`'s layout from vmplacer's, from each policy's true per-VM performance
    and each VM's host. With `interchangeable` hosts (the same shape, as in a benchmark case)
    the layout may land on any renaming of them: the fewest guests moved counts. `fairness` is
    the planner's φ: with it, a step that lifts the mean by starving a guest gains less, as it
    does for the planner (0: performance summed)."""
    mine, theirs = performance["vmplacer"], performance[policy]
    gain = true_objective(theirs.values(), fairness) - true_objective(mine.values(), fairness)
    here, there = hosts["vmplacer"], hosts[policy]
    names = sorted(set(here.values()) | set(there.values()))
    renamings = (itertools.permutations(names) if interchangeable and len(names) <= MAX_RENAMED_HOSTS
                 else [tuple(names)])
    moved = min(sum(1 for vm, host in there.items() if here.get(vm, host) != dict(zip(names, renamed))[host])
                for renamed in renamings)
    touched = {here[vm] for vm in mine if vm in here and abs(theirs.get(vm, 0.0) - mine[vm]) > 1e-9}
    return Reach(gain, moved, sum(1 for vm in mine if here.get(vm) in touched))


def true_objective(values: Iterable[float], fairness: float) -> float:
    """The planner's objective of true per-VM performance, every VM weighing 1."""
    return float(utility(np.asarray(list(values), dtype=float), fairness).sum())


def _threshold(step: Reach, min_gain: float, min_gain_share: float, min_migration_gain: float) -> tuple[str, float]:
    """The threshold's name and value for `step`, as the planner sets it (RebalanceSettings.min_gain_for)."""
    if step.migrations:
        return "min_migration_gain", min_migration_gain
    return "min_gain", RebalanceSettings(min_gain=min_gain, min_gain_share=min_gain_share).min_gain_for(step.guests)


def step_threshold(step: Reach, min_gain: float, min_migration_gain: float,
                   min_gain_share: float = 0.0) -> dict[str, Any]:
    """The threshold a step must clear and whether its true gain does: a step below it is one a
    perfect model with the same hysteresis declines (used against the optimum's layout, whose
    share of vmplacer's mean says how far vmplacer is from it, not whether a move could close it)."""
    name, threshold = _threshold(step, min_gain, min_gain_share, min_migration_gain)
    return {"true_gain": round(step.true_gain, 4), "migrations": step.migrations, "threshold_name": name,
            "threshold": threshold, "within_threshold": step.true_gain < threshold}


def perfect_model_moves(step: Mapping[str, Any]) -> bool:
    """Whether a perfect model with the planner's objective and hysteresis takes a step judged by
    `step_threshold`: it gains, and clears its threshold (a layout already at the step's end is
    no step, whatever threshold its zero guests would give)."""
    return step["true_gain"] > 1e-9 and not step["within_threshold"]


def cluster_state(cluster: Any) -> ClusterState:
    """What the rebalancer would observe on a simulated cluster (topologies, pins, labels)."""
    hosts = {name: HostState(name, host.topology()) for name, host in cluster.hosts.items()}
    guests = {d.name: describe_guest(d.placement, labels=d.labels)
              for host in cluster.hosts.values() for d in host.domains() if d.state == "running"}
    return ClusterState(hosts, guests)


def model_objectives(clusters: Mapping[str, Any], model: InterferenceModel | None,
                     settings: RebalanceSettings) -> dict[str, float] | None:
    """vmplacer's final model's objective of each policy's final layout."""
    if model is None:
        return None
    return {policy: round(evaluate_cluster(cluster_state(c), model, settings)[0], 4) for policy, c in clusters.items()}


def verdict(means: Mapping[str, float | None], objectives: Mapping[str, float] | None,
            plans: Sequence[Plan], min_gain: float, *, reaches: Mapping[str, Reach] | None = None,
            min_migration_gain: float = RebalanceSettings.min_migration_gain,
            min_gain_share: float = 0.0) -> dict[str, Any]:
    """'ok', or why vmplacer's mean true performance is more than 0.5 % below a simple rule's.
    `reaches` (by policy) lets a deficit below the step thresholds be told apart."""
    mine = means["vmplacer"]
    best = max(SIMPLE, key=lambda p: means[p] or 0.0)
    deficit = (means[best] or 0.0) - (mine or 0.0)
    result: dict[str, Any] = {"versus": best, "deficit": round(deficit, 4)}
    if mine is None or deficit <= TOLERANCE * (means[best] or 0.0):
        return {**result, "verdict": "ok"}
    step = (reaches or {}).get(best)
    if step is not None:
        name, threshold = _threshold(step, min_gain, min_gain_share, min_migration_gain)
        if step.true_gain < threshold:
            moves = f", moving {plural(step.migrations, 'guest')} to another host" if step.migrations else ""
            return {**result, "verdict": "threshold", "true_gain": round(step.true_gain, 4),
                    "threshold": threshold, "migrations": step.migrations,
                    "why": f"a perfect model declines it too: {best}'s layout gains +{step.true_gain:.3f} "
                           f"in truth (the planner's objective, summed over VMs){moves}, below {name} {threshold:g}"}
    last = plans[-1] if plans else None
    declined = list(last.settings.get("notes", {}).get("declined", [])) if last is not None else []
    result["declined"] = declined
    if objectives is not None:
        predicted = objectives[best] - objectives["vmplacer"]
        result["model_prefers_simple_by"] = round(predicted, 4)
        if predicted <= 0:
            return {**result, "verdict": "model",
                    "why": f"the model rates its own layout {-predicted:.3f} above {best}'s; in truth it is "
                           f"{deficit:.4f} below (mean per VM)"}
    if declined:
        top = max(declined, key=lambda d: d.get("predicted_gain", 0.0))
        return {**result, "verdict": "declined",
                "why": f"declined {top['move']} (predicted +{top['predicted_gain']:.3f}, sure "
                       f"+{top['sure_gain']:.3f}) by {top['declined_by']}"}
    return {**result, "verdict": "search",
            "why": f"the model rates {best}'s layout higher, but no plan offered a move above {min_gain:g}"}
