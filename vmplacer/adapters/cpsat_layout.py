"""The exact layout solver: a LayoutProblem as an OR-Tools CP-SAT model.

Booleans x[i, s] put item i on slot s. A pair's interference is a sum of
per-level increments, so each pair gets one boolean per level, "together at
this level", tied to the items' level groups by linear constraints (only the
direction the objective pushes against needs one). Each guest's performance is
an integer-scaled affine expression; the concave utility is the minimum of its
tangents (exact at the tangent points, above it in between — so the solver's
bound stays a bound). One worker and a deterministic time limit: the same
problem gives the same answer on any machine load. A problem that allows a
time-shared pCPU is solved as several plain ones (core.rebalance.layout_sharing).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from vmplacer.core.rebalance.layout_problem import FEASIBLE, OPTIMAL, UNKNOWN, LayoutProblem, LayoutSolution
from vmplacer.core.rebalance.layout_sharing import sharing_groups, solve_time_shared, without_sharing

SCALE = 100_000  # performance units per 1.0 (one guest at full speed)
SLOPE = 1_000  # resolution of the tangents' slopes
TANGENTS = tuple(i / 10 for i in range(11))  # points of the utility's tangents, p in [0, 1]


class CpSatLayoutSolver:
    """LayoutSolver over CP-SAT (ortools), warm-started from the problem's hint."""

    name = "cp-sat"

    def __init__(self, workers: int = 1, seed: int = 0):
        self.workers = workers
        self.seed = seed

    def solve(self, problem: LayoutProblem, *, time_limit_s: float) -> LayoutSolution | None:
        """The best layout; with a time-shared slot allowed, as the best of plain problems (core.rebalance.layout_sharing)."""
        if problem.max_shared and sharing_groups(problem):
            return solve_time_shared(problem, self._solve, time_limit_s)
        found = self._solve(without_sharing(problem), time_limit_s)
        return None if found is None or found.status == UNKNOWN else found

    def _solve(self, problem: LayoutProblem, time_limit_s: float) -> LayoutSolution | None:
        """A problem without time sharing; None when it has no layout, UNKNOWN when none was found in time."""
        # Imported here, not with the module: ortools (with the pandas it pulls in) is most of a
        # command's start-up, and only a layout search needs it (not `apply`, `plans`, `serve`).
        from ortools.sat.python import cp_model

        began = time.perf_counter()
        model = cp_model.CpModel()
        n_items, n_slots, n_guests = problem.n_items, problem.n_slots, len(problem.guests)
        x: dict[tuple[int, int], cp_model.IntVar] = {}
        for i in range(n_items):
            domain: list[int] = np.flatnonzero(problem.allowed[i]).tolist()
            if not domain:
                return None
            for s in domain:
                x[i, s] = model.new_bool_var(f"x{i}_{s}")
            model.add_exactly_one(x[i, s] for s in domain)
        self._capacity(model, problem, x)
        self._rules(model, problem, x)
        for a, b in problem.same_slot:  # time-sharing partners: one pCPU
            for s in range(n_slots):
                va, vb = x.get((a, s)), x.get((b, s))
                if va is not None and vb is not None:
                    model.add(va == vb)
                elif va is not None or vb is not None:
                    model.add((va if va is not None else vb) == 0)

        perf = [_scaled(problem.base[g]) for g in range(n_guests)]
        terms: list[list[tuple[int, cp_model.IntVar]]] = [[] for _ in range(n_guests)]
        for (i, s), var in x.items():
            for g in np.flatnonzero(problem.unary[i, s]).tolist():
                terms[g].append((_scaled(problem.unary[i, s, g]), var))
        self._pairs(model, problem, x, terms, perf)

        objective = []
        for g in range(n_guests):
            if not terms[g] and problem.floor[g] == -math.inf:
                continue  # constant: changes nothing
            low = perf[g] + sum(min(c, 0) for c, _ in terms[g])
            high = perf[g] + sum(max(c, 0) for c, _ in terms[g])
            affine = model.new_int_var(low, high, f"a{g}")
            model.add(affine == perf[g] + sum(c * v for c, v in terms[g]))
            p = affine
            if low < 0:  # the search never predicts less than nothing
                p = model.new_int_var(0, max(high, 0), f"p{g}")
                model.add_max_equality(p, [affine, 0])
                low = 0
            if problem.floor[g] > -math.inf:
                model.add(p >= math.ceil(problem.floor[g] * SCALE) - 1)
            weight = max(1, round(problem.weight[g] * 1000))
            if problem.fairness > 0:
                u = model.new_int_var(min(low, 0) * 2 - SCALE, high, f"u{g}")
                for point in TANGENTS:
                    value = point - problem.fairness * (1 - point) ** 2
                    slope = 1 + 2 * problem.fairness * (1 - point)
                    intercept = value - slope * point
                    model.add(SLOPE * u <= round(SLOPE * SCALE * intercept) + round(SLOPE * slope) * p)
                model.add(u <= p)  # above p = 1 the utility is p itself
                objective.append(weight * u)
            else:
                objective.append(weight * p)
        moved = self._moves(model, problem, x)
        for cost, moved_var in moved.values():
            objective.append(-round(1000 * cost * SCALE) * moved_var)
        model.maximize(sum(objective))
        if problem.above > -math.inf:  # only layouts better than one known: a smaller search
            slack = 1e-4 * (n_guests + 1)  # the rounding of scaled coefficients, as in the bound below
            model.add(sum(objective) >= math.floor(
                1000 * SCALE * (problem.above - slack - _constant(problem, terms, perf))))
        if problem.hint is not None:
            for (i, s), var in x.items():
                model.add_hint(var, int(problem.hint[i] == s))

        solver = cp_model.CpSolver()
        solver.parameters.num_workers = self.workers
        solver.parameters.random_seed = self.seed
        solver.parameters.max_deterministic_time = max(0.01, time_limit_s)
        # a safety net only: the deterministic limit rules, so a loaded machine changes no answer
        solver.parameters.max_time_in_seconds = max(1.0, 10 * time_limit_s)
        status = solver.solve(model)
        if status == cp_model.UNKNOWN:
            return LayoutSolution((), -math.inf, UNKNOWN, math.inf, time.perf_counter() - began, self.name,
                                  work=solver.deterministic_time)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        assignment = tuple(int(next(s for s in np.flatnonzero(problem.allowed[i]) if solver.value(x[i, int(s)])))
                           for i in range(n_items))
        exact = problem.objective(assignment)
        # The model's objective is the problem's (tangents bound the utility from above) up to rounding.
        bound = solver.best_objective_bound / (1000 * SCALE) + _constant(problem, terms, perf) + 1e-4 * (n_guests + 1)
        return LayoutSolution(
            assignment=assignment, objective=exact,
            status=OPTIMAL if status == cp_model.OPTIMAL else FEASIBLE,
            bound=max(bound, exact), seconds=time.perf_counter() - began, solver=self.name,
            notes={"branches": float(solver.num_branches)}, work=solver.deterministic_time,
        )

    # ----- constraints ------------------------------------------------------------------------
    @staticmethod
    def _capacity(model, problem: LayoutProblem, x) -> None:
        for s in range(problem.n_slots):
            users = [(i, var) for (i, t), var in x.items() if t == s]
            if len(users) < 2 and all(problem.item_load[i] <= problem.capacity[s] + 1e-9 for i, _ in users):
                continue
            units = [(round(problem.item_load[i] * 1000), var) for i, var in users]
            model.add(sum(u * v for u, v in units) <= math.floor(problem.capacity[s] * 1000 + 1e-6))

    @staticmethod
    def _rules(model, problem: LayoutProblem, x) -> None:
        by_slot: dict[int, list[tuple[int, Any]]] = {}
        for (i, s), var in x.items():
            by_slot.setdefault(s, []).append((i, var))
        if problem.exclusive is not None:
            for (i, s), var in x.items():
                if problem.exclusive[i]:
                    others = [v for j, v in by_slot[s] if j != i]
                    if others:
                        model.add(sum(others) == 0).only_enforce_if(var)
        if problem.isolate is not None and problem.core_group is not None:
            for (i, s), var in x.items():
                if problem.isolate[i]:
                    core = problem.core_group[s]
                    others = [v for (j, t), v in x.items() if j != i and problem.core_group[t] == core]
                    if others:
                        model.add(sum(others) == 0).only_enforce_if(var)
        if problem.slot_host is not None:
            hosts = sorted(set(problem.slot_host.tolist()))
            if len(hosts) > 1:
                for g in range(len(problem.guests)):
                    mine = np.flatnonzero(problem.item_guest == g)
                    if len(mine) < 2:
                        continue
                    for h in hosts:
                        on = [[v for (j, s), v in x.items() if j == i and problem.slot_host[s] == h] for i in mine]
                        for here, there in zip(on, on[1:]):
                            model.add(sum(here) == sum(there))
        if problem.apart and problem.node_group is not None:
            for a, b in problem.apart:
                for node in set(problem.node_group.tolist()):
                    on_a = [v for (i, s), v in x.items() if problem.item_guest[i] == a and problem.node_group[s] == node]
                    on_b = [v for (i, s), v in x.items() if problem.item_guest[i] == b and problem.node_group[s] == node]
                    if on_a and on_b:
                        both = model.new_bool_var(f"apart{a}_{b}_{node}")
                        for v in on_a:
                            model.add_implication(v, both)
                        for v in on_b:
                            model.add_implication(v, both.Not())

    @staticmethod
    def _pairs(model, problem: LayoutProblem, x, terms, perf: list[int]) -> None:
        """One 'together at level' boolean per pair and level that matters."""
        for p, (a, b) in enumerate(problem.pairs):
            ga, gb = int(problem.item_guest[a]), int(problem.item_guest[b])
            for level in range(problem.levels.shape[0]):
                ca = _scaled(problem.pair_effect[p, level, 0])
                cb = _scaled(problem.pair_effect[p, level, 1])
                if ca == 0 and cb == 0:
                    continue
                groups = problem.levels[level]
                za: dict[int, list] = {}
                zb: dict[int, list] = {}
                for (i, s), var in x.items():
                    if i == a:
                        za.setdefault(int(groups[s]), []).append(var)
                    elif i == b:
                        zb.setdefault(int(groups[s]), []).append(var)
                common = set(za) & set(zb)
                if not common:
                    continue
                if len(za) == 1 and len(zb) == 1:  # always together at this level: a constant
                    perf[ga] += ca
                    perf[gb] += cb
                    continue
                e = model.new_bool_var(f"t{p}_{level}")
                if ca < 0 or cb < 0:  # being together costs: force e up when together
                    for k in common:
                        model.add(e >= sum(za[k]) + sum(zb[k]) - 1)
                if ca > 0 or cb > 0:  # being together pays: allow e only when together
                    for k, vars_a in za.items():
                        model.add(e <= 1 - sum(vars_a) + sum(zb.get(k, [])))
                if ca:
                    terms[ga].append((ca, e))
                if cb:
                    terms[gb].append((cb, e))

    @staticmethod
    def _moves(model, problem: LayoutProblem, x) -> dict[int, tuple[float, Any]]:
        """Per guest that may leave its host: its move cost and the boolean 'it left'."""
        moved: dict[int, tuple[float, Any]] = {}
        if problem.move_cost is None or problem.slot_host is None or problem.origin_host is None:
            return moved
        for g in np.flatnonzero(problem.move_cost > 0):
            away = [v for (i, s), v in x.items()
                    if problem.item_guest[i] == g and problem.slot_host[s] != problem.origin_host[g]]
            if not away:
                continue
            var = model.new_bool_var(f"moved{g}")
            for v in away:
                model.add_implication(v, var)
            moved[int(g)] = (float(problem.move_cost[g]), var)
        return moved


def _scaled(value: float) -> int:
    return int(round(float(value) * SCALE))


def _constant(problem: LayoutProblem, terms, perf: list[int]) -> float:
    """Utility of guests left out of the model (nothing moves them)."""
    total = 0.0
    for g in range(len(problem.guests)):
        if not terms[g] and problem.floor[g] == -math.inf:
            p = max(perf[g] / SCALE, 0.0)
            shortfall = max(0.0, 1.0 - p)
            total += problem.weight[g] * (p - problem.fairness * shortfall * shortfall)
    return total
