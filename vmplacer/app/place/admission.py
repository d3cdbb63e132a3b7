"""The placement engine's scorer for a new guest, from the stored interference model.

Every placement path (CLI `plan` and `place`, the API's placements and dry runs)
asks this for its scorer, so they all rank candidates alike. The model is
loaded through a callable the composition root supplies (the database), once,
and again when older than `refresh_s`: a long-running API process follows
`vmplacer model learn` without a restart and without a database read per
request. A model that cannot be read leaves placement topology-only; `status`
says why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from vmplacer.core.model.class_priors import ShrunkBetas
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.placement.interference_scorer import (
    AdmissionSettings,
    GuestProfile,
    admission_scorer,
    profile_from_labels,
)
from vmplacer.core.placement.scoring import Scorer
from vmplacer.ports import DomainInfo

log = logging.getLogger(__name__)


class ModelAdmission:
    """Scorers for new guests, backed by the stored model (reloaded when stale)."""

    def __init__(self, load_model: Callable[[], InterferenceModel], settings: AdmissionSettings,
                 refresh_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self._load_model = load_model
        self.settings = settings
        self._refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._betas: ShrunkBetas | None = None
        self._loaded_at: float | None = None
        self.status = "not loaded"

    def betas(self) -> ShrunkBetas | None:
        """The model's coefficients with class/global shrinkage; None when it cannot be read."""
        now = self._clock()
        if self._loaded_at is not None and now - self._loaded_at < self._refresh_s:
            return self._betas
        with self._lock:
            if self._loaded_at is None or now - self._loaded_at >= self._refresh_s:
                self._reload(now)
        return self._betas

    def _reload(self, now: float) -> None:
        try:
            model = self._load_model()
        except Exception as exc:  # noqa: BLE001 - any storage failure: place by topology, say why
            log.warning("interference model unavailable, placing by topology only: %s", exc)
            self._betas, self.status = None, f"unavailable ({exc.__class__.__name__}: {exc})"
        else:
            self._betas = ShrunkBetas(model, self.settings.shrinkage)
            self.status = (f"{model.observations} observations" if model.observations
                           else "no data (topology only)")
        self._loaded_at = now

    def scorer(self, spec: GuestSpec, neighbours: Mapping[str, GuestProfile]) -> Scorer:
        """The scorer to place `spec` among `neighbours` (the guests already on the host)."""
        return admission_scorer(self.betas(), spec, neighbours, self.settings)


def profiles_of(domains: Iterable[DomainInfo]) -> dict[str, GuestProfile]:
    """What admission knows of the guests on a host, from their labels."""
    return {d.name: profile_from_labels(d.name, d.labels) for d in domains}
