"""`vmplacer protect status --plot`: ζ/ζb and throttle shares over time from recorded rounds.

matplotlib is imported here only, with the Agg backend (no display needed), so the
CLI's start-up never pays for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def series(rounds: Sequence[dict[str, Any]]) -> tuple[dict[str, list[tuple[float, float, float | None]]],
                                                       dict[str, list[tuple[float, float]]],
                                                       dict[str, float]]:
    """Per protected guest (host/guest): (time, smoothed ζ/ζb or NaN, raw ζ/ζb); per throttleable
    guest: (time, share); per protected guest its floor."""
    ratios: dict[str, list[tuple[float, float, float | None]]] = {}
    shares: dict[str, list[tuple[float, float]]] = {}
    floors: dict[str, float] = {}
    for record in sorted(rounds, key=lambda r: float(r.get("at", 0.0))):
        at, host = float(record.get("at", 0.0)), str(record.get("host"))
        for guest, stats in (record.get("guests") or {}).items():
            key = f"{host}/{guest}"
            ratio = stats.get("ratio")
            ratios.setdefault(key, []).append((at, float("nan") if ratio is None else float(ratio),
                                               stats.get("ratio_raw")))
            floors[key] = float(stats.get("floor") or 0.0)
        for guest, share in (record.get("shares") or {}).items():
            shares.setdefault(f"{host}/{guest}", []).append((at, float(share)))
    return ratios, shares, floors


def draw(rounds: Sequence[dict[str, Any]], path: str) -> int:
    """Write the plot to `path` (PNG); returns how many series it drew."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios, shares, floors = series(rounds)
    start = min(float(r.get("at", 0.0)) for r in rounds)
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    for key, points in sorted(ratios.items()):
        times = [t - start for t, _, _ in points]
        line, = top.plot(times, [r for _, r, _ in points], label=f"{key} ζ/ζb (smoothed)")
        raw = [(t - start, r) for t, _, r in points if r is not None]
        if raw:
            top.scatter([t for t, _ in raw], [r for _, r in raw], s=6, alpha=0.4, color=line.get_color())
        top.axhline(floors[key], linestyle="--", color=line.get_color(), linewidth=0.8, label=f"{key} floor")
    top.set_ylabel("ζ/ζb")
    top.set_ylim(0, 1.05)
    top.legend(loc="lower right", fontsize="small")
    for key, points in sorted(shares.items()):
        bottom.step([t - start for t, _ in points], [s for _, s in points], where="post", label=f"{key} share")
    bottom.set_ylabel("CPU share per vCPU")
    bottom.set_ylim(0, 1.05)
    bottom.set_xlabel("seconds")
    if shares:
        bottom.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
    return len(ratios) + len(shares)
