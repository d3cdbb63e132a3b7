"""How one host's pCPU map is drawn: which colour and short name each guest gets, what each
pCPU box shows, and which pCPUs carry an isolation violation. Pure: uses and violations in,
plain dictionaries out (the templates and the JSON the page polls read the same ones)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vmplacer.core.placement.isolation import IsolationViolation
from vmplacer.core.topology.cpu_map import CpuUse
from vmplacer.core.topology.cpuset import format_cpuset

# Guest colour classes g0..g20 in the stylesheet: a golden-angle walk around the hue circle
# (8/21 of a turn per step, so the walk closes after 21 steps), guests coloured in the order
# they appear on the map. Guests up to four places apart differ by at least 51° of hue.
PALETTE = 21
SHORT = 6  # characters of a guest's name a pCPU box has room for
COMPACT_CPUS = 128  # a host with more pCPUs than this gets the compact map and a per-node summary


def colour_order(uses: Mapping[int, CpuUse], guests: Iterable[str]) -> list[str]:
    """The guests in the order the map shows them: by the lowest pCPU each one owns or
    floats over, then by the lowest pCPU of its emulator or IOThreads, then by name. Adjacent
    groups of boxes so get successive colours of the walk, never the same one."""
    first: dict[str, tuple[int, int]] = {}
    for cpu in sorted(uses):
        use = uses[cpu]
        for name in ((use.exclusive,) if use.exclusive else ()) + use.floating:
            first.setdefault(name, (0, cpu))
    for cpu in sorted(uses):
        use = uses[cpu]
        for name in use.emulator + use.iothreads:
            first.setdefault(name, (1, cpu))
    return sorted(set(guests), key=lambda g: (first.get(g, (2, 0)), g))


def short_names(order: Sequence[str]) -> dict[str, str]:
    """A label of at most SHORT characters per guest, unique on the host: the name itself
    when it fits, else its head and tail ("analyt…01" → "ana…01"), else its place ("#7")."""
    wanted = {g: g if len(g) <= SHORT else g[:3] + "…" + g[-2:] for g in order}
    counts: dict[str, int] = {}
    for label in wanted.values():
        counts[label] = counts.get(label, 0) + 1
    return {g: label if counts[label] == 1 else f"#{i + 1}" for i, (g, label) in enumerate(wanted.items())}


def colours(order: Sequence[str]) -> dict[str, str]:
    """guest -> its colour class, by its place in `order`."""
    return {g: f"g{i % PALETTE}" for i, g in enumerate(order)}


def violated_cpus(violations: Sequence[IsolationViolation]) -> dict[int, list[str]]:
    """pCPU -> the guests that may run on it although it is not theirs to use."""
    found: dict[int, list[str]] = {}
    for v in violations:
        for cpu in v.cpus:
            names = found.setdefault(cpu, [])
            if v.guest not in names:
                names.append(v.guest)
    return found


def violation_rows(violations: Sequence[IsolationViolation]) -> list[dict[str, Any]]:
    """The violations as the page lists them: who may run where, and whose those pCPUs are."""
    return [{"guest": v.guest, "thread": v.thread, "cpus": format_cpuset(v.cpus), "owner": v.owner or None,
             "message": v.describe()} for v in violations]


def cpu_cell(use: CpuUse, colour_of: Mapping[str, str], short: Mapping[str, str], index: Mapping[str, int],
             violated: Sequence[str]) -> dict[str, Any]:
    """What one pCPU box shows: its kind, its guests (and their places in the colour order,
    which the page's highlighting matches on), the owner's colour and short name, its marks."""
    marks = []
    if use.emulator:
        marks.append("emu")
    if use.iothreads:
        marks.append("io")
    if use.reserved:
        marks.append("host")
    owner = use.exclusive or (use.floating[0] if len(use.floating) == 1 else None)
    if owner:
        label = short.get(owner, owner[:SHORT])
    elif len(use.floating) > 1:
        label = f"×{len(use.floating)}"  # shared by several floating guests
    else:
        label = ""
    title = use.describe()
    if violated:
        title += "; VIOLATION: " + ", ".join(violated) + " may run here"
    return {"kind": use.kind, "guests": list(use.guests), "ix": [index[g] for g in use.guests if g in index],
            "title": title, "marks": " ".join(marks), "colour": colour_of.get(owner, "") if owner else "",
            "label": label, "violated": list(violated)}


def legend(cells: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The colour classes the legend's swatches take: those of the first exclusive and the
    first single-guest floating box of the map, so each swatch looks like a box on the page."""
    found = {"exclusive": "", "floating": ""}
    for cell in cells:
        if cell["colour"] and not found.get(cell["kind"], "x"):
            found[cell["kind"]] = cell["colour"]
    return {kind: colour or "g0" for kind, colour in found.items()}
