"""One read shared by the callers that want it at the same time, never older than their call.

Placing on a host reads all of its domains. Under many concurrent requests each doing
that read alone, the reads take most of the process's CPU (one Python process runs
one thread at a time). A caller here gets the result of a read that *started after it
called* — the freshness of a read of its own — but callers that arrive while one is
running share the next one: at most one read runs, and one more is waited for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SharedRead(Generic[T]):
    def __init__(self, load: Callable[[], T]):
        self._load = load
        self._changed = threading.Condition()
        self._started = 0  # reads started so far; read n is the n-th
        self._finished = 0  # number of the newest read finished
        self._running = False
        self._outcome: tuple[T | None, BaseException | None] = (None, None)

    def get(self) -> T:
        """The result of a read that started after this call (raises what that read raised)."""
        with self._changed:
            needed = self._started + 1  # the next read to start; a running one began too early
            while self._finished < needed:
                if not self._running:
                    self._running = True
                    self._started += 1
                    mine = self._started
                    break
                self._changed.wait()
            else:
                return self._result()
        value: T | None = None
        error: BaseException | None = None
        try:
            value = self._load()
        except BaseException as exc:  # handed to every caller sharing this read
            error = exc
        with self._changed:
            self._running = False
            self._finished = mine
            self._outcome = (value, error)
            self._changed.notify_all()
            return self._result()

    def _result(self) -> T:
        value, error = self._outcome
        if error is not None:
            raise error
        return value  # type: ignore[return-value]
