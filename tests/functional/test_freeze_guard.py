"""The freezer and its guardian port, the replay's hand-off rule, rescue audits, and the
API's once-a-second replay (real databases; the live guardian is in tests/integration)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from tests.functional.test_api_helpers import make_container
from tests.functional.test_freeze import dead_owner, journal, rows, three_guests  # noqa: F401 - fixture
from vmplacer.adapters.db.engine import make_session_factory
from vmplacer.adapters.db.freeze_rescues import RESCUE_ACTION, rescue_summary, write_rescues
from vmplacer.adapters.db.models import AuditRow
from vmplacer.adapters.db.profiles import SqlFreezeJournal
from vmplacer.adapters.process_identity import current_owner, owner_alive
from vmplacer.app.observe.freeze import HANDOFF_S, FreezeAborted, Freezer, replay_journal


class RecordingGuard:
    """A FreezeGuard that records what the freezer told it, and when."""

    def __init__(self, host, *, fail: str = ""):
        self.host = host
        self.fail = fail
        self.events: list[tuple[str, object, frozenset[str]]] = []
        self.armed: set[int] = set()

    def identity(self) -> dict[str, object]:
        if self.fail == "identity":
            raise RuntimeError("guardian would not start")
        return {"pid": 1, "started": 0.0}

    def arm(self, entry_id, host, domains, max_freeze_s) -> None:
        if self.fail == "arm":
            raise RuntimeError("guardian pipe closed")
        self.armed.add(entry_id)
        self.events.append(("arm", tuple(n for n, _ in domains), frozenset(self.host.running())))

    def disarm(self, entry_id) -> None:
        self.armed.discard(entry_id)
        self.events.append(("disarm", entry_id, frozenset(self.host.running())))


def test_the_guardian_is_armed_before_the_first_suspend_and_disarmed_after_the_last_resume(journal):
    host = three_guests()
    guard = RecordingGuard(host)
    freezer = Freezer(host, journal, max_freeze_s=5, owner=current_owner(), guard=guard)
    with freezer.freeze(["n1", "n2"]) as report:
        assert rows(journal)[0].owner["guardian"] == {"pid": 1, "started": 0.0}
    freezer.close()
    (arm, frozen, running_at_arm), (disarm, entry, running_at_disarm) = guard.events
    assert (arm, set(frozen), running_at_arm) == ("arm", {"n1", "n2"}, {"me", "n1", "n2"})
    assert (disarm, entry, running_at_disarm) == ("disarm", report.journal_id, {"me", "n1", "n2"})
    assert guard.armed == set()


@pytest.mark.parametrize("fail", ["identity", "arm"])
def test_no_guardian_no_freeze(journal, fail):
    host = three_guests()
    freezer = Freezer(host, journal, max_freeze_s=5, owner=current_owner(), guard=RecordingGuard(host, fail=fail))
    with pytest.raises(FreezeAborted, match="guardian unavailable"):
        with freezer.freeze(["n1", "n2"]):
            pytest.fail("the block must not run without a guardian")
    freezer.close()
    assert host.log == []
    assert rows(journal) == []  # a row opened before the arm failed is closed again


def test_a_failed_resume_leaves_the_guardian_armed_to_retry(journal):
    host = three_guests()
    host.fail_resume["n1"] = 99
    guard = RecordingGuard(host)
    freezer = Freezer(host, journal, max_freeze_s=5, owner=current_owner(), guard=guard)
    with freezer.freeze(["n1", "n2"]) as report:
        pass
    freezer.close()
    assert "n1" in report.resume_failures
    assert guard.armed == {report.journal_id}
    assert len(rows(journal)) == 1


def _open_row(journal: SqlFreezeJournal, host, owner, max_freeze_s: float = 60.0) -> int:
    host.domains["n1"].state, host.domains["n1"].reason = "paused", "user"
    return journal.open("fake", [("n1", host.domains["n1"].uuid)], max_freeze_s, owner)


def test_replay_leaves_a_row_to_a_live_guardian_until_its_deadline(journal):
    host = three_guests()
    owner = dead_owner()
    owner["guardian"] = {k: v for k, v in current_owner().items() if k in ("pid", "started")}  # alive
    _open_row(journal, host, owner)
    early = replay_journal(journal, {"fake": host}, owner_alive)
    assert early.resumed == [] and len(early.live_entries) == 1
    late = replay_journal(journal, {"fake": host}, owner_alive, now=lambda: time.time() + 60 + HANDOFF_S + 1,
                          cause="housekeeping")
    assert late.resumed == [("fake", "n1")]
    (rescue,) = late.rescues
    assert rescue["cause"] == "housekeeping" and rescue["resumed"] == ["n1"]
    assert rescue["overrun_s"] == pytest.approx(HANDOFF_S + 1, abs=1.0)


def test_replay_resumes_at_once_when_owner_and_guardian_are_both_dead(journal):
    host = three_guests()
    owner = dead_owner()
    guardian = dead_owner()
    owner["guardian"] = {"pid": guardian["pid"], "started": guardian["started"]}
    _open_row(journal, host, owner)
    report = replay_journal(journal, {"fake": host}, owner_alive, cause="start")
    assert report.resumed == [("fake", "n1")]
    assert report.rescues[0]["overrun_s"] == 0.0  # resumed before the cap ran out
    assert rows(journal) == []


def test_rescues_are_audited_and_summed_by_cause(journal):
    sessions = journal.sessions
    write_rescues(sessions, [
        {"journal_id": 1, "host": "h", "cause": "parent-died", "resumed": ["a", "b"], "errors": [], "overrun_s": 0},
        {"journal_id": 2, "host": "h", "cause": "deadline", "resumed": ["c"], "errors": [], "overrun_s": 0.2504},
        {"journal_id": 3, "host": "h", "cause": "start", "resumed": [], "errors": [], "overrun_s": 0},
    ], actor="freeze-guardian")
    with sessions() as session:
        audited = list(session.scalars(select(AuditRow).where(AuditRow.action == RESCUE_ACTION)))
    assert [a.detail["cause"] for a in audited] == ["parent-died", "deadline"]  # nothing resumed: no entry
    assert audited[1].detail["overrun_ms"] == 250.4 and "c" in audited[1].message
    assert rescue_summary(sessions) == ({"parent-died": 2, "deadline": 1}, pytest.approx(0.2504))


def test_the_api_replays_the_journal_every_second(tmp_path):
    """A row whose owner and guardian died (a cgroup kill) is resumed by a running API within
    its replay period, and counted in /metrics."""
    import libvirt
    from fastapi.testclient import TestClient

    from vmplacer.api.app import create_app
    from vmplacer.api.services import FREEZE_REPLAY_EVERY_S, ApiOptions

    conn = libvirt.open("test:///default")  # the test driver's state is shared within a process
    dom = conn.lookupByName("test")
    container = make_container(f"sqlite:///{tmp_path / 'api.db'}", tmp_path, [{"name": "t", "uri": "test:///default"}])
    app = create_app(container, ApiOptions(run_jobs=False))
    try:
        with TestClient(app) as client:
            token = app.state.services.token_store.create("metrics-reader", "read")
            dom.suspend()
            owner = dead_owner()
            owner["guardian"] = {"pid": owner["pid"], "started": owner["started"]}
            opened = time.monotonic()
            SqlFreezeJournal(make_session_factory(container.engine)).open("t", [("test", dom.UUIDString())], 60.0, owner)
            while dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
                assert time.monotonic() - opened < FREEZE_REPLAY_EVERY_S + 5, "not replayed"
                time.sleep(0.01)
            waited = time.monotonic() - opened
            # Causal bound: one replay period, plus the replay's own work (a state read, a resume).
            assert waited < FREEZE_REPLAY_EVERY_S + 1.0, waited
            metrics = client.get("/metrics", headers={"Authorization": f"Bearer {token}"}).text
        assert 'vmplacer_freeze_rescued_domains_total{cause="housekeeping"} 1.0' in metrics
    finally:
        if dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
            dom.resume()
        conn.close()
        container.close()


def test_guard_once_replays_and_reports(tmp_path):
    import json

    from tests.functional.test_api_helpers import vmplacer, write_config
    from vmplacer.adapters.db import migrate

    url = f"sqlite:///{tmp_path / 'g.db'}"
    migrate.upgrade(url)
    config = write_config(tmp_path, url, [{"name": "t", "uri": "test:///default"}])
    # A row of a dead owner on a host that left the configuration: reported, exit 1, row kept.
    container = make_container(url, tmp_path, [{"name": "t", "uri": "test:///default"}])
    SqlFreezeJournal(container.sessions).open("gone-host", [("x", "")], 1.0, dead_owner())
    container.close()
    result = vmplacer(config, "guard", "--once", "--format", "json")
    assert result.returncode == 1, result.stderr
    assert "gone-host" in json.loads(result.stdout)["errors"][0]
    assert vmplacer(config, "guard", "--every", "0s").returncode == 2


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT", "SIGTERM"])
def test_the_guard_loop_stops_at_once_on_a_stop_signal(tmp_path, signum):
    """Replays every hour: only the signal can end its wait, so an exit at all is the wake-up."""
    import signal
    import subprocess

    from tests.functional.test_api_helpers import write_config
    from tests.support import VMPLACER, clean_env
    from vmplacer.adapters.db import migrate

    url = f"sqlite:///{tmp_path / 'g.db'}"
    migrate.upgrade(url)
    config = write_config(tmp_path, url, [{"name": "t", "uri": "test:///default"}])
    guard = subprocess.Popen([VMPLACER, "--config", str(config), "-v", "guard", "--every", "1h"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        while "replaying the freeze journal every" not in (guard.stderr.readline() or "EOF"):
            assert guard.poll() is None, guard.stderr.read()
        guard.send_signal(getattr(signal, signum))
        _, errors = guard.communicate(timeout=600)  # far below the hour it would otherwise wait
    finally:
        if guard.poll() is None:
            guard.kill()
            guard.communicate()
    assert guard.returncode == 0, errors


def test_units_that_freeze_replay_the_journal_when_they_stop():
    from pathlib import Path

    units = Path(__file__).resolve().parents[2] / "systemd"
    for name in ("vmplacer-api.service", "vmplacer-rebalance.service"):
        assert "ExecStopPost=-/opt/vmplacer/.venv/bin/vmplacer guard --once" in (units / name).read_text(), name
    assert "ExecStart=/opt/vmplacer/.venv/bin/vmplacer guard --every 1s" in (units / "vmplacer-guard.service").read_text()
