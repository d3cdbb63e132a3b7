"""One-vCPU moves on big layouts, judged per guest instead of per piece.

The search scores every pinned vCPU's move to every pCPU it may take. Scored piece by piece, a
candidate costs O(pieces) — on a host of floating guests, thousands of pieces, each re-weighed
for each of thousands of candidates. But a move changes little: the moved piece's pCPU, and
the time shares of the pieces on the two pCPUs whose load changed. In the additive form a
guest's performance is Σ g·(1 − Σ β·g) over its pieces, which is linear in what changed, so
every other piece's part comes from per-guest sums made once per layout (what each guest
suffers from each pCPU's load, and from a unit of each workload on each pCPU); only the pieces
on the two pCPUs are weighed again. A candidate then costs O(guests + pieces on two pCPUs).

The results equal `HostLayout.perf_moves_blind_many`'s piece-by-piece arithmetic to rounding
(tests/unit/test_layout_moves.py); the multiplicative form, whose per-piece exponentials do not
add up, keeps the piece-by-piece path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from vmplacer.core.rebalance.layout import HostLayout, LayoutPieces

# layouts of more pieces than this judge one-vCPU moves per guest (smaller ones keep the
# piece-by-piece arithmetic, whose floats the plans of small hosts were made with)
PER_GUEST_ABOVE = 512
# layouts of at most this many pieces still judge a move's confidence on whole pair arrays, kept
# with the layout (`whatif`); above it, piece × piece arrays are never made
DENSE_JUDGE_PIECES = 2048
# candidates × pieces-per-pCPU entries gathered at once (memory stays near 8 MiB an array)
_CHUNK_CELLS = 1 << 20


@dataclass
class GuestSums:
    """A layout's sums per guest and pCPU under one β table (module docstring), made once."""

    speed: np.ndarray  # [pCPU]: share of its demand a piece gets there
    granted: np.ndarray  # [piece]
    loss: np.ndarray  # [piece]: Σ β·g it suffers
    by_cpu: np.ndarray  # [pCPU, piece]: Σ β·demand it suffers from that pCPU's pieces
    kept: np.ndarray  # [guest]: Σ g − Σ g·loss (performance before the ideal)
    granted_sum: np.ndarray  # [guest]: Σ g
    from_load: np.ndarray  # [pCPU, guest]: Σ g·by_cpu over the guest's pieces
    from_unit: np.ndarray  # [pCPU, key, guest]: Σ g·β(a unit of key on that pCPU) over the guest's pieces
    caused: np.ndarray  # [pCPU, key]: Σ β·g a piece of key on that pCPU would suffer from every piece
    slots: np.ndarray  # [pCPU, j]: the pieces on each pCPU, -1 padded
    generation: int = 0  # updates since the sums were last made whole (`_derived_sums`)


def applies(host: HostLayout, pieces: LayoutPieces) -> bool:
    """Whether `pieces`' one-vCPU moves are judged per guest (additive form, big layouts, and a
    distance table that is symmetric, as every topology's is)."""
    from vmplacer.core.model.interference import MULTIPLICATIVE

    return (host.betas.form != MULTIPLICATIVE and pieces.table is not None
            and len(pieces.cpu) > PER_GUEST_ABOVE and bool(pieces.vm.size) and _symmetric(host))


def _symmetric(host: HostLayout) -> bool:
    found = getattr(host, "_dist_symmetric", None)
    if found is None:
        found = bool(np.array_equal(host.dist, host.dist.T))
        host._dist_symmetric = found  # type: ignore[attr-defined]
    return found


