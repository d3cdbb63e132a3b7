"""The freezer with the real freeze journal (SQLite and PostgreSQL, through the
migrations): journal before suspend, resume always, watchdog, replay."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import select

from tests.unit.test_profiler import FakeDomain, FakeHost
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.models import FreezeJournalRow
from vmplacer.adapters.db.profiles import SqlFreezeJournal
from vmplacer.adapters.process_identity import current_owner, owner_alive
from vmplacer.app.observe.freeze import FreezeAborted, Freezer, replay_journal
from vmplacer.ports import DomainGone, HypervisorError


@pytest.fixture
def journal(sessions):
    return SqlFreezeJournal(sessions)


def rows(journal: SqlFreezeJournal) -> list[FreezeJournalRow]:
    with journal.sessions() as session:
        return list(session.scalars(select(FreezeJournalRow)))


def three_guests() -> FakeHost:
    return FakeHost(FakeDomain("me", frozenset({0})), FakeDomain("n1", frozenset({0})),
                    FakeDomain("n2", frozenset({1})))


def dead_owner() -> dict[str, object]:
    """The identity of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "import os; print(os.getpid())"], stdout=subprocess.PIPE,
                             text=True)
    pid = int(child.communicate()[0])
    owner = dict(current_owner())
    owner["pid"] = pid
    return owner


def test_the_journal_row_is_committed_before_the_first_suspend_and_removed_after_resume(journal, database_url):
    host = three_guests()
    seen: list[set[str]] = []
    # Another connection must see the row: it is committed, not just flushed.
    other_engine = make_engine(database_url)
    other = SqlFreezeJournal(make_session_factory(other_engine))
    host.on_suspend = lambda name: seen.append(
        {d for entry in other.pending() for d, _ in entry.domains})
    freezer = Freezer(host, journal, max_freeze_s=5, owner=current_owner())
    with freezer.freeze(["n1", "n2"]) as report:
        assert host.running() == {"me"}
        assert len(rows(journal)) == 1 and rows(journal)[0].owner["pid"] == current_owner()["pid"]
    freezer.close()
    other_engine.dispose()
    assert seen == [{"n1", "n2"}, {"n1", "n2"}]
    assert host.running() == {"me", "n1", "n2"}
    assert rows(journal) == []
    assert set(report.frozen) == {"n1", "n2"} and report.span_ms >= report.suspend_ms


def test_only_running_domains_are_frozen_and_journaled(journal):
    host = FakeHost(FakeDomain("me"), FakeDomain("running"),
                    FakeDomain("held", state="paused", reason="user"), FakeDomain("off", state="shutoff"),
                    FakeDomain("keep-out"))
    freezer = Freezer(host, journal, max_freeze_s=5, owner=current_owner(), excluded=("keep-out",))
    with freezer.freeze(["running", "held", "off", "keep-out", "ghost"]) as report:
        journaled = {d for entry in journal.pending() for d, _ in entry.domains}
        assert journaled == {"running"}
    freezer.close()
    assert report.frozen == ("running",)
    assert set(report.skipped) == {"held", "off", "keep-out", "ghost"}
    assert host.domains["held"].state == "paused"
    assert {name for _, name, _ in host.log} == {"running"}


def test_no_journal_no_freeze():
    class BrokenJournal:
        def open(self, *args):
            raise RuntimeError("database is down")

    host = three_guests()
    freezer = Freezer(host, BrokenJournal(), max_freeze_s=5, owner={})
    with pytest.raises(FreezeAborted, match="journal unavailable"):
        with freezer.freeze(["n1", "n2"]):
            pytest.fail("the block must not run without a journal row")
    freezer.close()
    assert host.log == []


@pytest.mark.parametrize("failure", [DomainGone("n2 vanished", domain="n2"), HypervisorError("n2: busy", domain="n2")])
def test_a_failed_suspend_aborts_and_resumes_the_others(journal, failure):
    host = three_guests()
    host.fail_suspend["n2"] = failure
    freezer = Freezer(host, journal, max_freeze_s=5, owner=current_owner())
    with pytest.raises(FreezeAborted, match="n2") as caught:
        with freezer.freeze(["n1", "n2"]):
            pytest.fail("the block must not run after a failed suspend")
    freezer.close()
    assert caught.value.domain == "n2"
    assert host.running() == {"me", "n1", "n2"}
    assert rows(journal) == []


def test_an_exception_in_the_block_still_resumes(journal):
    host = three_guests()
    freezer = Freezer(host, journal, max_freeze_s=5, owner=current_owner())
    with pytest.raises(ZeroDivisionError):
        with freezer.freeze(["n1", "n2"]):
            1 / 0  # noqa: B018 - a sampler bug
    freezer.close()
    assert host.running() == {"me", "n1", "n2"} and rows(journal) == []


