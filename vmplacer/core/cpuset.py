"""CPU list syntax shared by Linux sysfs and libvirt ("0-3,8,10-11", libvirt also "^2").

One parser for both so a cpuset read from sysfs, from capabilities XML or from a
live domain means the same thing everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable


class CpusetError(ValueError):
    """A CPU list that cannot be parsed; the message quotes the offending text."""


def parse_cpuset(text: str) -> frozenset[int]:
    """Parse "0-3,^2,8" into {0, 1, 3, 8}. Empty text is the empty set."""
    included: set[int] = set()
    excluded: set[int] = set()
    for raw in text.replace("\n", ",").split(","):
        part = raw.strip()
        if not part:
            continue
        target = included
        if part.startswith("^"):
            target, part = excluded, part[1:].strip()
        try:
            if "-" in part:
                low_text, high_text = part.split("-", 1)
                low, high = int(low_text), int(high_text)
                if low < 0 or high < low:
                    raise CpusetError(f"bad CPU range {raw.strip()!r} in {text!r}")
                target.update(range(low, high + 1))
            else:
                value = int(part)
                if value < 0:
                    raise CpusetError(f"negative CPU {value} in {text!r}")
                target.add(value)
        except ValueError as exc:
            if isinstance(exc, CpusetError):
                raise
            raise CpusetError(f"bad CPU list element {raw.strip()!r} in {text!r}") from None
    return frozenset(included - excluded)


def format_cpuset(cpus: Iterable[int]) -> str:
    """Format {0,1,2,3,8} as "0-3,8" (the compact form libvirt and sysfs print)."""
    ordered = sorted(set(cpus))
    if not ordered:
        return ""
    parts: list[str] = []
    start = prev = ordered[0]
    for cpu in ordered[1:]:
        if cpu == prev + 1:
            prev = cpu
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = cpu
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)
