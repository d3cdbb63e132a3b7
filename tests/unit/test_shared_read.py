"""A shared read never hands a caller a result read before it called, and callers that
arrive together share one read."""

from __future__ import annotations

import threading

import pytest

from vmplacer.adapters.shared_read import SharedRead

WAIT_S = 10.0


class _Reads:
    """A load whose reads block until released one by one; counts them."""

    def __init__(self) -> None:
        self.started = 0
        self.release = [threading.Event() for _ in range(8)]
        self.running = [threading.Event() for _ in range(8)]
        self.fail_at: int | None = None

    def __call__(self) -> int:
        self.started += 1
        number = self.started
        self.running[number].set()
        assert self.release[number].wait(WAIT_S)
        if number == self.fail_at:
            raise RuntimeError(f"read {number} failed")
        return number


def _call(read: SharedRead[int], results: list) -> threading.Thread:  # type: ignore[type-arg]
    def run() -> None:
        try:
            results.append(read.get())
        except RuntimeError as exc:
            results.append(str(exc))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_callers_during_a_read_get_the_next_one_and_share_it():
    reads = _Reads()
    read = SharedRead(reads)
    first: list[int] = []
    later: list[int] = []
    a = _call(read, first)
    assert reads.running[1].wait(WAIT_S)
    waiting = [_call(read, later) for _ in range(5)]  # arrive while read 1 runs: it began too early for them
    reads.release[1].set()
    a.join(WAIT_S)
    assert first == [1]
    assert reads.running[2].wait(WAIT_S)
    reads.release[2].set()
    for thread in waiting:
        thread.join(WAIT_S)
    assert later == [2] * 5  # all five shared read 2
    assert reads.started == 2


def test_a_caller_alone_reads_at_once():
    reads = _Reads()
    for number in (1, 2, 3):
        reads.release[number].set()
    read = SharedRead(reads)
    assert [read.get(), read.get(), read.get()] == [1, 2, 3]


def test_a_failed_read_fails_every_caller_sharing_it_and_the_next_read_is_fresh():
    reads = _Reads()
    reads.fail_at = 2
    read = SharedRead(reads)
    first: list = []
    later: list = []
    a = _call(read, first)
    assert reads.running[1].wait(WAIT_S)
    waiting = [_call(read, later) for _ in range(3)]
    reads.release[1].set()
    a.join(WAIT_S)
    assert reads.running[2].wait(WAIT_S)
    reads.release[2].set()
    for thread in waiting:
        thread.join(WAIT_S)
    assert later == ["read 2 failed"] * 3
    reads.release[3].set()
    assert read.get() == 3


def test_an_error_is_raised_to_a_caller_alone():
    def load() -> int:
        raise ValueError("unreadable")

    with pytest.raises(ValueError, match="unreadable"):
        SharedRead(load).get()
