"""What the web view shows of the interference model: its coefficient tables per distance
class (a heat map, each cell with the evidence behind it) and, for one guest, the loss the
model predicts from each neighbour on its host. Pure: a model and placements in, plain
dictionaries out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vmplacer.core.model.interference import UNKNOWN_CLASS, InterferenceModel, Tenant
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import NEIGHBOUR_CLASSES, DistanceClass, HostTopology

HEAT_LEVELS = 8  # cell classes h0..h8 in the stylesheet; a negative β (a gain) is "hneg"
MAX_KEYS = 40  # a table is MAX_KEYS² cells at most: the best-observed workloads are shown
CLASS_LABELS = {
    DistanceClass.SAME_CPU: "time-shared pCPU",
    DistanceClass.SAME_CORE: "SMT sibling (same core)",
    DistanceClass.SAME_L2: "shared L2",
    DistanceClass.SAME_LLC: "shared LLC",
    DistanceClass.SAME_NODE: "same NUMA node",
    DistanceClass.REMOTE_NODE: "other NUMA node",
}


def heat_level(beta: float, top: float) -> str:
    """The cell's colour class: h0 (no loss) .. h8 (the largest loss in any table)."""
    if beta < 0:
        return "hneg"
    if top <= 0:
        return "h0"
    return f"h{min(HEAT_LEVELS, max(0, round(beta / top * HEAT_LEVELS)))}"


def coefficient_tables(model: InterferenceModel, max_keys: int = MAX_KEYS) -> dict[str, Any]:
    """Per neighbour distance class, the β table (background row × foreground column) over the
    best-observed known workloads, each cell with its unit-exposure observations and its heat
    class (one scale for every table, so classes compare by colour)."""
    keys = model.known_keys() if model.observations else ()
    evidence = model.evidence()
    shown = sorted(sorted(keys, key=lambda k: (-evidence.get(k, 0.0), k))[:max_keys])
    pairs = model.pair_evidence() if shown else {}
    tensor = model.beta_tensor([(k, model.workload_class_of(k)) for k in shown]) if shown else None
    top = max((float(tensor[c.rank].max()) for c in NEIGHBOUR_CLASSES), default=0.0) if tensor is not None else 0.0
    tables = []
    for cls in NEIGHBOUR_CLASSES:
        rows = []
        for i, background in enumerate(shown):
            cells = []
            for j, foreground in enumerate(shown):
                beta = float(tensor[cls.rank, i, j]) if tensor is not None else 0.0
                seen = pairs.get((cls, background, foreground), 0.0)
                cells.append({"foreground": foreground, "beta": beta, "observations": seen,
                              "level": heat_level(beta, top), "observed": seen > 0})
            rows.append({"background": background, "cells": cells})
        tables.append({"distance": cls.value, "label": CLASS_LABELS[cls], "scale": model.distance_scale(cls),
                       "observations": sum(v for (c, _, _), v in pairs.items() if c is cls), "rows": rows})
    return {"workloads": list(shown), "known": len(keys), "top": top, "tables": tables,
            "observations": model.observations, "form": model.config.form,
            "reference": model.reference_distance.value if keys else None}


def tenant_of(topology: HostTopology, placement: Placement, workload_class: str = UNKNOWN_CLASS) -> Tenant | None:
    """A placement as a model tenant, every vCPU busy: pins outside the topology are dropped and
    a vCPU pinned nowhere floats over every usable pCPU (as libvirt runs it). None without vCPUs."""
    usable = frozenset(topology.usable_cpus) or frozenset(c for c, cpu in topology.cpus.items() if cpu.online)
    pins = {vcpu: (frozenset(c for c in cpus if c in topology.cpus) or usable)
            for vcpu, cpus in placement.vcpupin.items()}
    if not pins or not all(pins.values()):
        return None
    return Tenant(placement.guest, pins, workload_class=workload_class or UNKNOWN_CLASS)


def nearest_distance(topology: HostTopology, mine: Tenant, theirs: Tenant) -> DistanceClass:
    """The closest any pCPU of one tenant comes to one of the other's."""
    a = frozenset().union(*mine.cpus.values())  # type: ignore[union-attr]
    b = frozenset().union(*theirs.cpus.values())  # type: ignore[union-attr]
    if a & b:
        return DistanceClass.SAME_CPU
    return min((topology.distance_class(x, y) for x in a for y in b), key=lambda c: c.rank)


def neighbour_losses(model: InterferenceModel, topology: HostTopology, guest: Tenant,
                     neighbours: Sequence[Tenant]) -> dict[str, Any]:
    """What the model predicts `guest` loses next to each neighbour alone (and what it costs
    that neighbour), and with all of them at once: fractions of its speed alone with the same
    pins, time sharing included; β is the coefficient at their nearest distance."""
    alone = model.predict(topology, [guest])[guest.name]
    rows: list[dict[str, Any]] = []
    for other in neighbours:
        pair = model.predict(topology, [guest, other])
        other_alone = model.predict(topology, [other])[other.name]
        distance = nearest_distance(topology, guest, other)
        beta = (model.beta(other.key, guest.key, distance, background_class=other.workload_class,
                           foreground_class=guest.workload_class)
                if distance is not DistanceClass.SAME_CPU else None)
        rows.append({"neighbour": other.name, "distance": distance.value, "distance_label": CLASS_LABELS[distance],
                     "beta": beta, "loss": max(0.0, alone.perf - pair[guest.name].perf),
                     "caused": max(0.0, other_alone.perf - pair[other.name].perf),
                     "confidence": pair[guest.name].confidence})
    rows.sort(key=lambda r: (-r["loss"], r["neighbour"]))
    together = model.predict(topology, [guest, *neighbours])[guest.name] if neighbours else alone
    return {"alone": alone.perf, "together": together.perf, "confidence": together.confidence,
            "loss": max(0.0, alone.perf - together.perf), "neighbours": rows}
