"""The vCPU → pCPU assignment with pairwise interference, as data an exact solver can take.

The rebalancer's objective on a small host (or a few small hosts) is a
quadratic assignment: each movable vCPU ("item") goes to one pCPU ("slot");
every guest's predicted performance is

    p_g = max(0, base_g + Σ_i [f_i·unary[i, s_i, g] − (1 − f_i)·time_i]
                          + Σ_pairs f_a·f_b·Σ_levels together · pair[p, level, side])

where f_i is the share of its time item i gets: 1 while no pCPU is asked for
more than its time; for k items of equal load time-sharing one pCPU no other
guest is pinned to (a "shareable" slot), 1/(k·load_i) — throughput divided, no
extra loss, as the search's what-if and the simulator have it. Time sharing
cuts an item's own work and, as much, what it suffers from and causes to its
neighbours, so heavy guests may do better on one pCPU than on two siblings.
With no time sharing p_g is affine in the assignment. `together` at a level
means both items' slots are in one group of that level: levels are the
topology's nested groups (pCPU ⊂ core ⊂ L2 ⊂ LLC ⊂ node ⊂ host), so the
interference of a pair is a sum of per-level increments. The objective is
Σ_g w_g·u(p_g) − migration costs, with u(p) = p − φ·max(0, 1 − p)² (concave).

This module holds the problem, its exact objective and feasibility, and a
brute-force solver for tiny problems (tests, checks); a real solver sits
behind `LayoutSolver` outside the core.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

OPTIMAL = "optimal"
FEASIBLE = "feasible"
UNKNOWN = "unknown"  # no layout found in time (a plain solve inside a larger one; never returned to callers)


@dataclass(frozen=True, eq=False)
class LayoutProblem:
    """Items (single-pCPU vCPUs) to place on slots (pCPUs), and what each placement does.

    Shapes: I items, S slots, G guests, P item pairs, L levels.
    """

    guests: tuple[str, ...]  # G
    items: tuple[tuple[str, int], ...]  # I: (guest, vCPU)
    slots: tuple[tuple[str, int], ...]  # S: (host, pCPU)
    item_guest: np.ndarray  # [I] guest index
    allowed: np.ndarray  # [I, S] bool
    item_load: np.ndarray  # [I]
    capacity: np.ndarray  # [S] time left for items on each slot
    base: np.ndarray  # [G] p_g with no item anywhere (items' own guests: their full share)
    unary: np.ndarray  # [I, S, G] change of p_g when item i sits on slot s
    levels: np.ndarray  # [L, S] group id of each slot per level, finest first
    pairs: np.ndarray  # [P, 2] item indexes (different guests)
    pair_effect: np.ndarray  # [P, L, 2] change of p of the first / second item's guest when together at a level
    weight: np.ndarray  # [G]
    floor: np.ndarray  # [G] p_g may not drop below (−inf: no floor)
    fairness: float = 0.0
    exclusive: np.ndarray | None = None  # [I] bool: nothing else on its slot
    isolate: np.ndarray | None = None  # [I] bool: no other item in its core group
    core_group: np.ndarray | None = None  # [S]
    node_group: np.ndarray | None = None  # [S]
    apart: tuple[tuple[int, int], ...] = ()  # guest pairs that may not share a node group
    slot_host: np.ndarray | None = None  # [S] host index
    origin_host: np.ndarray | None = None  # [G] host index now (−1: no items)
    move_cost: np.ndarray | None = None  # [G] objective paid when the guest's items leave its host
    hint: np.ndarray | None = None  # [I] slot per item (a known good layout)
    shareable: np.ndarray | None = None  # [S] bool: items of equal load may time-share it (None: none)
    item_time: np.ndarray | None = None  # [I] p of the item's guest per unit of the item's time (load / ideal)
    max_shared: int = 0  # how many slots may be time-shared (0: none; the solvers handle 0 and 1)
    share_group: int = 2  # at most this many items on a time-shared slot
    same_slot: tuple[tuple[int, int], ...] = ()  # item pairs that must sit on one slot
    above: float = -math.inf  # solvers may ignore layouts whose objective is not above this
    approximate: bool = False  # time shares of guests outside the problem may still change

    @property
    def n_items(self) -> int:
        return len(self.items)

    @property
    def n_slots(self) -> int:
        return len(self.slots)

    # ----- evaluation ---------------------------------------------------------------------
    def time_share(self, assignment: Sequence[int]) -> np.ndarray:
        """[I] share of its time each item gets: its pCPU's time divided as the what-if divides it."""
        s = np.asarray(assignment, dtype=np.int64)
        used = np.bincount(s, weights=self.item_load, minlength=self.n_slots)
        asked = 1.0 - self.capacity + used  # pinned guests outside the problem + items
        return np.minimum(1.0, 1.0 / np.maximum(asked[s], 1e-12))

    def performance(self, assignment: Sequence[int]) -> np.ndarray:
        """p_g of every guest for `assignment` (item → slot); never below 0 (as the search has it)."""
        s = np.asarray(assignment, dtype=np.int64)
        p = self.base.copy()
        share = self.time_share(s) if self.n_items else np.ones(0)
        if self.n_items:
            p += (self.unary[np.arange(self.n_items), s] * share[:, None]).sum(axis=0)
            if self.item_time is not None:
                np.add.at(p, self.item_guest, (share - 1.0) * self.item_time)
        if len(self.pairs):
            a, b = s[self.pairs[:, 0]], s[self.pairs[:, 1]]
            together = self.levels[:, a] == self.levels[:, b]  # [L, P]
            both = share[self.pairs[:, 0]] * share[self.pairs[:, 1]]
            first = (self.pair_effect[:, :, 0] * together.T).sum(axis=1) * both
            second = (self.pair_effect[:, :, 1] * together.T).sum(axis=1) * both
            np.add.at(p, self.item_guest[self.pairs[:, 0]], first)
            np.add.at(p, self.item_guest[self.pairs[:, 1]], second)
        return np.maximum(p, 0.0)

    def moved(self, assignment: Sequence[int]) -> np.ndarray:
        """[G] bool: the guest's items left its host."""
        result = np.zeros(len(self.guests), dtype=bool)
        if self.slot_host is None or self.origin_host is None:
            return result
        for item, slot in enumerate(assignment):
            g = self.item_guest[item]
            if self.slot_host[slot] != self.origin_host[g]:
                result[g] = True
        return result

    def objective(self, assignment: Sequence[int]) -> float:
        """Σ w_g·u(p_g) − migration costs: what the rebalancer maximizes."""
        value = float((self.weight * utility(self.performance(assignment), self.fairness)).sum())
        if self.move_cost is not None:
            value -= float(self.move_cost[self.moved(assignment)].sum())
        return value

    def violations(self, assignment: Sequence[int]) -> list[str]:
        """Constraints `assignment` breaks (empty: feasible)."""
        s = np.asarray(assignment, dtype=np.int64)
        problems: list[str] = []
        if s.shape != (self.n_items,):
            return [f"expected {self.n_items} slots, got {s.shape}"]
        for item, slot in enumerate(s):
            if not self.allowed[item, slot]:
                problems.append(f"{self.items[item]} may not go to {self.slots[slot]}")
        used = np.bincount(s, weights=self.item_load, minlength=self.n_slots)
        shared = 0
        for slot in np.flatnonzero(used > self.capacity + 1e-9):
            if self.time_shared(s, int(slot)):
                shared += 1
            else:
                problems.append(f"{self.slots[slot]} asked for {used[slot]:.2f} of {self.capacity[slot]:.2f}")
        if shared > self.max_shared:
            problems.append(f"{shared} time-shared pCPUs, at most {self.max_shared}")
        for a, b in self.same_slot:
            if s[a] != s[b]:
                problems.append(f"{self.items[a]} and {self.items[b]} must share one pCPU")
        if self.exclusive is not None:
            for item in np.flatnonzero(self.exclusive):
                if np.count_nonzero(s == s[item]) > 1:
                    problems.append(f"{self.items[item]} shares its dedicated {self.slots[s[item]]}")
        if self.isolate is not None and self.core_group is not None:
            for item in np.flatnonzero(self.isolate):
                core = self.core_group[s[item]]
                if np.count_nonzero(self.core_group[s] == core) > 1:
                    problems.append(f"{self.items[item]} needs its core alone (isolate)")
        if self.slot_host is not None:
            for g in range(len(self.guests)):
                hosts = {int(self.slot_host[s[i]]) for i in np.flatnonzero(self.item_guest == g)}
                if len(hosts) > 1:
                    problems.append(f"{self.guests[g]} would span hosts")
        if self.apart and self.node_group is not None:
            for a, b in self.apart:
                nodes_a = {int(self.node_group[s[i]]) for i in np.flatnonzero(self.item_guest == a)}
                nodes_b = {int(self.node_group[s[i]]) for i in np.flatnonzero(self.item_guest == b)}
                if nodes_a & nodes_b:
                    problems.append(f"{self.guests[a]} and {self.guests[b]} share a node (anti-affinity)")
        p = self.performance(s)
        for g in np.flatnonzero(p < self.floor - 1e-9):
            problems.append(f"{self.guests[g]} below its floor ({p[g]:.3f} < {self.floor[g]:.3f})")
        return problems

    def time_shared(self, assignment: np.ndarray, slot: int) -> bool:
        """The one kind of time sharing the problem allows: up to `share_group` items of equal load
        above half a pCPU (lighter ones fit without) on a shareable slot."""
        if self.max_shared < 1 or self.shareable is None or not self.shareable[slot]:
            return False
        on = np.flatnonzero(assignment == slot)
        loads = self.item_load[on]
        return 2 <= len(on) <= self.share_group and float(np.ptp(loads)) < 1e-9 and loads[0] > 0.5 + 1e-9

    def sharing_items(self) -> np.ndarray:
        """[I] bool: items that may time-share a slot (load above half a pCPU, else they fit without)."""
        if self.max_shared < 1 or self.shareable is None or not self.shareable.any():
            return np.zeros(self.n_items, dtype=bool)
        result = (self.item_load > 0.5 + 1e-9) & (self.allowed & self.shareable[None, :]).any(axis=1)
        if self.exclusive is not None:
            result &= ~self.exclusive
        return result

    def layouts(self) -> int:
        """How many assignments brute force would enumerate."""
        return math.prod(int(row.sum()) for row in self.allowed) if self.n_items else 1


