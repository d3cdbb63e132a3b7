"""Time sharing in exact layouts: one time-shared pCPU, by trying each group that could share it.

On a full host where a sibling costs a guest more than half a pCPU, heavy
guests do better time-sharing one pCPU and leaving its sibling idle. Modelled
directly, the share factors multiply the pair terms (f_a·f_b·together), and the
model's relaxation becomes so weak that CP-SAT needed 16 s to prove an 8-guest
host it proves in 0.07 s without time sharing. With the partners fixed, the
factors are constants: "these k items share one pCPU" is a plain layout problem
(no time sharing, scaled coefficients, the group bound to one slot) that
solves as fast as the problem without sharing. So the space "at most one
time-shared pCPU, at most `share_group` items on it" is solved exactly as the
best of 1 + (candidate groups) plain problems. Interchangeable items (one-vCPU
guests with identical terms) make identical groups, tried once; a group whose
fused problem cannot beat the best layout so far (by a bound that costs
nothing) is skipped. Groups are tried best ceiling first, at most `MAX_GROUPS` of them
(a 16-guest host has hundreds); with any left untried the answer is only "feasible".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from vmplacer.core.rebalance.layout_problem import FEASIBLE, OPTIMAL, UNKNOWN, LayoutProblem, LayoutSolution, utility

MAX_GROUPS = 144  # plain problems solved per time-shared layout problem (each costs a model build)

PlainSolve = Callable[[LayoutProblem, float], "LayoutSolution | None"]


def without_sharing(problem: LayoutProblem) -> LayoutProblem:
    """The same problem with no time-shared slot."""
    return replace(problem, max_shared=0, shareable=None)


def interchangeable(problem: LayoutProblem) -> np.ndarray:
    """[I] class id per item: items whose swap maps the problem onto itself (one-item guests with
    the same terms everywhere), so one group of each kind of partners is enough."""
    n = problem.n_items
    label = np.arange(n)
    alone = np.bincount(problem.item_guest, minlength=len(problem.guests)) == 1
    apart = {g for pair in problem.apart for g in pair}
    effect = {}
    for p, (a, b) in enumerate(problem.pairs):
        effect[int(a), int(b)] = problem.pair_effect[p]
        effect[int(b), int(a)] = problem.pair_effect[p][:, ::-1]

    def guest_terms(i: int) -> tuple:
        g = int(problem.item_guest[i])
        return (problem.item_load[i], problem.weight[g], problem.floor[g], problem.base[g],
                None if problem.item_time is None else problem.item_time[i],
                None if problem.move_cost is None else problem.move_cost[g],
                None if problem.origin_host is None else problem.origin_host[g],
                None if problem.exclusive is None else bool(problem.exclusive[i]),
                None if problem.isolate is None else bool(problem.isolate[i]))

    def same(i: int, j: int) -> bool:
        gi, gj = int(problem.item_guest[i]), int(problem.item_guest[j])
        if not (alone[gi] and alone[gj]) or gi in apart or gj in apart:
            return False
        if guest_terms(i) != guest_terms(j) or not np.array_equal(problem.allowed[i], problem.allowed[j]):
            return False
        others = [g for g in range(len(problem.guests)) if g not in (gi, gj)]
        if not (np.array_equal(problem.unary[i][:, others], problem.unary[j][:, others])
                and np.array_equal(problem.unary[i][:, gi], problem.unary[j][:, gj])
                and not problem.unary[i][:, gj].any() and not problem.unary[j][:, gi].any()):
            return False
        zero = np.zeros((problem.levels.shape[0], 2))
        for k in range(n):
            if k in (i, j):
                continue
            if not np.array_equal(effect.get((i, k), zero), effect.get((j, k), zero)):
                return False
        return np.array_equal(effect.get((i, j), zero), effect.get((j, i), zero))

    for j in range(n):
        for i in range(j):
            if label[i] == i and same(i, j):
                label[j] = i
                break
    return label


def sharing_groups(problem: LayoutProblem) -> list[tuple[int, ...]]:
    """Item groups that may time-share one slot (2 … share_group items of equal load above half a
    pCPU, with a shareable slot all may take), one per kind of group (interchangeable items)."""
    items = [int(i) for i in np.flatnonzero(problem.sharing_items())]
    if len(items) < 2:
        return []
    label = interchangeable(problem)
    seen: set[tuple[int, ...]] = set()
    result = []
    for size in range(2, min(problem.share_group, len(items)) + 1):
        for group in itertools.combinations(items, size):
            loads = problem.item_load[list(group)]
            if float(np.ptp(loads)) > 1e-9:
                continue
            kind = tuple(sorted(int(label[i]) for i in group))
            if kind in seen:
                continue
            if not np.logical_and.reduce([problem.allowed[i] for i in group] + [problem.shareable]).any():
                continue
            seen.add(kind)
            result.append(group)
    return result


def fused(problem: LayoutProblem, group: tuple[int, ...]) -> LayoutProblem:
    """"These items time-share one pCPU" as a plain problem: for every assignment with the group
    on one shareable slot (and no other sharing), its objective is the original problem's."""
    members = list(group)
    share = np.ones(problem.n_items)
    share[members] = 1.0 / problem.item_load[members].sum()  # equal loads: 1/k each
    base = problem.base.copy()
    if problem.item_time is not None:
        for i in members:
            base[problem.item_guest[i]] -= (1.0 - share[i]) * problem.item_time[i]
    pair_effect = problem.pair_effect
    if len(problem.pairs):
        both = share[problem.pairs[:, 0]] * share[problem.pairs[:, 1]]
        pair_effect = pair_effect * both[:, None, None]
    allowed = problem.allowed.copy()
    together = np.logical_and.reduce([allowed[i] for i in members] + [problem.shareable])
    allowed[members] = together
    load = problem.item_load.copy()
    load[members] = 1.0 / len(members)  # together they fill the slot's time; nothing else fits beside them
    hint = problem.hint
    if hint is not None and (len({int(hint[i]) for i in members}) > 1 or not together[hint[members[0]]]):
        hint = None
    return replace(problem, base=base, unary=problem.unary * share[:, None, None], pair_effect=pair_effect,
                   allowed=allowed, item_load=load, shareable=None, max_shared=0, item_time=None,
                   same_slot=tuple(zip(members, members[1:])), hint=hint)


