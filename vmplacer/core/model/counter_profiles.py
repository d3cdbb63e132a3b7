"""Hardware-counter profiles of workloads measured in isolation (seed ch. 4).

Format: header ``workload,event,value``, one raw count per line (``#`` lines
are comments). Every workload needs a ``cycles`` count: events are compared
as rates per cycle, so runs of different length and clock speed compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vmplacer.core.model.pairs import PairFileError

PROFILE_FIELDS = ("workload", "event", "value")
CYCLES = "cycles"


class ProfileFileError(PairFileError):
    """A profile file that cannot be used; names the source, line and field."""


@dataclass(frozen=True)
class Profiles:
    source: str
    counts: dict[str, dict[str, float]]  # workload -> event -> raw count

    @property
    def workloads(self) -> tuple[str, ...]:
        return tuple(self.counts)

    def rates(self) -> dict[str, dict[str, float]]:
        """workload -> event -> events per cycle (instructions per cycle = IPC)."""
        return {
            workload: {event: value / events[CYCLES] for event, value in events.items() if event != CYCLES}
            for workload, events in self.counts.items()
        }


def parse_profiles(text: str, source: str = "<profiles>") -> Profiles:
    counts: dict[str, dict[str, float]] = {}
    columns: list[str] | None = None
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if columns is None:
            columns = [cell.lower() for cell in cells]
            if not set(PROFILE_FIELDS) <= set(columns):
                raise ProfileFileError(source, number, None,
                                       f"header must name the columns {','.join(PROFILE_FIELDS)}; "
                                       f"got {line!r}")
            continue
        if len(cells) != len(columns):
            raise ProfileFileError(source, number, None,
                                   f"has {len(cells)} fields, the header names {len(columns)}")
        row = dict(zip(columns, cells))
        workload, event, value_text = row["workload"], row["event"], row["value"]
        for field in ("workload", "event"):
            if not row[field]:
                raise ProfileFileError(source, number, field, "is empty")
        try:
            value = float(value_text)
        except ValueError:
            raise ProfileFileError(source, number, "value", f"is not a number: {value_text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise ProfileFileError(source, number, "value", f"must be a finite count >= 0, got {value_text!r}")
        events = counts.setdefault(workload, {})
        if event in events:
            raise ProfileFileError(source, number, "event",
                                   f"{event!r} of {workload!r} repeats line {first_line[workload + '/' + event]}")
        events[event] = value
        first_line[workload + "/" + event] = number
    if columns is None:
        raise ProfileFileError(source, None, None, "has no header line and no data")
    if not counts:
        raise ProfileFileError(source, None, None, "has a header but no counts")
    for workload, events in counts.items():
        if events.get(CYCLES, 0) <= 0:
            raise ProfileFileError(source, None, CYCLES,
                                   f"workload {workload!r} needs a {CYCLES!r} count > 0 to normalise its events")
    return Profiles(source=source, counts=counts)