def test_watchdog_resumes_while_the_caller_hangs(journal):
    host = three_guests()
    max_freeze = 0.15
    freezer = Freezer(host, journal, max_freeze_s=max_freeze, owner=current_owner())
    running_during_hang: list[set[str]] = []
    started = time.perf_counter()
    with freezer.freeze(["n1", "n2"]) as report:
        time.sleep(max_freeze + 0.25)  # a hung sampler
        running_during_hang.append(host.running())
        assert report.expired
    freezer.close()
    assert report.watchdog_fired
    assert running_during_hang == [{"me", "n1", "n2"}]
    suspended_at = min(at for op, _, at in host.log if op == "suspend")
    resumed_at = max(at for op, _, at in host.log if op == "resume")
    assert resumed_at - suspended_at < max_freeze + 0.05  # frozen no longer than the cap
    assert resumed_at - started < max_freeze + 0.25
    assert rows(journal) == []


def test_a_suspend_landing_after_the_watchdog_is_undone(journal):
    host = three_guests()
    host.suspend_delay["n2"] = 0.3  # the daemon answers late
    freezer = Freezer(host, journal, max_freeze_s=0.1, owner=current_owner())
    with freezer.freeze(["n1", "n2"]) as report:
        pass
    freezer.close()
    assert report.watchdog_fired
    assert host.running() == {"me", "n1", "n2"}
    log = [(op, name) for op, name, _ in host.log if name == "n2"]
    assert log[-1] == ("resume", "n2")


def test_a_suspend_the_daemon_never_answers_aborts_the_freeze_instead_of_holding_it(journal, monkeypatch):
    """libvirt waits for QEMU's monitor without a bound: a suspend that never returns must
    not hold the caller (and the frozen neighbours) with it. The freeze aborts once the
    grace past max_freeze is over, while that suspend is still hanging; when it finally
    lands, the thread that issued it resumes it."""
    monkeypatch.setattr("vmplacer.app.observe.freeze.SUSPEND_ANSWER_GRACE_S", 0.2)
    host = three_guests()
    answer = threading.Event()
    host.on_suspend = lambda name: answer.wait() if name == "n2" else None
    freezer = Freezer(host, journal, max_freeze_s=0.1, owner=current_owner())
    with pytest.raises(FreezeAborted, match="n2.*no answer to suspend"):
        with freezer.freeze(["n1", "n2"]):
            pytest.fail("the block must not run while a suspend is unanswered")
    assert not answer.is_set()  # it aborted while the suspend was still hanging
    assert host.running() == {"me", "n1", "n2"}  # n1 was resumed; n2 never got paused yet
    answer.set()
    freezer.close()
    assert host.running() == {"me", "n1", "n2"}  # the late suspend was undone by its thread
    assert [op for op, name, _ in host.log if name == "n2"][-2:] == ["suspend", "resume"]


def test_a_failing_resume_is_retried_and_a_lasting_failure_keeps_the_row(journal):
    host = three_guests()
    host.fail_resume["n1"] = 1  # one hiccup: the retry succeeds
    freezer = Freezer(host, journal, max_freeze_s=5, owner=current_owner())
    with freezer.freeze(["n1"]) as report:
        pass
    assert host.running() == {"me", "n1", "n2"} and rows(journal) == [] and not report.resume_failures

    host.fail_resume["n1"] = 10  # the daemon stays unhappy
    with freezer.freeze(["n1"]) as report:
        pass
    freezer.close()
    assert "n1" in report.resume_failures
    assert host.domains["n1"].state == "paused"
    assert [d for entry in journal.pending() for d, _ in entry.domains] == ["n1"]
    # ... a replay after the deadline resumes it and clears the row
    host.fail_resume["n1"] = 0
    replayed = replay_journal(journal, {"fake": host}, owner_alive, now=lambda: time.time() + 10)
    assert replayed.resumed == [("fake", "n1")] and rows(journal) == []
    assert host.running() == {"me", "n1", "n2"}


def test_suspends_are_issued_in_parallel(journal):
    """All co-runners are asked to suspend at once, not one after another.

    Checked by overlap, not by wall time: the fake suspend blocks until every
    suspend is in flight (or a generous timeout passes), so a one-by-one
    freezer can never see more than one at a time.
    """
    import threading

    names = [f"n{i}" for i in range(8)]
    host = FakeHost(FakeDomain("me"), *(FakeDomain(n) for n in names))
    lock = threading.Lock()
    in_flight = 0
    most = 0
    all_in = threading.Event()
    plain_suspend = host.suspend

    def overlapping_suspend(name: str) -> None:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
            if in_flight == len(names):
                all_in.set()
        all_in.wait(timeout=2.0)
        try:
            plain_suspend(name)
        finally:
            with lock:
                in_flight -= 1

    host.suspend = overlapping_suspend  # type: ignore[method-assign]
    freezer = Freezer(host, journal, max_freeze_s=10, owner=current_owner())
    with freezer.freeze(names) as parallel:
        assert set(parallel.frozen) == set(names)
    assert most == len(names)

    most = 0
    all_in.set()  # one by one: nothing to wait for
    with freezer.freeze(names, parallel=False) as sequential:
        assert set(sequential.frozen) == set(names)
    freezer.close()
    assert most == 1
    assert host.running() == {"me", *names}


