"""Pairwise interference measurements read from text.

Two formats, one value (`PairTable`):

* pair matrix — header ``background,<fg1>,<fg2>,...``; each row names a
  background workload and gives the loss, in percent, of each column
  (foreground) workload while that background runs on a neighbouring core;
* long pairs — header ``distance,foreground,background,perf_alone,perf_shared``;
  one measurement per line, loss = 1 − perf_shared / perf_alone, with the
  distance class of the two pCPUs (empty = not known).

Lines starting with ``#`` and blank lines are comments. Parsing is pure: the
caller reads the file and passes its text and name, so errors can name both.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from vmplacer.core.topology.host import NEIGHBOUR_CLASSES, DistanceClass

MATRIX_HEADER = "background"
LONG_FIELDS = ("distance", "foreground", "background", "perf_alone", "perf_shared")

PairKey = tuple[DistanceClass | None, str, str]  # (distance, background, foreground)


class PairFileError(ValueError):
    """A pair file that cannot be used; the message names the source, line and field."""

    def __init__(self, source: str, line: int | None, field: str | None, problem: str):
        where = source if line is None else f"{source}:{line}"
        what = f"field {field!r} " if field else ""
        super().__init__(f"{where}: {what}{problem}")
        self.source = source
        self.line = line
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class PairTable:
    """Measured loss of a foreground workload caused by a background workload.

    `losses` maps (distance or None, background, foreground) to the fraction of
    the foreground's isolated performance that was lost (0.08 = 8 % slower;
    negative = a small speed-up, which the data does contain).
    """

    source: str
    workloads: tuple[str, ...]
    losses: Mapping[PairKey, float]

    @property
    def distances(self) -> frozenset[DistanceClass | None]:
        return frozenset(key[0] for key in self.losses)

    def loss(self, background: str, foreground: str, distance: DistanceClass | None = None) -> float | None:
        return self.losses.get((distance, background, foreground))

    def mean_loss_by_pair(self) -> dict[tuple[str, str], float]:
        """(background, foreground) -> loss averaged over the measured distances."""
        sums: dict[tuple[str, str], list[float]] = {}
        for (_, background, foreground), value in self.losses.items():
            sums.setdefault((background, foreground), []).append(value)
        return {pair: sum(values) / len(values) for pair, values in sums.items()}

    def sensitivity(self) -> dict[str, float]:
        """Mean loss each workload suffers over all backgrounds (seed §4.4: column mean)."""
        return _means(self.mean_loss_by_pair(), index=1)

    def interference(self) -> dict[str, float]:
        """Mean loss each workload causes over all foregrounds (seed §4.4: row mean)."""
        return _means(self.mean_loss_by_pair(), index=0)


def _means(pairs: dict[tuple[str, str], float], index: int) -> dict[str, float]:
    grouped: dict[str, list[float]] = {}
    for pair, value in pairs.items():
        grouped.setdefault(pair[index], []).append(value)
    return {name: sum(values) / len(values) for name, values in grouped.items()}


def _content_lines(text: str) -> Iterator[tuple[int, list[str]]]:
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        yield number, [cell.strip() for cell in line.split(",")]


def _number(source: str, line: int, field: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise PairFileError(source, line, field, f"is not a number: {text!r}") from None
    if not math.isfinite(value):
        raise PairFileError(source, line, field, f"is not a finite number: {text!r}")
    return value


def parse_distance(text: str) -> DistanceClass | None:
    """A distance-class name ("same-llc", also "same_llc"), or None for "" / "any"."""
    name = text.strip().lower().replace("_", "-")
    if name in ("", "any", "unknown"):
        return None
    for cls in NEIGHBOUR_CLASSES:
        if cls.value == name:
            return cls
    raise ValueError(f"unknown distance class {text!r} (expected one of "
                     f"{', '.join(c.value for c in NEIGHBOUR_CLASSES)})")


def parse_pairs(text: str, source: str = "<pairs>") -> PairTable:
    """Parse a pair matrix or a long pair list; the header line decides which."""
    lines = list(_content_lines(text))
    if not lines:
        raise PairFileError(source, None, None, "has no header line and no data")
    number, header = lines[0]
    lowered = [cell.lower() for cell in header]
    if set(LONG_FIELDS) <= set(lowered):  # before the matrix test: a long file may start with "background"
        return _parse_long(source, lowered, lines[1:])
    if lowered and lowered[0] == MATRIX_HEADER:
        return _parse_matrix(source, header, lines[1:])
    raise PairFileError(
        source, number, None,
        f"header must start with {MATRIX_HEADER!r} (pair matrix) or name the columns "
        f"{','.join(LONG_FIELDS)} (long pairs); got {','.join(header)!r}",
    )


def _parse_matrix(source: str, header: list[str], rows: list[tuple[int, list[str]]]) -> PairTable:
    foregrounds = header[1:]
    if not foregrounds:
        raise PairFileError(source, None, "header", "names no foreground workload columns")
    for name in foregrounds:
        if not name:
            raise PairFileError(source, None, "header", "has an empty workload name")
    if len(set(foregrounds)) != len(foregrounds):
        raise PairFileError(source, None, "header", "names a foreground workload twice")
    if not rows:
        raise PairFileError(source, None, None, "has a header but no background rows")
    losses: dict[PairKey, float] = {}
    order: list[str] = list(foregrounds)
    seen: set[str] = set()
    for number, cells in rows:
        background = cells[0]
        if not background:
            raise PairFileError(source, number, MATRIX_HEADER, "is empty")
        if background in seen:
            raise PairFileError(source, number, MATRIX_HEADER, f"repeats workload {background!r}")
        seen.add(background)
        if len(cells) != len(header):
            raise PairFileError(
                source, number, None,
                f"row {background!r} has {len(cells) - 1} values for {len(foregrounds)} columns",
            )
        for foreground, cell in zip(foregrounds, cells[1:]):
            percent = _number(source, number, foreground, cell)
            if not -100.0 < percent < 100.0:
                raise PairFileError(source, number, foreground,
                                    f"loss {percent}% is outside (-100, 100)")
            losses[(None, background, foreground)] = percent / 100.0
        if background not in order:
            order.append(background)
    return PairTable(source=source, workloads=tuple(order), losses=losses)


def _parse_long(source: str, columns: list[str], rows: list[tuple[int, list[str]]]) -> PairTable:
    index = {name: columns.index(name) for name in LONG_FIELDS}
    if not rows:
        raise PairFileError(source, None, None, "has a header but no measurements")
    grouped: dict[PairKey, list[float]] = {}
    order: list[str] = []
    for number, cells in rows:
        if len(cells) != len(columns):
            raise PairFileError(source, number, None,
                                f"has {len(cells)} fields, the header names {len(columns)}")
        try:
            distance = parse_distance(cells[index["distance"]])
        except ValueError as exc:
            raise PairFileError(source, number, "distance", str(exc)) from None
        foreground = cells[index["foreground"]]
        background = cells[index["background"]]
        for field, name in (("foreground", foreground), ("background", background)):
            if not name:
                raise PairFileError(source, number, field, "is empty")
        alone = _number(source, number, "perf_alone", cells[index["perf_alone"]])
        shared = _number(source, number, "perf_shared", cells[index["perf_shared"]])
        if alone <= 0:
            raise PairFileError(source, number, "perf_alone", f"must be > 0, got {alone}")
        if shared < 0:
            raise PairFileError(source, number, "perf_shared", f"must be >= 0, got {shared}")
        grouped.setdefault((distance, background, foreground), []).append(1.0 - shared / alone)
        for name in (foreground, background):
            if name not in order:
                order.append(name)
    losses = {key: sum(values) / len(values) for key, values in grouped.items()}
    return PairTable(source=source, workloads=tuple(order), losses=losses)
