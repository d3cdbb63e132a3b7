"""Which interference-model entry a guest is: its key and its workload class.

One derivation for everything that reads or writes the model: the rebalancer's
`describe_guest`, admission's guest profiles and the learning step. Replicas
that share a `workload` label are one key, so what is learned from any of them
is what the planner looks up for all of them; a guest without the label is its
own key (its name). If learning and planning derived keys apart, the learned
coefficients of labelled guests would sit under keys the planner never asks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vmplacer.core.placement.guest import MAX_LABEL_VALUE, GuestSpec
from vmplacer.core.model.interference import UNKNOWN_CLASS
from vmplacer.core.text import control_problem, excerpt

LABEL_WORKLOAD = "workload"  # interference-model key shared by replicas (default: the guest name)
LABEL_CLASS = "workload_class"


class ModelIdentityError(ValueError):
    """A `workload` or `workload_class` label the model cannot be keyed by; names guest and label."""


@dataclass(frozen=True)
class ModelIdentity:
    key: str
    workload_class: str = UNKNOWN_CLASS


def _checked(name: str, label: str, value: str) -> str:
    """The label value if it passes the label policy placement enforces (core/placement/guest.py)."""
    if not isinstance(value, str):
        raise ModelIdentityError(f"guest {name}: label {label!r} must be a string, got {type(value).__name__}")
    if len(value) > MAX_LABEL_VALUE:
        raise ModelIdentityError(f"guest {name}: label {label!r} must be at most {MAX_LABEL_VALUE} characters, "
                                 f"got {len(value)}")
    problem = control_problem(value)
    if problem is not None:
        raise ModelIdentityError(f"guest {name}: label {label!r} {excerpt(value, 40)}: {problem}")
    return value


def model_identity(name: str, labels: Mapping[str, str] | None = None, spec: GuestSpec | None = None,
                   workload_class: str | None = None) -> ModelIdentity:
    """The guest's model key and class: the `workload` label, else its name; the
    `workload_class` label, else the spec's class, else `workload_class`, else unknown.
    `labels` (the domain's) override the spec's. Raises ModelIdentityError for a label value
    that breaks the label policy (domain metadata edited by hand)."""
    if not labels and spec is None:  # most guests: no labels, no record
        return ModelIdentity(name, workload_class or UNKNOWN_CLASS)
    merged = dict(spec.labels if spec else {}) | dict(labels or {})
    key = merged.get(LABEL_WORKLOAD)
    key = _checked(name, LABEL_WORKLOAD, key) if key else name
    cls = merged.get(LABEL_CLASS)
    if cls:
        cls = _checked(name, LABEL_CLASS, cls)
    else:
        cls = (spec.workload_class if spec else None) or workload_class or UNKNOWN_CLASS
    return ModelIdentity(key, cls)
