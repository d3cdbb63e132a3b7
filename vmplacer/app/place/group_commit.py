"""Group commit: placements on one host that arrive together are placed as one batch.

Each placement on a host reads the host (libvirt's domains, the store's records) and
commits twice (the claim, then the state). Under concurrent requests that work is done
once per batch instead: a caller that finds no batch running on its host becomes the
leader and places every placement queued so far (its own included) in one go; callers
that arrive meanwhile wait for it and are taken, together, by the next leader. There
is no collection window: an idle host places a lone request at once, and a busy host
batches exactly what queued while the previous batch ran ("natural batching").

A batch of one is the lone placement; a batch never exceeds MAX_BATCH, so a burst is
placed in several rounds and no caller waits behind an unbounded batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

MAX_BATCH = 64

T = TypeVar("T")


@dataclass
class _Lane(Generic[T]):
    """One host's queue: what waits, and whether a leader is placing a batch now."""

    ready: threading.Condition = field(default_factory=threading.Condition)
    waiting: list[T] = field(default_factory=list)
    busy: bool = False


class GroupCommit(Generic[T]):
    """Per-key (host) batching of work items among the threads that submit them.

    `run(key, batch)` must settle every item of `batch` (record its result or its error on
    the item) and `done(item)` must say whether it was settled: an item `run` left unsettled
    (it raised) is failed with that exception by `submit`."""

    def __init__(self, run: Callable[[str, list[T]], None], done: Callable[[T], bool],
                 fail: Callable[[T, BaseException], None], max_batch: int = MAX_BATCH):
        self._run = run
        self._done = done
        self._fail = fail
        self._max_batch = max_batch
        self._lanes: dict[str, _Lane[T]] = {}
        self._guard = threading.Lock()
        self.batches: list[int] = []  # sizes of the last batches run (newest last), for tests and metrics

    def _lane(self, key: str) -> _Lane[T]:
        with self._guard:
            return self._lanes.setdefault(key, _Lane())

    def busy(self, key: str) -> bool:
        """Whether a batch runs on `key` now."""
        lane = self._lane(key)
        with lane.ready:
            return lane.busy

    def queued(self, key: str) -> int:
        """How many items wait on `key` for the next batch (not those of the batch running)."""
        lane = self._lane(key)
        with lane.ready:
            return len(lane.waiting)

    def submit(self, key: str, item: T) -> None:
        """Queue `item` on `key` and return once it is settled, by this thread's batch or another's.
        Batches are taken in arrival order; a leader whose item is behind a full batch places that
        one, then the next."""
        lane = self._lane(key)
        with lane.ready:
            lane.waiting.append(item)
        while True:
            with lane.ready:
                while lane.busy and not self._done(item):
                    lane.ready.wait()
                if self._done(item):
                    return
                lane.busy = True
                batch, lane.waiting = lane.waiting[:self._max_batch], lane.waiting[self._max_batch:]
            try:
                self._run(key, batch)
                left: BaseException = RuntimeError(f"{key}: a batch left an item without an answer")
            except BaseException as exc:  # noqa: BLE001 - each caller gets it as its own answer
                left = exc
            try:
                for queued in batch:
                    if not self._done(queued):
                        self._fail(queued, left)
            finally:
                with lane.ready:
                    lane.busy = False
                    self.batches = [*self.batches[-99:], len(batch)]
                    lane.ready.notify_all()
