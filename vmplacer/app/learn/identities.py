"""Who a sampled guest is to the interference model, read as the rebalancer reads it.

The rebalancer describes a running guest from its domain's labels and its stored
placement spec (app/rebalance/rebalancer.py `_describe` → `describe_guest`); learning must key
the same guest the same way, or what it learns of labelled replicas is stored under
keys the planner never looks up. Both go through `core.model.identity.model_identity`.
A guest neither listed by a host nor on record (gone since it was sampled) is left
out: the learner keys it by its name, as it always has.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Protocol

from vmplacer.core.placement.guest import GuestSpec, GuestSpecError
from vmplacer.core.model.identity import ModelIdentity, model_identity
from vmplacer.core.rebalance.state import RebalanceInputError, read_guest_labels
from vmplacer.ports import DomainInfo, HypervisorError

log = logging.getLogger(__name__)


class ListedHost(Protocol):
    name: str

    def domains(self) -> list[DomainInfo]: ...


def domain_labels(hosts: Iterable[ListedHost]) -> dict[str, dict[str, str]]:
    """Each listed domain's labels, over every host that answers (one that does not is
    logged and left out: its guests are then keyed from their stored specs alone)."""
    labels: dict[str, dict[str, str]] = {}
    for host in hosts:
        try:
            for domain in host.domains():
                labels.setdefault(domain.name, dict(domain.labels))
        except HypervisorError as exc:
            log.warning("learning: host %s not listed (%s); its guests are keyed by their stored specs", host.name,
                        exc)
    return labels


class GuestIdentities:
    """`identify` for app/learn/online.py: the model identity of each named guest vmplacer knows.

    `labels` is called once, on first use (listing hosts is the costly part); `specs` gives
    a guest's stored spec mapping, or None. Each guest is looked up once: both model forms
    learn every run, and a first learn reads the whole sample history."""

    def __init__(self, labels: Callable[[], Mapping[str, Mapping[str, str]]],
                 specs: Callable[[str], Mapping[str, Any] | None]):
        self._labels = labels
        self._specs = specs
        self._listed: Mapping[str, Mapping[str, str]] | None = None
        self._known: dict[str, ModelIdentity | None] = {}

    def __call__(self, names: Collection[str]) -> dict[str, ModelIdentity]:
        if self._listed is None:
            self._listed = self._labels()
        found: dict[str, ModelIdentity] = {}
        for name in sorted(names):
            if name not in self._known:
                self._known[name] = self._identity(name, self._listed.get(name))
            identity = self._known[name]
            if identity is not None:
                found[name] = identity
        return found

    def _identity(self, name: str, labels: Mapping[str, str] | None) -> ModelIdentity | None:
        spec = self._spec(name)
        if labels is None and spec is None:
            return None
        try:
            return read_guest_labels(name, labels, spec).identity
        except RebalanceInputError as exc:
            # Any bad label: the rebalancer then describes the guest from its spec alone; so does learning.
            log.warning("learning: %s; keyed by its stored spec", exc)
            return model_identity(name, spec=spec)

    def _spec(self, name: str) -> GuestSpec | None:
        raw = self._specs(name)
        if not raw:
            return None
        try:
            return GuestSpec.from_mapping(dict(raw))
        except GuestSpecError as exc:  # as the rebalancer: an unusable record is no spec
            log.warning("learning: guest %s: recorded spec unusable (%s)", name, exc)
            return None