@dataclass(frozen=True)
class LayoutSolution:
    """A solver's answer: the assignment, and how good it is proven to be."""

    assignment: tuple[int, ...]
    objective: float  # the problem's exact objective of `assignment`
    status: str  # optimal | feasible
    bound: float  # no assignment scores above this (the problem's objective)
    seconds: float = 0.0
    solver: str = ""
    notes: dict[str, float] = field(default_factory=dict)
    # the solver's effort in its own deterministic seconds (the same on a busy or an idle machine);
    # None when it has no such measure, and then wall seconds count
    work: float | None = None

    @property
    def spent(self) -> float:
        """What the solve takes out of a plan's solver budget: deterministic work, else wall time."""
        return self.seconds if self.work is None else self.work

    def to_dict(self) -> dict[str, object]:
        found: dict[str, object] = {"status": self.status, "objective": round(self.objective, 6),
                                    "bound": round(self.bound, 6), "seconds": round(self.seconds, 3),
                                    "solver": self.solver}
        if self.work is not None:
            found["work"] = round(self.work, 3)
        return found


class LayoutSolver(Protocol):
    """Solves a LayoutProblem within a time budget; None when it found no feasible layout."""

    def solve(self, problem: LayoutProblem, *, time_limit_s: float) -> LayoutSolution | None: ...


def utility(perf: np.ndarray, fairness: float) -> np.ndarray:
    """Each guest's term of the objective: slightly concave, so ties go to the fairer layout."""
    shortfall = np.maximum(0.0, 1.0 - perf)
    return perf - fairness * shortfall * shortfall


def brute_force(problem: LayoutProblem, limit: int = 200_000) -> LayoutSolution | None:
    """Every assignment tried (tiny problems: tests and checks of real solvers)."""
    if problem.layouts() > limit:
        raise ValueError(f"{problem.layouts()} layouts exceed the brute-force limit {limit}")
    domains = [np.flatnonzero(row) for row in problem.allowed]
    best: tuple[float, tuple[int, ...]] | None = None
    for choice in itertools.product(*domains):
        if problem.violations(choice):
            continue
        value = problem.objective(choice)
        if best is None or value > best[0] + 1e-12:
            best = (value, tuple(int(c) for c in choice))
    if best is None:
        return None
    return LayoutSolution(best[1], best[0], OPTIMAL, best[0], solver="brute-force")
