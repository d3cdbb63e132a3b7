"""CPU sets as Linux sysfs and libvirt write them: lists ("0-3,8,10-11", libvirt
also "^2") and the kernel's hex masks ("00000000,0000ff00").

One parser for each syntax, so a cpuset read from sysfs, from capabilities XML or
from a live domain means the same thing everywhere.
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


_MASK_WORD_BITS = 32


def parse_cpumask(text: str) -> frozenset[int]:
    """Parse a kernel CPU mask ("ff", "00000000,0000ff00") into CPU ids.

    The kernel prints masks (`shared_cpu_map`, `thread_siblings`, a node's
    `cpumap`) as hex words of 32 bits, most significant first, separated by
    commas; the first word may be shorter. Older kernels and some
    architectures offer only this form, not the list form. Empty text is the
    empty set.
    """
    cleaned = text.strip()
    if not cleaned:
        return frozenset()
    words = [word.strip() for word in cleaned.replace("\n", ",").split(",")]
    value = 0
    for index, word in enumerate(words):
        too_long = len(words) > 1 and len(word) > _MASK_WORD_BITS // 4
        if not word or too_long or any(ch not in "0123456789abcdefABCDEF" for ch in word):
            raise CpusetError(f"bad CPU mask word {word!r} (#{index + 1}) in {text!r}")
        value = (value << _MASK_WORD_BITS) | int(word, 16)
    return frozenset(bit for bit in range(value.bit_length()) if value >> bit & 1)


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
