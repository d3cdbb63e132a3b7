"""`vmplacer plan --why`: every candidate the engine built for a guest, its score and the
interference model's predicted loss, so an operator sees why one set of pCPUs won.

JSON, per placement, under "why":

    {"model": str,                       # e.g. "1200 observations", "no data (topology only)"
     "weight": float | null,             # the interference scorer's weight (null: not used)
     "identity": {"key", "workload_class", "profiled", "levels": {"own", "class", "global"}} | null,
     "candidates": [{"vcpupin": {"0": [cpus]}, "nodes": [...], "score": float, "chosen": bool,
                     "predicted_loss": {"guest", "total", "joined": {guest: loss}} | null}]}

Candidates are sorted best first; "predicted_loss" is null when the model has no data.
"""

from __future__ import annotations

from typing import Any

from vmplacer.cli.common import print_line, print_table
from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.placement.interference_scorer import interference_part
from vmplacer.core.placement.guest_placement import Placement

MAX_JOINED_SHOWN = 3


def explain(state: Any, scorer: Any, chosen: Placement, candidates: list[Placement],
            occupied: list[Placement]) -> dict[str, Any]:
    part = interference_part(scorer) if scorer is not None else None
    topology = state.topology
    admission = state.admission
    if admission is None:
        status = "not used: a host read from a capabilities file has no guests to predict for"
    else:
        status = admission.status
    weight = None
    if part is not None:
        weight = admission.settings.weight
    identity = None
    if part is not None:
        ident = part.identity(chosen.guest)
        identity = {"key": part.guest.key, "workload_class": ident.workload_class, "profiled": bool(ident.key),
                    "levels": {k: round(v, 4) for k, v in part.betas.weights(ident).items()}}
    rows: dict[tuple, dict[str, Any]] = {}
    for candidate in sorted(candidates, key=lambda p: -p.score):
        key = tuple(sorted((v, tuple(sorted(c))) for v, c in candidate.vcpupin.items()))
        if key in rows:
            continue
        loss = part.loss(topology, candidate, occupied).to_dict() if part is not None else None
        rows[key] = {
            "vcpupin": {str(v): sorted(c) for v, c in sorted(candidate.vcpupin.items())},
            "nodes": sorted({topology.cpus[c].node for c in candidate.pcpus if c in topology.cpus}),
            "score": candidate.score,
            "chosen": candidate.vcpupin == chosen.vcpupin and candidate.memory_nodes == chosen.memory_nodes,
            "predicted_loss": loss,
        }
    return {"model": status, "weight": weight, "identity": identity, "candidates": list(rows.values())}


# best first; "joined guests": the guests already there it would hurt, most hurt first
WHY_COLUMNS = ("chosen", "vcpupin", "node(s)", "score", "guest loss", "joined loss", "total", "joined guests")


def print_why(guest: str, why: dict[str, Any]) -> None:
    """The candidates as a table and the lines above it held to the width the plan's table
    fits (the terminal's, or $COLUMNS; piped without it one line each, as grep reads them)."""
    identity = why.get("identity")
    print()
    print_line(f"candidates for guest {guest} (model: {why['model']}"
               + (f"; weight {why['weight']:g}" if why.get("weight") is not None else "") + ")")
    if identity:
        levels = identity["levels"]
        seen = "" if identity["profiled"] else " (never profiled)"
        print_line(f"  predicted as key {identity['key']}{seen}, class {identity['workload_class']}: "
                   f"own {levels['own']:.2f}, class {levels['class']:.2f}, global {levels['global']:.2f}")
    print_table(None, WHY_COLUMNS, [_candidate_row(row) for row in why["candidates"]])


def _candidate_row(row: dict[str, Any]) -> tuple[Any, ...]:
    pins = " ".join(f"{v}→{format_cpuset(c)}" for v, c in row["vcpupin"].items())
    loss = row["predicted_loss"]
    if loss is None:
        numbers = ("-", "-", "-")
        joined = ""
    else:
        hurt = sum(loss["joined"].values())
        numbers = (f"{loss['guest']:.4f}", f"{hurt:.4f}", f"{loss['total']:.4f}")
        names = list(loss["joined"].items())[:MAX_JOINED_SHOWN]
        joined = ", ".join(f"{n} {v:+.3f}" for n, v in names)
        if len(loss["joined"]) > MAX_JOINED_SHOWN:
            joined += f", … {len(loss['joined']) - MAX_JOINED_SHOWN} more"
    return (bool(row["chosen"]), pins, format_cpuset(row["nodes"]), f"{row['score']:.3f}", *numbers,
            joined)
