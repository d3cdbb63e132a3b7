"""The doubt of a layout change read from the changed vCPUs' lines (`core/rebalance/doubt.py`)
equals the variance summed over the whole pair arrays: per vCPU pair, the sum of its pieces'
terms and variances, before and after, counted where the summed term changes."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from tests.unit.test_rebalance_big_layouts import host_state, model
from vmplacer.core.rebalance import doubt as doubt_module
from vmplacer.core.rebalance.doubt import change_sd
from vmplacer.core.rebalance.layout import BetaTable, HostLayout


def _host(seed: int, guests: int, form: str = "additive") -> HostLayout:
    state = host_state(seed, guests=guests)
    host = HostLayout(state.hosts["h"], BetaTable(model(seed, form=form)))
    for guest in state.guests.values():
        host.add(guest, guest.placement.vcpupin)
    return host


def _whole_arrays(before: tuple, after: tuple) -> float:
    """The reference: every piece's pair terms and variances added into vCPU × vCPU arrays."""
    union: dict = {}
    sides = []
    for host, pieces in (before, after):
        keys, terms, variance = host.pair_spread(pieces)
        at = np.array([union.setdefault(k[:2], len(union)) for k in keys], dtype=np.int64)
        sides.append((at, terms, variance))
    n = len(union)
    delta, spread = np.zeros((n, n)), np.zeros((n, n))
    for (at, terms, variance), sign in zip(sides, (-1.0, 1.0)):
        rows, cols = np.meshgrid(at, at, indexing="ij")
        np.add.at(delta, (rows, cols), sign * terms)
        np.add.at(spread, (rows, cols), variance)
    return math.sqrt(float(spread[np.abs(delta) > 1e-12].sum()))


def _moved(host: HostLayout, rng: random.Random, count: int) -> None:
    pinned = [(name, v) for name, pins in host.pins.items() for v, cpus in pins.items() if len(cpus) == 1]
    for name, vcpu in rng.sample(pinned, min(count, len(pinned))):
        pins = dict(host.pins[name])
        pins[vcpu] = frozenset({rng.choice(host.cpus)})
        host.set_pins(name, pins)


@pytest.mark.parametrize("form", ["additive", "multiplicative"])
@pytest.mark.parametrize("seed", range(10))
def test_changed_lines_equal_the_whole_arrays(seed: int, form: str, monkeypatch) -> None:
    monkeypatch.setattr(doubt_module, "LINE_CELLS", 1 + seed * 40)  # a few lines at a time, down to one
    rng = random.Random(seed)
    host = _host(seed, rng.randint(5, 14), form)
    before = (host, host.pieces())
    _moved(host, rng, rng.randint(1, 4))
    after = (host, host.pieces())
    want = _whole_arrays(before, after)
    got = change_sd([before], [after])
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_no_change_no_doubt() -> None:
    host = _host(2, 9)
    pieces = host.pieces()
    assert change_sd([(host, pieces)], [(host, pieces)]) == 0.0


def test_a_move_with_unobserved_pairs_has_doubt() -> None:
    """A move is doubted (not 0) when the pairs it changes rest on few observations."""
    for seed in range(10):
        rng = random.Random(seed)
        host = _host(seed, 10)
        before = (host, host.pieces())
        _moved(host, rng, 2)
        if change_sd([before], [(host, host.pieces())]) > 0:
            return
    pytest.fail("no move of ten had any doubt")