def upper_bound(problem: LayoutProblem) -> float:
    """No assignment scores above this: each guest at its best terms taken one by one."""
    high = problem.base.copy()
    if problem.n_items:
        high += np.maximum(problem.unary, 0.0).max(axis=1).sum(axis=0)
    if len(problem.pairs):
        gain = np.maximum(problem.pair_effect, 0.0).sum(axis=1)  # [P, 2]
        np.add.at(high, problem.item_guest[problem.pairs[:, 0]], gain[:, 0])
        np.add.at(high, problem.item_guest[problem.pairs[:, 1]], gain[:, 1])
    return float((problem.weight * utility(np.maximum(high, 0.0), problem.fairness)).sum())


def solve_time_shared(problem: LayoutProblem, solve_plain: PlainSolve, time_limit_s: float) -> LayoutSolution | None:
    """The best layout with at most `problem.max_shared` (0 or 1) time-shared slots.

    `solve_plain` solves a problem without time sharing within a time limit; it
    returns None when the problem has no layout (scoring above `problem.above`),
    and a solution with status UNKNOWN when it found none in time.
    """
    if problem.max_shared > 1:
        raise ValueError("exact layouts time-share at most one pCPU")
    # the most promising groups first (highest ceiling): once one ceiling is below the best, all are
    room = float(problem.capacity.sum())
    groups = [g for g in sharing_groups(problem)  # those that leave the other items room to fit
              if problem.item_load.sum() - problem.item_load[list(g)].sum() + 1.0 <= room + 1e-9]
    candidates = sorted(((upper_bound(sub), k, sub) for k, sub in enumerate(fused(problem, g) for g in groups)),
                        key=lambda c: (-c[0], c[1]))
    each = time_limit_s / 2 / max(1, min(len(candidates), MAX_GROUPS))  # half for no time sharing
    results = [solve_plain(without_sharing(problem), time_limit_s / 2)]
    best = results[0] if results[0] is not None and results[0].status != UNKNOWN else None
    bounds = [results[0].bound] if results[0] is not None else []
    skipped = 0
    for ceiling, _, sub in candidates:
        if best is not None and ceiling <= best.objective + 1e-9:
            bounds.append(ceiling)
            skipped += 1
            continue
        if len(results) > MAX_GROUPS:  # the rest unsolved: their ceilings bound them
            bounds.append(ceiling)
            results.append(LayoutSolution((), -math.inf, UNKNOWN, ceiling))
            continue
        if best is not None:
            sub = replace(sub, above=best.objective)  # only a better layout matters: most are refuted at once
        found = solve_plain(sub, each)
        results.append(found)
        if found is None:  # no layout (above the best so far)
            if best is not None:
                bounds.append(best.objective)
            continue
        bounds.append(min(found.bound, ceiling))
        if found.status != UNKNOWN and (best is None or found.objective > best.objective + 1e-12):
            best = found
    if best is None:
        return None
    proven = all(r is None or r.status == OPTIMAL for r in results)
    bound = max(bounds, default=-math.inf)
    return LayoutSolution(
        assignment=best.assignment, objective=problem.objective(best.assignment),
        status=OPTIMAL if proven else FEASIBLE, bound=max(bound, best.objective),
        seconds=sum(r.seconds for r in results if r is not None), solver=best.solver,
        work=None if any(r is not None and r.work is None for r in results) else
        sum(r.work or 0.0 for r in results if r is not None),
        notes={**best.notes, "shared_groups_tried": float(sum(1 for r in results[1:] if r is None or r.assignment)),
               "shared_groups_skipped": float(skipped)},
    )
