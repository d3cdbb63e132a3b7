"""Exclusive pCPU claims hold in the database itself, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.ports import ClaimConflict


def _dedicated(guest: str, cpus: list[int]) -> Placement:
    return Placement(
        guest=guest, host="h1", vcpupin={i: frozenset({c}) for i, c in enumerate(cpus)},
        memory_nodes=frozenset({0}), memory_kib=65536, dedicated=True, exclusive_cpus=frozenset(cpus),
    )


@pytest.fixture
def store(sessions):
    return SqlPlacementStore(sessions)


def test_overlapping_claim_is_refused_and_leaves_nothing(store):
    store.record("h1", "qemu:///system", _dedicated("a", [0, 1]), {"name": "a"})
    with pytest.raises(ClaimConflict, match="guest b"):
        store.record("h1", "qemu:///system", _dedicated("b", [1, 2]), {"name": "b"})
    assert store.get("b") is None  # no half-written row
    assert store.get("a")["claims"] == [0, 1]
    store.record("h1", "qemu:///system", _dedicated("b", [2, 3]), {"name": "b"})
    assert [p.guest for p in store.occupied("h1")] == ["a", "b"]


def test_same_cpu_on_another_host_is_fine_and_forget_frees(store):
    store.record("h1", "qemu:///system", _dedicated("a", [0]), {})
    other = _dedicated("c", [0])
    other = Placement(**{**other.__dict__, "host": "h2"})
    store.record("h2", "qemu+tcp://127.0.0.1:16510/system", other, {})
    with pytest.raises(ClaimConflict):
        store.record("h1", "qemu:///system", _dedicated("d", [0]), {})
    store.forget("a")
    store.record("h1", "qemu:///system", _dedicated("d", [0]), {})
    assert store.get("d")["claims"] == [0]


def test_duplicate_guest_name_is_a_conflict(store):
    store.record("h1", "qemu:///system", _dedicated("a", [0]), {})
    with pytest.raises(ClaimConflict):
        store.record("h1", "qemu:///system", _dedicated("a", [5]), {})
