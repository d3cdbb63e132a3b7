"""Place the guests of one request as a batch: hardest first, then search a better order.

Placing in file order lets small guests scatter over the room a big one needed.
The batch is placed hardest first (multi-cell, whole cores, large; see `hardness`);
when a guest
still does not fit, a bounded search tries other orders (the guests that failed
moved to the front) and other host choices (a guest taking its second-best host),
and keeps the assignment placing the most guests. The budget is CPU time
(the caller passes a clock such as `time.process_time`), so the answer does not
depend on how busy the machine is, and a pass limit makes it reproducible exactly.

Pure: `fit(guest, host, earlier)` says whether a guest fits on a host after the
guests `earlier` (in placement order) were placed there; it is the caller's
allocation, deterministic for the same arguments, so answers are cached.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmplacer.core.placement.guest import GuestSpec

DEFAULT_BUDGET_S = 2.0
DEFAULT_MAX_PASSES = 400
SEED = 14  # perturbations are seeded: the same request gets the same answer


@dataclass(frozen=True)
class Fitted:
    """A guest fits on a host: its score (higher is better) and the caller's placement."""

    score: float
    payload: Any


@dataclass(frozen=True)
class Refused:
    """A guest does not fit on a host: the caller's reason (e.g. a NoFit)."""

    reason: Any


Fit = Callable[[int, int, tuple[int, ...]], "Fitted | Refused"]
# The hosts worth allocating a guest on, given what each host holds (the batch's guests on it,
# in order): most promising first. None, or no fit among them: every host is tried.
Shortlist = Callable[[int, Sequence[tuple[int, ...]]], Sequence[int]]


@dataclass
class BatchResult:
    """Per guest index: its host index and fit, or why each host refused it."""

    placed: dict[int, tuple[int, Fitted]] = field(default_factory=dict)
    refused: dict[int, dict[int, Refused]] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # the placement order that won
    passes: int = 0  # assignments tried
    greedy_placed: int = 0  # guests the first (hardest-first) pass placed

    @property
    def score(self) -> tuple[int, float]:
        return len(self.placed), sum(f.score for _, f in self.placed.values())


def hardness(spec: GuestSpec) -> tuple[bool, int, bool, int, int, int]:
    """Sort key, hardest first among the guests that hold pCPUs (dedicated or latency-critical):
    more NUMA cells, then whole cores (isolate, require), then pCPUs held (isolate counts the
    idle siblings), then size. Guests holding no pCPU go before them all: they only keep a
    shared pool, which dedicated guests placed first would leave empty."""
    exclusive = len(spec.dedicated_vcpu_set)
    cells = max(len(spec.numa_cells), spec.numa_nodes or 1)
    whole = spec.effective_thread_policy in ("isolate", "require")
    held = exclusive * (2 if spec.effective_thread_policy == "isolate" else 1)
    return (bool(exclusive), -cells, not whole, -held, -spec.vcpus, -spec.memory_mib)


def hardest_first(specs: Sequence[GuestSpec]) -> list[int]:
    """Indices of `specs`, hardest first; equal ones keep their file order."""
    return sorted(range(len(specs)), key=lambda i: (hardness(specs[i]), i))