def guest_sums(host: HostLayout, pieces: LayoutPieces) -> GuestSums:
    """`GuestSums` of `pieces` (cached on them), never a piece × piece array: O(pCPUs × pieces ×
    keys)."""
    found = pieces.guest_sums
    if isinstance(found, GuestSums):
        return found
    assert pieces.table is not None
    parent = pieces.parent
    if parent is not None and isinstance(parent[0].guest_sums, GuestSums) and 0 < len(parent[1]) <= _FEW_MOVED \
            and parent[0].table is pieces.table and parent[0].guest_sums.generation < _GENERATIONS:
        sums = _derived_sums(host, pieces, parent[0], parent[0].guest_sums, parent[1])
        pieces.guest_sums = sums
        host.holds(pieces)
        return sums
    n, size = len(host.cpus), len(pieces.cpu)
    table, key, cpu, vm = pieces.table, pieces.key, pieces.cpu, pieces.vm
    keys, guests = table.shape[1], len(pieces.guests)
    load = np.bincount(cpu, weights=pieces.demand, minlength=n)
    speed = np.minimum(1.0, 1.0 / np.maximum(load, 1e-12))
    granted = pieces.demand * speed[cpu]
    dist = host.dist[:, cpu]  # [pCPU, piece]
    near = dist != 0
    demand_on = np.bincount(cpu * keys + key, weights=pieces.demand, minlength=n * keys).reshape(n, keys)
    own_on = np.bincount(vm * n + cpu, weights=pieces.demand, minlength=guests * n).reshape(guests, n)
    by_cpu = np.zeros((n, size))
    from_unit = np.zeros((n, keys, guests))
    caused = np.zeros((n, keys))
    starts = np.flatnonzero(np.r_[True, vm[1:] != vm[:-1]])
    order_ok = len(starts) == guests and bool((vm[starts] == np.arange(guests)).all())
    for k in range(keys):
        suffered = np.where(near, table[dist, k, key], 0.0)  # [c, x]: β(a unit of k on c → x)
        by_cpu += suffered * demand_on[:, k][:, None]
        from_unit[:, k, :] = _guest_sum(suffered * granted[None, :], vm, starts, guests, order_ok)
        caused[:, k] = (np.where(near, table[dist, key, k], 0.0) * granted[None, :]).sum(axis=1)
    by_cpu -= np.where(near, table[dist, key, key], 0.0) * own_on[vm].T  # a guest's own pieces do not count
    loss = speed @ by_cpu
    kept = np.bincount(vm, weights=granted * (1.0 - loss), minlength=guests)
    granted_sum = np.bincount(vm, weights=granted, minlength=guests)
    from_load = _guest_sum(by_cpu * granted[None, :], vm, starts, guests, order_ok)
    sums = GuestSums(speed, granted, loss, by_cpu, kept, granted_sum, from_load, from_unit, caused,
                     _slots(cpu, n))
    pieces.guest_sums = sums
    host.holds(pieces)
    return sums


def _slots(cpu: np.ndarray, n: int) -> np.ndarray:
    """[pCPU, j]: the pieces on each pCPU, in piece order, -1 padded."""
    counts = np.bincount(cpu, minlength=n)
    slots = np.full((n, max(int(counts.max(initial=0)), 1)), -1, dtype=np.int64)
    order = np.argsort(cpu, kind="stable")
    first = np.cumsum(counts) - counts
    slots[cpu[order], np.arange(len(cpu)) - first[cpu[order]]] = order
    return slots


_FEW_MOVED = 8  # a layout derived from another by moving at most this many pieces updates its sums
_GENERATIONS = 32  # … at most this many times in a row before they are made whole again (rounding)


