"""What every benchmark records about the machine it ran on (results are only comparable with it)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model(fallback: str = "") -> str:
    """The CPU's model name from /proc/cpuinfo, else `fallback` (default: the platform's name)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return fallback or platform.processor() or platform.machine()


def summary() -> str:
    """One line: CPU model, CPU count, kernel and Python."""
    return (f"{cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages, rounded: the machine is shared, so each figure carries them."""
    return [round(x, 2) for x in os.getloadavg()]
