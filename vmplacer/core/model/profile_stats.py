"""Statistics of Freeze'nSense samples: distributions of ζ and ζb, degradation, overhead.

The seed's point is that the frozen samples reproduce the isolated
*distribution*, not only its mean, so results are kept as percentiles (the
box plots of its Fig. 5.3: quartiles in the box, 10th/90th percentiles as
whiskers) plus a confidence interval. Degradation and a guest's measured share
of its isolated performance use medians: a few ragged samples that slipped
through validation cannot move them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

# Two-sided 95 % Student t quantiles for 1..29 degrees of freedom; 1.96 beyond.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
)


def t_quantile_975(dof: int) -> float:
    if dof < 1:
        raise ValueError("a confidence interval needs at least two samples")
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


@dataclass(frozen=True)
class Distribution:
    """Summary of one sample set: percentiles, mean and a 95 % CI of the mean."""

    n: int
    mean: float
    std: float
    min: float
    p10: float
    p25: float
    p50: float
    p75: float
    p90: float
    max: float
    ci95_low: float
    ci95_high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution | None:
        data = np.asarray(values, dtype=float)
        if data.size == 0:
            return None
        mean = float(data.mean())
        std = float(data.std(ddof=1)) if data.size > 1 else 0.0
        half = t_quantile_975(data.size - 1) * std / float(np.sqrt(data.size)) if data.size > 1 else 0.0
        p10, p25, p50, p75, p90 = (float(x) for x in np.percentile(data, [10, 25, 50, 75, 90]))
        return cls(
            n=int(data.size), mean=mean, std=std, min=float(data.min()),
            p10=p10, p25=p25, p50=p50, p75=p75, p90=p90, max=float(data.max()),
            ci95_low=mean - half, ci95_high=mean + half,
        )

    @property
    def cv(self) -> float:
        """Coefficient of variation (std / |mean|); infinite for a zero mean."""
        return self.std / abs(self.mean) if self.mean else float("inf")

    def to_dict(self) -> dict[str, float | int]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Degradation:
    """1 − ζ/ζb: how much a VM loses to its neighbours (0 = none, 0.5 = half its speed).

    `estimate` compares medians; `ci95_*` is a bootstrap interval of that
    estimate; `by_mean` compares means; `per_round` is the distribution of the
    ratio of the i-th ζ and the i-th ζb sample (taken in the same round).
    """

    estimate: float
    ci95_low: float
    ci95_high: float
    by_mean: float
    per_round: Distribution | None

    def to_dict(self) -> dict[str, object]:
        return {
            "estimate": round(self.estimate, 6),
            "ci95_low": round(self.ci95_low, 6),
            "ci95_high": round(self.ci95_high, 6),
            "by_mean": round(self.by_mean, 6),
            "per_round": self.per_round.to_dict() if self.per_round else None,
        }


def degradation(
    zeta: Sequence[float],
    zeta_b: Sequence[float],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> Degradation | None:
    """Degradation of one VM from its shared (ζ) and isolated (ζb) samples; None without data."""
    shared = np.asarray(zeta, dtype=float)
    alone = np.asarray(zeta_b, dtype=float)
    if shared.size == 0 or alone.size == 0:
        return None
    alone_median = float(np.median(alone))
    alone_mean = float(alone.mean())
    if alone_median <= 0 or alone_mean <= 0:
        return None
    estimate = 1.0 - float(np.median(shared)) / alone_median
    rng = np.random.default_rng(seed)
    shared_medians = np.median(rng.choice(shared, size=(resamples, shared.size)), axis=1)
    alone_medians = np.median(rng.choice(alone, size=(resamples, alone.size)), axis=1)
    valid = alone_medians > 0
    boot = 1.0 - shared_medians[valid] / alone_medians[valid]
    low, high = (float(x) for x in np.percentile(boot, [2.5, 97.5])) if boot.size else (estimate, estimate)
    pairs = min(shared.size, alone.size)
    paired_alone = alone[:pairs]
    usable = paired_alone > 0
    per_round = Distribution.of(1.0 - shared[:pairs][usable] / paired_alone[usable])
    return Degradation(
        estimate=estimate,
        ci95_low=low,
        ci95_high=high,
        by_mean=1.0 - float(shared.mean()) / alone_mean,
        per_round=per_round,
    )


def measured_share(zeta: Sequence[float], zeta_b: Sequence[float]) -> float | None:
    """A guest's measured share of its isolated performance: median ζ over median ζb, at most 1.0.

    What a measured trial compares (core/rebalance/trial.py) and a protection floor is held to. Medians,
    as for the degradation above: one ragged sample (a window that caught a neighbour's wake-up,
    a loaded sampler) must not move a verdict, and the ζ and ζb of a run are taken at different
    moments, so the ratio of two robust centres is the estimate, not a mean of per-pair ratios.
    Capped at 1.0: ζb is what the guest does alone (docs/research/method.md §2), so a ratio above
    it is sampling noise, and counting it would let noise score a guest above the best it can do.
    None without a sample of either kind, or when the median ζb is not positive (nothing to
    compare with).
    """
    if len(zeta) == 0 or len(zeta_b) == 0:
        return None
    alone = float(np.median(np.asarray(zeta_b, dtype=float)))
    if not alone > 0:
        return None
    shared = float(np.median(np.asarray(zeta, dtype=float)))
    return min(1.0, max(0.0, shared / alone))


def overhead_formula(k_s: float, t_m_s: float, t_sleep_s: float) -> float:
    """The seed's Eq. 5.1: O_h = K_s·t_m / (K_s·t_m + t_sleep), the share of time neighbours are frozen."""
    if k_s <= 0 or t_m_s <= 0:
        return 0.0
    busy = k_s * t_m_s
    return busy / (busy + max(t_sleep_s, 0.0))


