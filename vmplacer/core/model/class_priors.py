"""Interference coefficients for guests the model has never measured: guest → class → global.

The model learns β's per workload key (a guest's name, or a `workload` label
shared by replicas). A guest that arrives has no samples, so its own key says
nothing; what the fleet learned about guests of its *workload class* does, and
when the class is thin, what it learned about everyone. Each level is trusted
as far as its data goes (hierarchical shrinkage, the weights are sample counts):

    β̂(u → v) = Σ_a Σ_b w_a(u) · w_b(v) · B(a, b)      a, b ∈ {own key, class, global}

    w_own   = n_key / (n_key + κ_guest)
    w_class = (1 − w_own) · n_class / (n_class + κ_class)
    w_glob  = 1 − w_own − w_class

with n the evidence of the model (unit-exposure observations, see
`InterferenceModel.evidence`), B(own, own) the model's own coefficient, and
B(class X, ·) / B(global, ·) the evidence-weighted means of the model's
coefficients over the known keys of class X / over all known keys. A class
named ``unknown`` is no class: such a guest goes straight to the global level.
Pure: the model is passed in, nothing is read here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vmplacer.core.model.interference import UNKNOWN_CLASS, InterferenceModel

LEVELS = ("own", "class", "global")
UNSEEN = ""  # the key of every guest the model has no samples of


@dataclass(frozen=True)
class ShrinkageSettings:
    """Evidence (unit-exposure observations) at which a level gets half the weight."""

    guest_evidence: float = 3.0
    class_evidence: float = 3.0

    def __post_init__(self) -> None:
        for name in ("guest_evidence", "class_evidence"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"shrinkage: field {name!r} must be a number > 0, got {value!r}")


@dataclass(frozen=True)
class Identity:
    """Who a guest is to the model: its key (name or workload label) and workload class."""

    key: str
    workload_class: str = UNKNOWN_CLASS


class ShrunkBetas:
    """β between identities, each side shrunk guest → class → global by its evidence; cached."""

    def __init__(self, model: InterferenceModel, settings: ShrinkageSettings | None = None):
        self.model = model
        self.form = model.config.form  # how a guest's neighbours' losses combine (`remaining`)
        self.settings = settings or ShrinkageSettings()
        self.empty = model.observations == 0
        self._pairs: dict[tuple[Identity, Identity], np.ndarray] = {}
        self._tables: dict[tuple[Identity, ...], np.ndarray] = {}
        evidence = model.evidence() if not self.empty else {}
        self._keys = [k for k in model.known_keys() if evidence.get(k, 0.0) > 0] if not self.empty else []
        self._evidence = np.array([evidence[k] for k in self._keys])
        self._key_index = {k: i for i, k in enumerate(self._keys)}
        classes: dict[str, list[int]] = {}
        for i, key in enumerate(self._keys):
            cls = model.workload_class_of(key)
            if cls != UNKNOWN_CLASS:
                classes.setdefault(cls, []).append(i)
        self._classes = {c: np.array(members, dtype=np.int64) for c, members in classes.items()}
        # β between every two known keys at every distance: [rank, background, foreground]
        self._table = (model.beta_tensor([(k, model.workload_class_of(k)) for k in self._keys])
                       if self._keys else np.zeros((0, 0, 0)))

    def identity(self, name: str, key: str, workload_class: str) -> Identity:
        """The guest's own name when the model learned it (samples are keyed by guest), else its
        workload key when learned (replicas share one), else no key at all: guests the model
        never saw are alike but for their class, so they share one identity (and one β)."""
        chosen = name if name in self._key_index else (key if key in self._key_index else UNSEEN)
        return Identity(chosen, workload_class or UNKNOWN_CLASS)

    # ----- levels -------------------------------------------------------------------------
    def weights(self, identity: Identity) -> dict[str, float]:
        """How much each level counts for this identity (sums to 1; all global with no data)."""
        cfg = self.settings
        own_n = float(self._evidence[self._key_index[identity.key]]) if identity.key in self._key_index else 0.0
        members = self._classes.get(identity.workload_class)
        class_n = float(self._evidence[members].sum()) if members is not None else 0.0
        own = own_n / (own_n + cfg.guest_evidence)
        cls = (1.0 - own) * class_n / (class_n + cfg.class_evidence)
        return {"own": own, "class": cls, "global": 1.0 - own - cls}

    def _members(self, identity: Identity, level: str) -> np.ndarray:
        if level == "own":
            index = self._key_index.get(identity.key)
            return np.array([] if index is None else [index], dtype=np.int64)
        if level == "class":
            return self._classes.get(identity.workload_class, np.array([], dtype=np.int64))
        return np.arange(len(self._keys), dtype=np.int64)

    def _block_mean(self, backgrounds: np.ndarray, foregrounds: np.ndarray) -> np.ndarray:
        """Evidence-weighted mean β over every (background, foreground) pair of two key sets."""
        wb = self._evidence[backgrounds]
        wf = self._evidence[foregrounds]
        block = self._table[:, backgrounds[:, None], foregrounds[None, :]]
        mean: np.ndarray = (block * wb[None, :, None] * wf[None, None, :]).sum(axis=(1, 2)) / (wb.sum() * wf.sum())
        return mean

    # ----- the coefficients --------------------------------------------------------------------
    def table(self, identities: tuple[Identity, ...]) -> np.ndarray:
        """[distance rank, background, foreground] β̂ between `identities` (cached: a search asks
        for the same few identities for every candidate)."""
        found = self._tables.get(identities)
        if found is None:
            found = np.stack([np.stack([self.beta(bg, fg) for fg in identities], axis=-1)
                              for bg in identities], axis=1)
            if len(self._tables) > 256:
                self._tables.clear()
            self._tables[identities] = found
        return found

    def beta(self, background: Identity, foreground: Identity) -> np.ndarray:
        """β̂ per distance rank (index = `DistanceClass.rank`); zeros when the model has no data."""
        key = (background, foreground)
        found = self._pairs.get(key)
        if found is not None:
            return found
        if not self._keys:
            found = np.zeros(self.model.beta_tensor([("", UNKNOWN_CLASS)]).shape[0])
        else:
            wb, wf = self.weights(background), self.weights(foreground)
            found = np.zeros(self._table.shape[0])
            for a in LEVELS:
                for b in LEVELS:
                    weight = wb[a] * wf[b]
                    if weight <= 0:
                        continue
                    found = found + weight * self._block_mean(self._members(background, a),
                                                              self._members(foreground, b))
        self._pairs[key] = found
        return found
