"""Work on many hosts at once, at most `limit` at a time, one worker per host.

A fleet round reads, measures and profiles hosts that do not share anything but the
controller: one host's work waits on its own libvirt daemon (remote calls, a demand
window, Freeze'nSense's sleeps), so a round that visits them one after another takes
the sum of their times. Here each host is handed to one worker thread (never two at
once, so whatever a host's adapter holds is used by one thread), at most `limit`
threads run, and the results come back in the hosts' order, so whatever is built from
them reads the same as one host after another. The caller's thread keeps the round
alive meanwhile (`heartbeat`: lease renewal), at least every `heartbeat_s`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class HostOutcome(Generic[T]):
    """What one host's work gave: its result, or the exception it raised (never both)."""

    host: str
    result: T | None = None
    error: BaseException | None = None


def for_each_host(hosts: Sequence[str], work: Callable[[str], T], *, limit: int,
                  heartbeat: Callable[[], object] | None = None, heartbeat_s: float = 30.0,
                  ) -> list[HostOutcome[T]]:
    """`work(host)` for every host, at most `limit` at once, outcomes in `hosts` order.

    An exception from one host is its outcome, not the round's: the other hosts go on.
    With `limit` 1 (or one host) everything runs in the caller's thread, one host after
    another, exactly as a plain loop would: what is not safe to call from several threads
    (the lab's simulator, one clock and one random stream) stays correct that way.
    """
    if len(set(hosts)) != len(hosts):
        raise ValueError("each host is worked on once: the list names one twice")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if limit == 1 or len(hosts) <= 1:
        return [_run_one(host, work, heartbeat) for host in hosts]
    outcomes: dict[str, HostOutcome[T]] = {}
    waiting = iter(hosts)
    # at most `limit` hosts submitted at a time: waiting on them stays O(limit) however many hosts
    with ThreadPoolExecutor(max_workers=min(limit, len(hosts)), thread_name_prefix="vmplacer-host") as pool:
        running = {pool.submit(work, host): host for host in itertools.islice(waiting, limit)}
        while running:
            done, _ = wait(running, timeout=max(heartbeat_s, 0.01), return_when=FIRST_COMPLETED)
            for future in done:
                host = running.pop(future)
                outcomes[host] = _outcome(host, future)
                following = next(waiting, None)
                if following is not None:
                    running[pool.submit(work, following)] = following
            if heartbeat is not None:
                heartbeat()
    return [outcomes[host] for host in hosts]


def _run_one(host: str, work: Callable[[str], T], heartbeat: Callable[[], object] | None) -> HostOutcome[T]:
    try:
        outcome: HostOutcome[T] = HostOutcome(host, result=work(host))
    except Exception as exc:  # noqa: BLE001 - one host's failure is that host's outcome
        outcome = HostOutcome(host, error=exc)
    if heartbeat is not None:
        heartbeat()
    return outcome


def _outcome(host: str, future: Future[T]) -> HostOutcome[T]:
    error = future.exception()
    if error is not None:
        if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: the round stops
            raise error
        return HostOutcome(host, error=error)
    return HostOutcome(host, result=future.result())