def neighbour_losses(samples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What each probed neighbour costs one VM, from its pair probes: per neighbour the
    degradation of the VM's ζp samples (that neighbour alone running) against its ζb samples,
    the largest first. The neighbour of a ζp is the one running then and frozen at the nearest ζb
    (domains never frozen ran in both and are not the probe's)."""
    alone = [s for s in samples if s["kind"] == "zeta_b"]
    if not alone:
        return []
    by_partner: dict[tuple[str, str], list[float]] = {}
    for pair in (s for s in samples if s["kind"] == "zeta_p"):
        nearest = min(alone, key=lambda s: abs(s["at"] - pair["at"]))
        frozen_then = {n["name"] for n in nearest.get("neighbours", []) if n.get("frozen", True)}
        partners = [n for n in pair.get("neighbours", []) if not n.get("frozen", True) and n["name"] in frozen_then]
        if len(partners) == 1:
            by_partner.setdefault((partners[0]["name"], partners[0]["distance"]), []).append(float(pair["value"]))
    isolated = [float(s["value"]) for s in alone]
    result = []
    for (name, distance), values in by_partner.items():
        loss = degradation(values, isolated)
        if loss is not None:
            result.append({"neighbour": name, "distance": distance, "n": len(values), "degradation": loss.to_dict()})
    return sorted(result, key=lambda row: (-row["degradation"]["estimate"], row["neighbour"]))


def stored_summary(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One VM's stored samples of one run as an operator reads them (`profile show`, the API):
    ζ and ζb distributions, the degradation, freeze spans, the neighbours at the last ζb and what
    each probed neighbour alone costs."""
    zeta = [float(s["value"]) for s in samples if s["kind"] == "zeta"]
    zeta_b = [float(s["value"]) for s in samples if s["kind"] == "zeta_b"]
    last_b = next((s for s in reversed(samples) if s["kind"] == "zeta_b"), None)
    freeze = [s["freeze_ms"] for s in samples if s["kind"] == "zeta_b" and s.get("freeze_ms") is not None]
    zeta_d, zeta_b_d, freeze_d = Distribution.of(zeta), Distribution.of(zeta_b), Distribution.of(freeze)
    loss = degradation(zeta, zeta_b)
    return {
        "zeta": zeta_d.to_dict() if zeta_d else None,
        "zeta_b": zeta_b_d.to_dict() if zeta_b_d else None,
        "degradation": loss.to_dict() if loss else None,
        "freeze_ms": freeze_d.to_dict() if freeze_d else None,
        "neighbours": last_b["neighbours"] if last_b else [],
        "pairs": neighbour_losses(samples),
        "values": {"zeta": zeta, "zeta_b": zeta_b},
    }
