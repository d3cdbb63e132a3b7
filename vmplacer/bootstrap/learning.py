"""Composition of the learning step: who each sampled guest is, from the hosts and the records.

The CLI (`vmplacer model learn`) and the rebalancer's learn step both learn through
`guest_identities`, so a guest is keyed as the rebalancer keys it whichever path learns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from vmplacer.app.learn.identities import GuestIdentities, ListedHost, domain_labels
from vmplacer.bootstrap.container import Container

log = logging.getLogger(__name__)


def guest_identities(container: Container,
                     hosts: Callable[[], Iterable[ListedHost]] | None = None) -> GuestIdentities:
    """Labels from the domains `hosts` list (default: every configured host) over the
    placement records' specs."""

    def configured() -> Iterable[ListedHost]:
        try:
            return [container.hypervisor(h.name) for h in container.settings.hosts]
        except ImportError as exc:  # libvirt-python missing: the records alone say who is who
            log.warning("learning: hosts not listed (%s); guests are keyed by their stored specs", exc)
            return []

    def labels() -> dict[str, dict[str, str]]:
        return domain_labels((hosts or configured)())

    store = container.placement_store

    def specs(name: str) -> Any:
        record = store.get(name)
        return record.get("spec") if record else None

    return GuestIdentities(labels, specs)
