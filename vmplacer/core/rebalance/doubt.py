"""How much a layout change's predicted interference may be wrong by, from the changed lines only.

The pessimistic stage (`pessimistic.py`) weighs a layout's predicted advantage against the
standard deviation of what the coefficients behind it may be wrong by: the variances
(`HostLayout.pair_spread`) of the pair terms that change between the two layouts. A pair is
two vCPUs — (guest, vCPU), wherever its pieces run — and its term is the sum over their pieces'
pairs. Only a vCPU whose pieces moved or whose time shares changed can be in a pair that
changes, so only those vCPUs' rows and columns are read, a bounded number of pieces' lines at a
time: O(changed pieces × pieces) time and O(lines × pieces) memory, never a piece × piece array.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vmplacer.core.rebalance.layout import HostLayout, LayoutPieces

LINE_CELLS = 1 << 21  # piece lines × pieces read at once (16 MiB an array)
_CHANGE_FLOOR = 1e-12  # a pair whose summed term moved less than this did not change


def change_sd(before: Sequence[tuple[HostLayout, LayoutPieces]],
              after: Sequence[tuple[HostLayout, LayoutPieces]]) -> float:
    """Standard deviation of the predicted interference change from each host's `before`
    layout to its `after` one (the same hosts, in order): the square root of the summed
    variances, before and after, of every vCPU pair whose summed term changes."""
    return math.sqrt(sum(_host_variance(*b, *a) for b, a in zip(before, after)))


def _host_variance(host_b: HostLayout, pieces_b: LayoutPieces, host_a: HostLayout, pieces_a: LayoutPieces) -> float:
    keys_b, keys_a = host_b.pair_keys(pieces_b), host_a.pair_keys(pieces_a)
    union: dict[tuple[str, int], int] = {}
    at_b = np.array([union.setdefault(k[:2], len(union)) for k in keys_b], dtype=np.int64)
    at_a = np.array([union.setdefault(k[:2], len(union)) for k in keys_a], dtype=np.int64)
    size = len(union)
    if size == 0:
        return 0.0
    changed = _changed_vcpus(host_b, pieces_b, at_b, host_a, pieces_a, at_a, size)
    rows = np.flatnonzero(changed)
    if not len(rows):
        return 0.0
    variance = 0.0
    for columns in (False, True):
        for part in _parts(rows, at_b, at_a, max(len(keys_b), len(keys_a), 1)):
            delta, spread = _lines(host_b, pieces_b, at_b, part, columns, size, -1.0)
            more = _lines(host_a, pieces_a, at_a, part, columns, size, 1.0)
            delta += more[0]
            spread += more[1]
            if columns:  # pairs of two changed vCPUs are counted with the rows
                spread[:, rows] = 0.0
            variance += float(spread[np.abs(delta) > _CHANGE_FLOOR].sum())
    return variance


def _changed_vcpus(host_b: HostLayout, pieces_b: LayoutPieces, at_b: np.ndarray, host_a: HostLayout,
                   pieces_a: LayoutPieces, at_a: np.ndarray, size: int) -> np.ndarray:
    """[vCPU of the union]: whether its pieces differ — a pCPU, a granted share or an objective
    scale — between the layouts (or it is in one only)."""
    def signature(host: HostLayout, pieces: LayoutPieces, at: np.ndarray) -> set[tuple[int, int, float, float]]:
        granted, scale = host.pair_factors(pieces)
        return set(zip(at.tolist(), pieces.cpu.tolist(), granted.tolist(), scale.tolist()))

    differ = signature(host_b, pieces_b, at_b) ^ signature(host_a, pieces_a, at_a)
    changed = np.zeros(size, dtype=bool)
    changed[[entry[0] for entry in differ]] = True
    return changed


def _parts(rows: np.ndarray, at_b: np.ndarray, at_a: np.ndarray, width: int) -> list[np.ndarray]:
    """`rows` (changed vCPUs) in groups whose pieces' lines, on either side, fit `LINE_CELLS`."""
    counts = np.bincount(np.concatenate([at_b, at_a]), minlength=int(rows.max()) + 1)[rows]
    groups, start, held = [], 0, 0
    for i, count in enumerate(counts.tolist()):
        if held and (held + count) * width > LINE_CELLS:
            groups.append(rows[start:i])
            start, held = i, 0
        held += count
    groups.append(rows[start:])
    return groups


def _lines(host: HostLayout, pieces: LayoutPieces, at: np.ndarray, part: np.ndarray, columns: bool,
           size: int, sign: float) -> tuple[np.ndarray, np.ndarray]:
    """[vCPU of `part`, vCPU of the union]: one layout's summed pair terms (times `sign`) and
    variances between the vCPUs of `part` (rows, or with `columns` the other side of the pair)
    and every vCPU."""
    local = np.full(size, -1, dtype=np.int64)
    local[part] = np.arange(len(part))
    mine = np.flatnonzero(local[at] >= 0)
    delta, spread = np.zeros((len(part), size)), np.zeros((len(part), size))
    if not len(mine) or not len(at):
        return delta, spread
    terms, variance = host.pair_spread_lines(pieces, mine, columns)
    cell = (local[at[mine]][:, None] * size + at[None, :]).ravel()
    delta += np.bincount(cell, weights=(sign * terms).ravel(), minlength=len(part) * size).reshape(len(part), size)
    spread += np.bincount(cell, weights=variance.ravel(), minlength=len(part) * size).reshape(len(part), size)
    return delta, spread
