"""The plan's disruption budget: how many trials one plan makes and how many vCPUs they repin.

A trial repins a host's guests to a layout the model is unsure of (the blind spread, the
model's own layout, an exact or optimistic layout), measures it with Freeze'nSense and undoes
it when it measures worse: every guest it touches is repinned twice when it fails, and its
neighbours are frozen while it is measured. Offered on every host that has one, a fleet-wide
plan over 100 hosts of 40 guests made 71 trials and 2,840 repins in one round. The budget keeps
the trials that promise most per vCPU they repin, up to `max_trials` trials and
`max_trial_repins` repins per plan (a migration counts as `MIGRATION_REPINS`); the others are
left for later rounds (a trial is remembered only when it ran, so it is offered again), named
in the plan's notes (`over_budget`) with what each would have cost and why it waited.

A trial's promise is what the stage that offered it knows of its outcome (`value`): the gain the
model predicts for an exact layout it is not sure enough of, what an optimist predicts (explore),
or, where the pessimistic stage knows the predicted difference and its standard deviation (the
blind spread against the model's layout, either way round), the expected improvement over the
layout the host would keep — E[max(0, X)] for X normal with that mean and deviation: a trial whose
outcome is in doubt is worth more than one the model is sure will fail. Pure: the draft in, the
draft out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vmplacer.core.rebalance.draft import Draft, PlanInputs

MIGRATION_REPINS = 8  # a migration's disruption, in repins: a memory copy, a pause, both hosts touched


def expected_improvement(mean: float, sd: float) -> float:
    """E[max(0, X)] for X ~ N(mean, sd²): what trying a layout predicted `mean` better (sd `sd`)
    than the one kept gains on average, a failed trial being undone."""
    if sd <= 0:
        return max(mean, 0.0)
    z = mean / sd
    return mean * 0.5 * math.erfc(-z / math.sqrt(2.0)) + sd * math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


@dataclass(frozen=True)
class TrialCost:
    """One offered trial: where, what it would cost in repins and migrations, and what it promises."""

    label: str  # the host, or "h1+h2" for small hosts tried together
    hosts: tuple[str, ...]
    what: str
    value: float
    repins: int
    migrations: int

    @property
    def disruption(self) -> int:
        return self.repins + MIGRATION_REPINS * self.migrations

    @property
    def promise(self) -> float:
        """Value per unit of disruption: the rank a budget keeps trials by."""
        return self.value / max(self.disruption, 1)

    def to_dict(self) -> dict[str, Any]:
        return {"trial": self.label, "hosts": list(self.hosts), "what": self.what, "value": round(self.value, 4),
                "repins": self.repins, "migrations": self.migrations}


def trial_costs(draft: Draft) -> list[TrialCost]:
    """Every trial the draft offers, costed against the layout the plan ends at."""
    costs = []
    for host_name, trial in draft.trials.items():
        host = draft.hosts[host_name]
        repins = sum(1 for guest, pins in trial.layout.items() for vcpu, cpus in pins.items()
                     if host.pins.get(guest, {}).get(vcpu) != cpus)
        costs.append(TrialCost(host_name, (host_name,), trial.kind.value, trial.value, repins, 0))
    for label, joint in draft.group_trials.items():
        repins = migrations = 0
        for guest, (target, pins) in joint.changes.items():
            if target != draft.host_of[guest]:
                migrations += 1
                repins += len(pins)
                continue
            now = draft.hosts[target].pins.get(guest, {})
            repins += sum(1 for vcpu, cpus in pins.items() if now.get(vcpu) != cpus)
        costs.append(TrialCost(label, joint.hosts, joint.kind.value, joint.value, repins, migrations))
    return costs


def spend_disruption_budget(draft: Draft, inputs: PlanInputs) -> None:
    """Stage: keep the offered trials that promise most per repin within the plan's budget; the
    others wait for a later round, named in `draft.over_budget`."""
    settings = inputs.settings
    ranked = sorted(trial_costs(draft), key=lambda c: (-c.promise, c.disruption, c.label))
    kept = repins = 0
    for cost in ranked:
        if kept >= settings.max_trials:
            why = f"max_trials {settings.max_trials} per plan reached"
        elif repins + cost.disruption > settings.max_trial_repins:
            why = (f"{cost.disruption} repins would pass max_trial_repins {settings.max_trial_repins} per plan "
                   f"({repins} spent)")
        else:
            kept += 1
            repins += cost.disruption
            continue
        draft.over_budget.append({**cost.to_dict(), "why": why})
        draft.trials.pop(cost.label, None)
        draft.group_trials.pop(cost.label, None)
    draft.disruption = {"trials": kept, "trial_repins": repins, "max_trials": settings.max_trials,
                        "max_trial_repins": settings.max_trial_repins, "trials_waiting": len(draft.over_budget)}
