"""Why a guest does not fit: every failed constraint, where, and need vs have.

The allocator never answers "no" without saying why; operators read these
reasons in `vmplacer plan`, the API returns them as data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NoFitReason:
    constraint: str  # e.g. "whole-cores", "memory", "hugepages", "shared-pool", "anti-affinity"
    where: str  # "node 1", "cell 0 on node 1", "host"
    need: str
    have: str
    detail: str = ""

    def __str__(self) -> str:
        text = f"{self.where}: {self.constraint}: need {self.need}, have {self.have}"
        return f"{text} ({self.detail})" if self.detail else text

    def to_dict(self) -> dict[str, str]:
        return {
            "constraint": self.constraint,
            "where": self.where,
            "need": self.need,
            "have": self.have,
            "detail": self.detail,
        }


class NoFit(Exception):
    """The guest cannot be placed on the host; `reasons` lists every failed constraint."""

    def __init__(self, guest: str, host: str, reasons: list[NoFitReason] | tuple[NoFitReason, ...]):
        self.guest = guest
        self.host = host
        self.reasons = tuple(dict.fromkeys(reasons))  # drop exact duplicates, keep order
        lines = [f"guest {guest} does not fit on host {host}:"]
        lines += [f"  {reason}" for reason in self.reasons] or ["  (no reason recorded)"]
        super().__init__("\n".join(lines))

    def to_dict(self) -> dict[str, Any]:
        return {
            "guest": self.guest,
            "host": self.host,
            "reasons": [reason.to_dict() for reason in self.reasons],
        }