def _derived_sums(host: HostLayout, pieces: LayoutPieces, base: LayoutPieces, old: GuestSums,
                  moved: np.ndarray) -> GuestSums:
    """`GuestSums` of `pieces`, which differ from `base` only in the pCPUs of the one-pCPU pieces
    `moved`: the pCPU rows those pieces leave and join, the moved pieces' own columns, and the
    pieces whose time share changed are weighed again; the rest is `old`'s. O(pCPUs × pieces)
    copies and sums, O(moved × pieces) look-ups — not O(pCPUs × pieces × keys) of look-ups."""
    assert pieces.table is not None
    n = len(host.cpus)
    table, key, vm, demand, cpu, was = pieces.table, pieces.key, pieces.vm, pieces.demand, pieces.cpu, base.cpu
    keys, guests = table.shape[1], len(pieces.guests)
    load = np.bincount(cpu, weights=demand, minlength=n)
    speed = np.minimum(1.0, 1.0 / np.maximum(load, 1e-12))
    granted = demand * speed[cpu]
    by_cpu = old.by_cpu.copy()
    for y in moved.tolist():  # y's demand leaves its old pCPU's row and joins its new one's
        other = vm != vm[y]
        for where, positions, sign in ((was[y], was, -1.0), (cpu[y], cpu, 1.0)):
            dist = host.dist[positions, where]
            by_cpu[where] += sign * demand[y] * np.where(other & (dist != 0), table[dist, key[y], key], 0.0)
    demand_on = np.bincount(cpu * keys + key, weights=demand, minlength=n * keys).reshape(n, keys)
    for x in moved.tolist():  # x's own column, where it now is
        dist = host.dist[:, cpu[x]]
        near = dist != 0
        own = np.bincount(cpu[vm == vm[x]], weights=demand[vm == vm[x]], minlength=n)
        by_cpu[:, x] = (np.where(near[:, None], table[dist, :, key[x]], 0.0) * demand_on).sum(axis=1) \
            - np.where(near, table[dist, key[x], key[x]], 0.0) * own
    loss = speed @ by_cpu
    starts = np.flatnonzero(np.r_[True, vm[1:] != vm[:-1]])
    order_ok = len(starts) == guests and bool((vm[starts] == np.arange(guests)).all())
    # the pieces whose share or pCPU changed: each one's part of the per-key sums, out and in again
    touched = np.isin(cpu, np.concatenate([was[moved], cpu[moved]])) | np.isin(np.arange(len(cpu)), moved)
    xs = np.flatnonzero(touched | np.isin(was, was[moved]))
    from_unit, caused = old.from_unit.copy(), old.caused.copy()
    every = np.arange(keys)
    for positions, weight, sign in ((was, old.granted, -1.0), (cpu, granted, 1.0)):
        dist = host.dist[:, positions[xs]]  # [c, x]
        near = (dist != 0)[:, :, None]
        suffered = np.where(near, table[dist[:, :, None], every[None, None, :], key[xs][None, :, None]], 0.0)
        np.add.at(from_unit.transpose(2, 0, 1), vm[xs], sign * (suffered * weight[xs][None, :, None]).transpose(1, 0, 2))
        hurt = np.where(near, table[dist[:, :, None], key[xs][None, :, None], every[None, None, :]], 0.0)
        caused += sign * (hurt * weight[xs][None, :, None]).sum(axis=1)
    return GuestSums(speed, granted, loss, by_cpu, np.bincount(vm, weights=granted * (1.0 - loss), minlength=guests),
                     np.bincount(vm, weights=granted, minlength=guests),
                     _guest_sum(by_cpu * granted[None, :], vm, starts, guests, order_ok),
                     from_unit, caused, _slots(cpu, n), old.generation + 1)


def _guest_sum(values: np.ndarray, vm: np.ndarray, starts: np.ndarray, guests: int, order_ok: bool) -> np.ndarray:
    """[row, guest]: `values` ([row, piece]) summed over each guest's pieces."""
    if order_ok:
        return np.add.reduceat(values, starts, axis=1)
    result = np.zeros((values.shape[0], guests))
    np.add.at(result.T, vm, values.T)
    return result