class BatchSearch:
    def __init__(self, guests: int, hosts: int, fit: Fit, *, budget_s: float = DEFAULT_BUDGET_S,
                 max_passes: int = DEFAULT_MAX_PASSES, clock: Callable[[], float] | None = None,
                 shortlist: Shortlist | None = None):
        self.guests = guests
        self.hosts = hosts
        self._fit = fit
        self._shortlist = shortlist
        self._budget_s = budget_s
        self._max_passes = max_passes
        self._clock = clock or (lambda: 0.0)  # no clock: the pass limit alone bounds the search
        self._cache: dict[tuple[int, int, tuple[int, ...]], Fitted | Refused] = {}

    def fit(self, guest: int, host: int, earlier: tuple[int, ...]) -> Fitted | Refused:
        key = (guest, host, earlier)
        if key not in self._cache:
            self._cache[key] = self._fit(guest, host, earlier)
        return self._cache[key]

    def one_pass(self, order: Sequence[int], detour: dict[int, int] | None = None) -> BatchResult:
        """Each guest in `order` on its best-scoring host (ties: the earlier host), or on its
        `detour[guest]`-th best one; guests that fit nowhere are refused by every host."""
        detour = detour or {}
        on: list[list[int]] = [[] for _ in range(self.hosts)]
        result = BatchResult(order=list(order))
        for guest in order:
            held = [tuple(guests) for guests in on]
            fits, refusals = self._try(guest, self._shortlist(guest, held) if self._shortlist else range(self.hosts),
                                       held)
            if not fits and self._shortlist is not None:  # whether it fits somewhere is never bounded
                fits, refusals = self._try(guest, range(self.hosts), held)
            if not fits:
                result.refused[guest] = refusals
                continue
            fits.sort(key=lambda item: (item[0], item[1]))
            _, host, fitted = fits[min(detour.get(guest, 0), len(fits) - 1)]
            on[host].append(guest)
            result.placed[guest] = (host, fitted)
        return result

    def _try(self, guest: int, hosts: Iterable[int], held: Sequence[tuple[int, ...]]
             ) -> tuple[list[tuple[float, int, Fitted]], dict[int, Refused]]:
        fits: list[tuple[float, int, Fitted]] = []
        refusals: dict[int, Refused] = {}
        for host in hosts:
            answer = self.fit(guest, host, held[host])
            if isinstance(answer, Fitted):
                fits.append((-answer.score, host, answer))
            else:
                refusals[host] = answer
        return fits, refusals

    def run(self, order: Sequence[int]) -> BatchResult:
        """The first pass in `order`; while a guest is left out and budget remains, other
        orders and host choices; the assignment placing most guests (then best total score)."""
        started = self._clock()
        best = self.one_pass(order)
        best.greedy_placed = len(best.placed)
        passes = 1
        rng = random.Random(SEED)
        for order_, detour in self._alternatives(best, rng):
            if passes >= self._max_passes or not self._hopeful(best):
                break
            if self._clock() - started > self._budget_s:
                break
            tried = self.one_pass(order_, detour)
            passes += 1
            if tried.score > best.score:
                tried.greedy_placed = best.greedy_placed
                best = tried
        best.passes = passes
        return best

    def _hopeful(self, best: BatchResult) -> bool:
        """Whether another order could place more: some guest left out fits on some host
        when it is the first there (a guest that fits on no empty host never will)."""
        return any(isinstance(self.fit(guest, host, ()), Fitted)
                   for guest in best.refused for host in range(self.hosts))

    def _alternatives(self, first: BatchResult, rng: random.Random):  # type: ignore[no-untyped-def]
        """Squeaky wheel (left-out guests first), the request's own order, then one guest on
        its second-best host (each in turn), then seeded random swaps and detours."""
        order = list(first.order)
        left = [g for g in order if g in first.refused]
        promoted = left + [g for g in order if g not in first.refused]
        yield promoted, {}
        yield sorted(order), {}  # the file order: small guests first may place more of them
        for base in (order, promoted):
            for guest in base:
                yield base, {guest: 1}
        while True:
            shuffled = list(promoted)
            for _ in range(max(1, len(shuffled) // 10)):
                i, j = rng.randrange(len(shuffled)), rng.randrange(len(shuffled))
                shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
            detour = {g: rng.choice((1, 2)) for g in shuffled if rng.random() < 0.1}
            yield shuffled, detour


def place_batch(specs: Sequence[GuestSpec], hosts: int, fit: Fit, *, budget_s: float = DEFAULT_BUDGET_S,
                max_passes: int = DEFAULT_MAX_PASSES, clock: Callable[[], float] | None = None,
                order: Sequence[int] | None = None, shortlist: Shortlist | None = None) -> BatchResult:
    """Place `specs` on `hosts` hosts: hardest first (or `order`), then the bounded search;
    `shortlist` bounds the hosts each guest is allocated on (core/placement/fleet_index.py)."""
    search = BatchSearch(len(specs), hosts, fit, budget_s=budget_s, max_passes=max_passes, clock=clock,
                         shortlist=shortlist)
    return search.run(hardest_first(specs) if order is None else order)
