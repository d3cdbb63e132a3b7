"""The stages of planning in order, each with the parts of the draft it reads and writes.

A `Draft` (core/rebalance/draft.py) holds three kinds of parts: the what-if state (`WHAT_IF`:
the host layouts, where each guest is and how it does; `MEMOS` beside it, which any stage may
fill), the log of the moves taken on it (`MOVE_LOG`), and what each stage found (reports,
offers, declined gains). Every
stage declares the parts it reads and writes (`StageSpec`); a stage that reads what no earlier
stage has written yet — a report its predecessor fills, an offer the budget has still to trim —
is a hidden dependency on the order, and the declaration makes it visible.

`run_pipeline` runs the stages, timed under their names. With `check=True` it also verifies
each declaration: the draft is handed to the stage behind a recorder of the parts it touches,
and every part is compared before and after it; a stage that reads or changes a part it did not
declare raises `StageContractError` naming the stage and the parts. The check costs a copy of
the draft's parts per stage, so plans are made without it; tests run it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

from vmplacer.core.rebalance.draft import Draft, PlanInputs

WHAT_IF = ("hosts", "guests", "host_of", "memory_nodes", "perf_now")
MOVE_LOG = ("moves", "touched", "migrated", "memory_moved")
SEARCH = WHAT_IF + MOVE_LOG  # what taking or trying a move reads and writes
# memos of what the what-if state gives, kept while it is the same: any stage may fill them
MEMOS = ("placement_cache", "confidence_cache")


class StageContractError(AssertionError):
    """A stage read or wrote a part of the draft it does not declare."""


@dataclass(frozen=True)
class StageSpec:
    """One named step of planning: a function of (draft, inputs) that refines the draft in place,
    and the parts of the draft (`Draft` field names) it reads and writes. A part written is
    also read (a stage may look at what it writes)."""

    name: str
    step: Callable[[Draft, PlanInputs], object]
    reads: tuple[str, ...]
    writes: tuple[str, ...]

    def __post_init__(self) -> None:
        known = {f.name for f in fields(Draft)}
        unknown = sorted(set(self.reads + self.writes) - known)
        if unknown:
            raise ValueError(f"stage {self.name}: {unknown} are not parts of the draft")

    def refine(self, draft: Draft, inputs: PlanInputs) -> Draft:
        self.step(draft, inputs)
        return draft


def run_pipeline(draft: Draft, inputs: PlanInputs, stages: Iterable[StageSpec], *, check: bool = False) -> Draft:
    """Each stage in turn refines the draft, timed under its name; with `check`, each stage's
    declared reads and writes are verified (module docstring)."""
    for stage in stages:
        with inputs.times.stage(stage.name):
            if check:
                _checked(stage, draft, inputs)
            else:
                stage.step(draft, inputs)
    return draft


def _checked(stage: StageSpec, draft: Draft, inputs: PlanInputs) -> None:
    before = {f.name: _snapshot(f.name, getattr(draft, f.name)) for f in fields(Draft)}
    recorder = _Recorder(draft)
    stage.step(recorder, inputs)  # type: ignore[arg-type]  # the recorder stands in for the draft
    changed = sorted(name for name, seen in before.items() if _snapshot(name, getattr(draft, name)) != seen)
    undeclared_writes = [name for name in changed if name not in stage.writes and name not in MEMOS]
    undeclared_reads = sorted(recorder.read - set(stage.reads) - set(stage.writes) - set(MEMOS))
    if undeclared_writes or undeclared_reads:
        raise StageContractError(f"stage {stage.name}: writes {undeclared_writes} and reads {undeclared_reads} "
                                 "without declaring them")


def _snapshot(name: str, value: Any) -> Any:
    """A copy of one part of the draft, compared after the stage (host layouts by their guests and pins)."""
    if name == "hosts":
        return {h: (tuple(layout.guests), {g: dict(p) for g, p in layout.pins.items()}) for h, layout in value.items()}
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    if isinstance(value, set):
        return set(value)
    return value


class _Recorder:
    """The draft, recording the names of the parts read or written through it."""

    def __init__(self, draft: Draft):
        object.__setattr__(self, "_draft", draft)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._draft, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._draft, name, value)