# ----- replay -------------------------------------------------------------------------------------


def test_replay_resumes_what_a_dead_freezer_left_paused_and_nothing_else(journal):
    host = FakeHost(
        FakeDomain("frozen-by-us"),
        FakeDomain("paused-before", state="paused", reason="user"),
        FakeDomain("migrating", state="paused", reason="migration"),
        FakeDomain("already-running"),
        FakeDomain("recreated"),
    )
    # What a freezer killed mid-freeze leaves: a row, and its domains paused with reason "user".
    entry = journal.open("fake", [("frozen-by-us", host.domains["frozen-by-us"].uuid),
                                  ("migrating", host.domains["migrating"].uuid),
                                  ("already-running", host.domains["already-running"].uuid),
                                  ("recreated", "another-uuid"),
                                  ("gone", "x")], 3600, dead_owner())
    host.suspend("frozen-by-us")
    host.suspend("recreated")
    report = replay_journal(journal, {"fake": host}, owner_alive)
    assert report.resumed == [("fake", "frozen-by-us")]
    assert report.left_alone == [("fake", "migrating", "paused for migration, not by vmplacer")]
    assert report.closed_entries == [entry]
    assert host.domains["paused-before"].state == "paused"  # never in the journal: never touched
    assert host.domains["recreated"].state == "paused"  # same name, different domain now
    assert rows(journal) == []


def test_replay_leaves_a_live_freezer_alone_until_its_deadline(journal):
    host = FakeHost(FakeDomain("n1"))
    journal.open("fake", [("n1", host.domains["n1"].uuid)], 3600, current_owner())
    host.suspend("n1")
    report = replay_journal(journal, {"fake": host}, owner_alive)
    assert report.live_entries and not report.resumed and host.domains["n1"].state == "paused"
    late = replay_journal(journal, {"fake": host}, owner_alive, now=lambda: time.time() + 7200)
    assert late.resumed == [("fake", "n1")] and rows(journal) == []


def test_replay_of_an_owner_on_another_machine_waits_for_the_deadline(journal):
    host = FakeHost(FakeDomain("n1"))
    owner = dict(current_owner(), hostname="elsewhere.example")
    assert owner_alive(owner) is None
    journal.open("fake", [("n1", host.domains["n1"].uuid)], 60, owner)
    host.suspend("n1")
    assert not replay_journal(journal, {"fake": host}, owner_alive).resumed
    assert replay_journal(journal, {"fake": host}, owner_alive, now=lambda: time.time() + 120).resumed


def test_replay_reports_unknown_hosts_and_keeps_their_rows(journal):
    journal.open("retired-host", [("n1", "u")], 1, dead_owner())
    report = replay_journal(journal, {}, owner_alive)
    assert report.errors and "retired-host" in report.errors[0]
    assert len(rows(journal)) == 1


def test_owner_identity_distinguishes_live_dead_and_reused_pids():
    me = current_owner()
    assert owner_alive(me) is True
    assert owner_alive(dead_owner()) is False
    assert owner_alive(dict(me, started=float(me["started"]) - 1000)) is False  # pid reused by another process
    assert owner_alive({"hostname": me["hostname"]}) is False


def test_journal_rows_round_trip(journal):
    owner = current_owner()
    entry = journal.open("h1", [("a", "uuid-a"), ("b", "uuid-b")], 2.5, owner)
    [pending] = journal.pending("h1")
    assert pending.id == entry and pending.domains == (("a", "uuid-a"), ("b", "uuid-b"))
    assert pending.owner == owner
    assert pending.deadline_at - pending.created_at == pytest.approx(2.5, abs=0.01)
    assert abs(pending.created_at - time.time()) < 60
    assert journal.pending("other-host") == []
    journal.close(entry)
    journal.close(entry)  # closing twice is fine (a replay may have closed it)
    assert journal.pending() == []


def test_concurrent_freezes_on_one_freezer_do_not_mix_up(journal):
    host = FakeHost(*(FakeDomain(f"d{i}") for i in range(6)))
    freezer = Freezer(host, journal, max_freeze_s=5, owner=current_owner())
    errors: list[BaseException] = []

    def worker(names):
        try:
            for _ in range(5):
                with freezer.freeze(names):
                    time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(["d0", "d1", "d2"],)),
               threading.Thread(target=worker, args=(["d3", "d4", "d5"],))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    freezer.close()
    assert not errors
    assert host.running() == {f"d{i}" for i in range(6)} and rows(journal) == []
