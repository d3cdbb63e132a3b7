"""Group commit's batching: a lone item runs at once, items that arrive while a batch runs
form the next one in arrival order (at most `max_batch`), and a batch's failure is the
answer of its own items only."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from vmplacer.app.place.group_commit import GroupCommit

WAIT_S = 30.0  # only how long a thread that never arrives is waited for before failing


@dataclass(eq=False)
class Item:
    name: str
    answer: str | None = None
    error: BaseException | None = None


class Recorder:
    """Runs batches, remembering each; the first batch waits until `release` is set."""

    def __init__(self, fail_names: frozenset[str] = frozenset(), leave: frozenset[str] = frozenset()):
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.started = threading.Event()
        self.fail_names = fail_names
        self.leave = leave

    def run(self, key: str, batch: list[Item]) -> None:
        self.batches.append([item.name for item in batch])
        self.started.set()
        assert self.release.wait(WAIT_S)
        if any(item.name in self.fail_names for item in batch):
            raise ValueError(f"{key}: refused")
        for item in batch:
            if item.name not in self.leave:
                item.answer = f"{key}:{item.name}"


def _group(recorder: Recorder, max_batch: int = 64) -> GroupCommit[Item]:
    def fail(item: Item, exc: BaseException) -> None:
        item.error = exc

    return GroupCommit(recorder.run, lambda item: item.answer is not None or item.error is not None, fail,
                       max_batch=max_batch)


def _wait_until(condition) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "an item never queued"
        time.sleep(0.001)


def _submit_in_order(group: GroupCommit[Item], recorder: Recorder, names: list[str]) -> list[Item]:
    """The first item starts a batch (held by `recorder`); the others queue in the given order."""
    items = [Item(name) for name in names]
    threads = [threading.Thread(target=group.submit, args=("h", item)) for item in items]
    threads[0].start()
    assert recorder.started.wait(WAIT_S)
    for at, thread in enumerate(threads[1:], start=1):
        thread.start()
        _wait_until(lambda at=at: group.queued("h") == at)
    recorder.release.set()
    for thread in threads:
        thread.join(WAIT_S)
    return items


def test_a_lone_item_is_run_at_once_as_a_batch_of_one():
    recorder = Recorder()
    recorder.release.set()
    group = _group(recorder)
    item = Item("a")
    group.submit("h", item)
    assert item.answer == "h:a" and recorder.batches == [["a"]] and group.batches == [1]


def test_items_arriving_while_a_batch_runs_form_the_next_batches_in_arrival_order():
    recorder = Recorder()
    group = _group(recorder, max_batch=3)
    items = _submit_in_order(group, recorder, ["a", "b", "c", "d", "e", "f"])
    assert recorder.batches == [["a"], ["b", "c", "d"], ["e", "f"]]
    assert [item.answer for item in items] == [f"h:{n}" for n in "abcdef"]


def test_a_batch_that_fails_fails_its_own_items_only():
    recorder = Recorder(fail_names=frozenset({"c"}))
    group = _group(recorder, max_batch=2)
    items = _submit_in_order(group, recorder, ["a", "b", "c", "d"])
    assert recorder.batches == [["a"], ["b", "c"], ["d"]]
    assert [item.answer for item in items] == ["h:a", None, None, "h:d"]
    assert all(isinstance(item.error, ValueError) for item in items[1:3])


def test_an_item_a_batch_leaves_without_an_answer_gets_an_error_not_a_hang():
    recorder = Recorder(leave=frozenset({"b"}))
    recorder.release.set()
    group = _group(recorder)
    item = Item("b")
    group.submit("h", item)
    assert item.answer is None and isinstance(item.error, RuntimeError)