def moves_perf(host: HostLayout, pieces: LayoutPieces, moved: np.ndarray,
               targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(performance with interference, time sharing alone), [candidate, guest], of moving piece
    `moved[r]` to local pCPU `targets[r]` (never its own): `HostLayout.perf_moves_blind_many`'s
    numbers for one table, per guest (module docstring)."""
    step = max(1, _CHUNK_CELLS // pieces_per_cpu(host, pieces))
    if len(moved) > step:
        parts = [moves_perf(host, pieces, moved[i:i + step], targets[i:i + step]) for i in range(0, len(moved), step)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    s = guest_sums(host, pieces)
    assert pieces.table is not None
    table, key, vm, demand, cpu = pieces.table, pieces.key, pieces.vm, pieces.demand, pieces.cpu
    count, guests = len(moved), len(pieces.guests)
    rows = np.arange(count)
    a, b, km, hm = cpu[moved], targets, key[moved], vm[moved]
    dm = demand[moved]
    load = np.bincount(cpu, weights=demand, minlength=len(host.cpus))
    speed_a = np.minimum(1.0, 1.0 / np.maximum(load[a] - dm, 1e-12))
    speed_b = np.minimum(1.0, 1.0 / np.maximum(load[b] + dm, 1e-12))
    ds_a, ds_b = speed_a - s.speed[a], speed_b - s.speed[b]
    g_m, g_m_new = s.granted[moved], dm * speed_b
    d_ab = host.dist[a, b]
    others = np.arange(guests)[None, :] != hm[:, None]  # [r, guest]: not the moved piece's guest

    # every piece as if its own share stayed, the moved piece's guest without it
    at_a, at_b = s.from_unit[a, km, :], s.from_unit[b, km, :]  # [r, guest]
    perf = (s.kept[None, :] - ds_a[:, None] * (s.from_load[a] - dm[:, None] * at_a * others)
            - ds_b[:, None] * s.from_load[b] - (g_m_new[:, None] * at_b - g_m[:, None] * at_a) * others)
    formula_m = s.loss[moved] + ds_a * s.by_cpu[a, moved] + ds_b * s.by_cpu[b, moved]
    perf[rows, hm] -= g_m * (1.0 - formula_m)
    linear = np.repeat(s.granted_sum[None, :], count, axis=0)
    linear[rows, hm] += g_m_new - g_m

    # the pieces on the two pCPUs whose load changed: their own shares changed too
    near_ab = d_ab != 0
    suffered_m = s.caused[b, km] - _own_caused(host, pieces, s, moved, b)
    for side in ("a", "b"):
        x = s.slots[a if side == "a" else b]  # [r, j]
        valid = (x >= 0) & (x != moved[:, None])
        xs = np.where(valid, x, 0)
        kx, hx, dx = key[xs], vm[xs], demand[xs]
        mask = valid & (hx != hm[:, None]) & near_ab[:, None]
        beta_m_on_x = np.where(mask, table[d_ab[:, None], km[:, None], kx], 0.0)  # m (at the other pCPU) on x
        base = s.loss[xs] + ds_a[:, None] * s.by_cpu[a[:, None], xs] + ds_b[:, None] * s.by_cpu[b[:, None], xs]
        if side == "a":  # x shares m's old pCPU: m's new place reaches it, its old one never did
            delta = dx * ds_a[:, None]
            after = base + beta_m_on_x * g_m_new[:, None]
            suffered_m = suffered_m + (np.where(mask, table[d_ab[:, None], kx, km[:, None]], 0.0)
                                       * delta).sum(axis=1)
        else:  # x shares m's new pCPU: m's old place reached it, its new one does not
            delta = dx * ds_b[:, None]
            after = base - beta_m_on_x * (dm[:, None] * ds_a[:, None] + g_m[:, None])
        got = np.where(valid, delta * (1.0 - after), 0.0)
        flat = (rows[:, None] * guests + hx).ravel()
        perf += np.bincount(flat, weights=got.ravel(), minlength=count * guests).reshape(count, guests)
        linear += np.bincount(flat, weights=np.where(valid, delta, 0.0).ravel(),
                              minlength=count * guests).reshape(count, guests)
    perf[rows, hm] += g_m_new * (1.0 - suffered_m)
    ideal = pieces.ideal[None, :]
    return np.maximum(perf, 0.0) / ideal, np.maximum(linear, 0.0) / ideal


def pieces_per_cpu(host: HostLayout, pieces: LayoutPieces) -> int:
    return int(guest_sums(host, pieces).slots.shape[1])


def _own_caused(host: HostLayout, pieces: LayoutPieces, s: GuestSums, moved: np.ndarray,
                targets: np.ndarray) -> np.ndarray:
    """Per candidate: what the moved piece's own guest (itself included) adds to `caused` at its
    target — pieces of one guest do not interfere with each other."""
    assert pieces.table is not None
    result = np.empty(len(moved))
    for m in np.unique(moved).tolist():
        own = np.flatnonzero(pieces.vm == pieces.vm[m])
        rows = np.flatnonzero(moved == m)
        dist = host.dist[targets[rows][:, None], pieces.cpu[own][None, :]]
        k = pieces.key[m]
        result[rows] = (np.where(dist != 0, pieces.table[dist, k, k], 0.0) * s.granted[own][None, :]).sum(axis=1)
    return result


# candidates moving more pieces than this are scored by the piece × piece arithmetic
MOST_MOVED = 8


def is_big(pieces: LayoutPieces) -> bool:
    """Whether `pieces` is a big layout: more than `PER_GUEST_ABOVE` pieces, whatever the model."""
    return len(pieces.cpu) > PER_GUEST_ABOVE


def scored_big(host: HostLayout, pieces: LayoutPieces) -> bool:
    """Whether `pieces` is a big layout whose candidates are scored from `GuestSums` (either form:
    `moved_loss` is per piece) rather than from its piece × piece interference matrix."""
    return pieces.table is not None and len(pieces.cpu) > PER_GUEST_ABOVE and bool(pieces.vm.size) \
        and _symmetric(host)


def moved_loss(host: HostLayout, pieces: LayoutPieces, cpu: np.ndarray, granted: np.ndarray) -> np.ndarray | None:
    """[candidate, piece]: Σ β·g each piece suffers in each candidate (rows of `cpu`, with the time
    shares `granted` they give), for candidates that move at most `MOST_MOVED` pieces (None
    otherwise). An unmoved piece's loss is the layout's own, plus what the load changed on the
    moved pieces' pCPUs takes or gives (`GuestSums.by_cpu`), minus the moved pieces where they were,
    plus them where they go; a moved piece's is looked up anew. O(candidates × pieces × moved),
    no piece × piece array."""
    assert pieces.table is not None
    changed = cpu != pieces.cpu[None, :]
    most = int(changed.sum(axis=1).max(initial=0))
    if most > MOST_MOVED:
        return None
    s = guest_sums(host, pieces)
    count, size = cpu.shape
    rows = np.arange(count)
    table, key, vm, demand, home = pieces.table, pieces.key, pieces.vm, pieces.demand, pieces.cpu
    keys = table.shape[1]
    flat = table.reshape(-1)
    loss = np.repeat(s.loss[None, :], count, axis=0)
    if most == 0:
        return loss
    order = np.argsort(~changed, axis=1, kind="stable")[:, :most]  # each row's moved pieces first
    real = changed[rows[:, None], order]  # [c, j]: slot j names a moved piece
    load = np.bincount(home, weights=demand, minlength=len(host.cpus))
    # the pCPUs whose load changed: each moved piece's old and new one, every distinct pCPU once
    spots = np.concatenate([home[order], cpu[rows[:, None], order]], axis=1)  # [c, 2·most]
    live = np.concatenate([real, real], axis=1)
    for j in range(spots.shape[1]):
        for i in range(j):
            live[:, j] &= ~(live[:, i] & (spots[:, i] == spots[:, j]))
    new_load = load[spots] + np.zeros(spots.shape)
    for j in range(most):
        weight = np.where(real[:, j], demand[order[:, j]], 0.0)
        new_load -= weight[:, None] * (spots == home[order[:, j]][:, None])
        new_load += weight[:, None] * (spots == cpu[rows, order[:, j]][:, None])
    step = np.minimum(1.0, 1.0 / np.maximum(new_load, 1e-12)) - s.speed[spots]
    for j in range(spots.shape[1]):
        loss += np.where(live[:, j], step[:, j], 0.0)[:, None] * s.by_cpu[spots[:, j]]
    for j in range(most):
        y = order[:, j]
        ky = key[y][:, None]
        other = vm[None, :] != vm[y][:, None]
        was = host.dist[home[None, :], home[y][:, None]]  # [c, x]: x's pCPU to y's old one
        now = host.dist[home[None, :], cpu[rows, y][:, None]]
        before = np.where(other & (was != 0), flat[was * (keys * keys) + ky * keys + key[None, :]], 0.0)
        after = np.where(other & (now != 0), flat[now * (keys * keys) + ky * keys + key[None, :]], 0.0)
        old_share = demand[y] * (s.speed[home[y]] + _step_at(spots, live, step, home[y]))
        loss += np.where(real[:, j], 1.0, 0.0)[:, None] * (after * granted[rows, y][:, None]
                                                           - before * old_share[:, None])
    for j in range(most):  # the moved pieces' own losses, looked up where they now are
        x = order[:, j]
        dist = host.dist[cpu[rows, x][:, None], cpu]  # [c, y]
        other = vm[None, :] != vm[x][:, None]
        beta = np.where(other & (dist != 0), flat[dist * (keys * keys) + key[None, :] * keys + key[x][:, None]], 0.0)
        own = (beta * granted).sum(axis=1)
        loss[rows, x] = np.where(real[:, j], own, loss[rows, x])
    return loss


def _step_at(spots: np.ndarray, live: np.ndarray, step: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Per candidate: how the speed of pCPU `where` changed (0 when its load did not)."""
    changed: np.ndarray = np.where(live & (spots == where[:, None]), step, 0.0).sum(axis=1)
    return changed
