"""Small statistics used to judge and fit the interference model.

Kept here (numpy only) so the model, the ranking and the evaluation compute
their errors and correlations the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike


def rrmse(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Relative RMSE of predictions against measurements (seed eq. 3.6).

    Every error is relative to its own measured value, so a 5 % miss on a VM
    that runs at 40 % of its isolated speed counts as much as on one at 95 %.
    """
    pred = np.asarray(predicted, dtype=float)
    meas = np.asarray(measured, dtype=float)
    if pred.shape != meas.shape:
        raise ValueError(f"rrmse: {pred.size} predictions for {meas.size} measurements")
    if pred.size == 0:
        raise ValueError("rrmse: no values")
    if np.any(meas <= 0):
        raise ValueError("rrmse: measured values must be > 0 (relative error undefined)")
    return float(np.sqrt(np.mean(((pred - meas) / meas) ** 2)))


def pearson(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson's r; 0.0 when either side is constant (no linear information)."""
    a = np.asarray(x, dtype=float)
    b = np.asarray(y, dtype=float)
    if a.shape != b.shape or a.size < 2:
        raise ValueError("pearson: need two equally long series of at least 2 values")
    a = a - a.mean()
    b = b - b.mean()
    denom = math.sqrt(float(a @ a) * float(b @ b))
    if denom == 0.0:
        return 0.0
    return float(a @ b) / denom


def ranks(values: ArrayLike) -> np.ndarray:
    """1-based ranks with ties sharing their average rank (as Spearman needs)."""
    data = np.asarray(values, dtype=float)
    order = np.argsort(data, kind="mergesort")
    result = np.empty(data.size, dtype=float)
    i = 0
    while i < data.size:
        j = i
        while j + 1 < data.size and data[order[j + 1]] == data[order[i]]:
            j += 1
        result[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return result


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman's rank correlation: Pearson's r of the (tie-averaged) ranks."""
    return pearson(ranks(x), ranks(y))


def ridge_toward(
    gram: np.ndarray, rhs: np.ndarray, prior: np.ndarray, penalty: np.ndarray | float
) -> np.ndarray:
    """Solve min ‖y − Zβ‖² + Σ penalty_i (β_i − prior_i)² from Zᵀ Z and Zᵀ y.

    Shrinking toward a prior instead of toward zero is what lets a coefficient
    with little data fall back to its class or global average. With a zero
    penalty the minimum-norm deviation from the prior is returned, so an
    unidentifiable direction keeps its prior value instead of failing.
    """
    n = rhs.shape[0]
    if n == 0:
        return np.zeros(0)
    pen = np.broadcast_to(np.asarray(penalty, dtype=float), (n,))
    system = gram + np.diag(pen)
    target = rhs - gram @ prior
    if np.all(pen > 0):
        try:
            return prior + np.linalg.solve(system, target)
        except np.linalg.LinAlgError:
            pass
    delta, *_ = np.linalg.lstsq(system, target, rcond=None)
    nearest: np.ndarray = prior + delta
    return nearest
