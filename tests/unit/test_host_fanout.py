"""Hosts worked on at once: outcomes in the hosts' order, one host's failure its own, the
limit on hosts in flight held, and one host after another in the caller's thread at limit 1."""

from __future__ import annotations

import threading

import pytest

from vmplacer.app.host_fanout import for_each_host


def test_outcomes_come_back_in_the_hosts_order_with_each_failure_its_own():
    def work(host: str) -> str:
        if host == "h2":
            raise RuntimeError("h2 does not answer")
        return host.upper()

    outcomes = for_each_host(["h3", "h1", "h2", "h0"], work, limit=3)
    assert [o.host for o in outcomes] == ["h3", "h1", "h2", "h0"]
    assert [o.result for o in outcomes] == ["H3", "H1", None, "H0"]
    assert str(outcomes[2].error) == "h2 does not answer"
    assert all(o.error is None for i, o in enumerate(outcomes) if i != 2)


@pytest.mark.parametrize("limit", [2, 3])
def test_never_more_hosts_in_flight_than_the_limit_and_that_many_together(limit):
    # Each host waits at a barrier of `limit` parties: the round only finishes if `limit` hosts
    # run together, and the counter shows none beyond them.
    gate = threading.Barrier(limit, timeout=30)
    lock = threading.Lock()
    flight = {"now": 0, "most": 0}

    def work(host: str) -> str:
        with lock:
            flight["now"] += 1
            flight["most"] = max(flight["most"], flight["now"])
        gate.wait()
        with lock:
            flight["now"] -= 1
        return host

    outcomes = for_each_host([f"h{i}" for i in range(limit * 3)], work, limit=limit)
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    assert flight["most"] == limit


def test_limit_one_runs_in_the_callers_thread_one_host_after_another_with_a_heartbeat_each():
    threads, beats = [], []

    def work(host: str) -> str:
        threads.append(threading.current_thread())
        return host

    for_each_host(["a", "b", "c"], work, limit=1, heartbeat=lambda: beats.append(len(threads)))
    assert threads == [threading.current_thread()] * 3
    assert beats == [1, 2, 3]


def test_the_heartbeat_beats_while_hosts_are_still_working():
    release = threading.Event()
    beats: list[int] = []

    def beat() -> None:
        beats.append(1)
        if len(beats) >= 3:
            release.set()

    def work(host: str) -> str:
        assert release.wait(30), "the caller's heartbeat never ran while hosts worked"
        return host

    outcomes = for_each_host(["a", "b"], work, limit=2, heartbeat=beat, heartbeat_s=0.01)
    assert [o.result for o in outcomes] == ["a", "b"]
    assert len(beats) >= 3


def test_a_host_named_twice_or_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="names one twice"):
        for_each_host(["a", "a"], str, limit=2)
    with pytest.raises(ValueError, match="at least 1"):
        for_each_host(["a"], str, limit=0)
