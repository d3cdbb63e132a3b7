"""Reconciling against the real database (SQLite and PostgreSQL): `SqlPlacementStore.records`,
the `Reconciler` releasing rows with their pCPU claims, host leases, the audit log, dry runs;
and `vmplacer reconcile` through the console script on libvirt's test driver.
(Real domains undefined by hand: tests/integration/test_reconcile_live.py.)"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from tests.support import require, run_vmplacer
from vmplacer.adapters.db import migrate
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.models import AuditRow, CpuClaimRow, PlacementRow, utcnow
from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.plans import SqlLeaseStore
from vmplacer.app.observe.reconcile import Reconciler, ReconcileError
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.ports import DomainInfo, HypervisorError

URI = "qemu:///system"
HOUR = 3600.0


def _placement(guest: str, cpus: list[int], host: str = "h1") -> Placement:
    return Placement(guest=guest, host=host, vcpupin={i: frozenset({c}) for i, c in enumerate(cpus)},
                     emulatorpin=frozenset(cpus), memory_nodes=frozenset({0}), memory_kib=65536, dedicated=True,
                     exclusive_cpus=frozenset(cpus))


def _live(placement: Placement, uuid: str, state: str = "running") -> DomainInfo:
    return DomainInfo(name=placement.guest, uuid=uuid, state=state, pause_reason=None,
                      vcpus=placement.vcpus, memory_kib=placement.memory_kib, placement=placement)


class FakeHost:
    """Just what reconciling reads from a host: its domains (or a failure to list them) and its
    topology (for the isolation check)."""

    def __init__(self, name: str, domains: list[DomainInfo] | None = None, down: bool = False):
        self.name = name
        self.listing = list(domains or [])
        self.down = down

    def topology(self):  # type: ignore[no-untyped-def]
        from vmplacer.core.topology.host import uniform_topology

        return uniform_topology(nodes=2, cores_per_node=8, threads_per_core=2, memory_mib_per_node=65536,
                                name=self.name)

    def domains(self) -> list[DomainInfo]:
        if self.down:
            raise HypervisorError(f"host {self.name}: cannot connect to {URI}: Connection refused",
                                  host=self.name, retriable=True)
        return list(self.listing)


@pytest.fixture
def store(sessions) -> SqlPlacementStore:
    return SqlPlacementStore(sessions, actor="reconcile-test")


@pytest.fixture
def leases(sessions) -> SqlLeaseStore:
    return SqlLeaseStore(sessions)


def _age(sessions, guest: str, seconds: float) -> None:
    """Pretend the row last changed `seconds` ago (an explicit value beats `onupdate`)."""
    with sessions.begin() as session:
        session.execute(update(PlacementRow).where(PlacementRow.guest == guest)
                        .values(updated_at=utcnow() - timedelta(seconds=seconds)))


def _claims(sessions) -> list[int]:
    with sessions() as session:
        return sorted(session.scalars(select(CpuClaimRow.cpu)))


def _audit(sessions) -> list[tuple[str, str, str, str]]:
    with sessions() as session:
        rows = session.scalars(select(AuditRow).where(AuditRow.action == "reconcile").order_by(AuditRow.id))
        return [(r.guest, r.host, r.outcome, r.detail["kind"]) for r in rows]


def _place(store: SqlPlacementStore, placement: Placement, state: str = "running", uuid: str | None = None) -> None:
    store.record(placement.host, URI, placement, {"name": placement.guest})
    if state != "planned":
        store.set_state(placement.guest, state, uuid)


def _reconciler(store, leases, hosts: list[FakeHost]) -> Reconciler:
    return Reconciler({h.name: h for h in hosts}, store, leases, holder="reconcile-test",
                      lease_holder=lambda host: leases.holders([host]).get(host, {}).get("holder"))


# ----- records ----------------------------------------------------------------------------------------
def test_records_carry_state_uuid_placement_and_age_from_updated_at(store, sessions):
    a, b = _placement("a", [0, 1]), _placement("b", [2])
    _place(store, a, "defined", "uuid-a")
    _place(store, b, "planned")
    _place(store, _placement("c", [3]), "running", "uuid-c")
    store.forget("c")
    _place(store, _placement("d", [0], host="h2"), "running", "uuid-d")

    records = store.records("h1")
    assert [(r.guest, r.host, r.state, r.domain_uuid) for r in records] == [
        ("a", "h1", "defined", "uuid-a"), ("b", "h1", "planned", None)]
    assert records[0].placement == a and records[1].placement == b
    assert all(0.0 <= r.age_s < 30.0 for r in records), [r.age_s for r in records]
    assert store.records("nowhere") == []

    _age(sessions, "a", 2 * HOUR)  # SQLite reads it back naive, PostgreSQL aware: both are UTC
    aged = {r.guest: r.age_s for r in store.records("h1")}
    assert 2 * HOUR - 1 <= aged["a"] < 2 * HOUR + 30
    store.set_state("a", "running", "uuid-a")  # a change makes the row young again
    assert {r.guest: r.age_s for r in store.records("h1")}["a"] < 30.0


# ----- the reconciler on the real database -----------------------------------------------------------
@pytest.fixture
def drifted_host(store, sessions) -> FakeHost:
    """h1 as an operator left it: `gone` undefined by hand, `rsv` reserved and never defined,
    `late` recorded defined but running, `ok` as recorded, `stranger` never placed."""
    gone, rsv, late, ok = (_placement("gone", [0, 1]), _placement("rsv", [2, 3]), _placement("late", [4]),
                           _placement("ok", [5]))
    _place(store, gone, "running", "uuid-gone")
    _place(store, rsv, "planned")
    _place(store, late, "defined", "uuid-late")
    _place(store, ok, "running", "uuid-ok")
    for guest in ("gone", "rsv", "late", "ok"):
        _age(sessions, guest, 2 * HOUR)
    return FakeHost("h1", [_live(late, "uuid-late"), _live(ok, "uuid-ok"),
                           _live(_placement("stranger", [6]), "uuid-stranger")])


def test_gone_rows_and_stale_reservations_are_released_with_their_claims(store, leases, sessions, drifted_host):
    report = _reconciler(store, leases, [drifted_host]).run(["h1"])

    data = report.to_dict()
    assert data["status"] == "complete" and report.complete
    assert (data["released"], data["updated"]) == (2, 1)
    findings = {(f["guest"], f["kind"]): f["outcome"] for f in data["hosts"][0]["findings"]}
    assert findings == {("gone", "gone"): "applied", ("rsv", "stale-reservation"): "applied",
                        ("late", "state"): "applied", ("stranger", "unmanaged"): "reported"}
    assert store.get("gone") is None and store.get("rsv") is None
    assert store.get("late")["state"] == "running"
    assert _claims(sessions) == [4, 5]
    # the released pCPUs are free for the next placement
    store.record("h1", URI, _placement("new", [0, 1, 2, 3]), {"name": "new"})
    assert store.get("new")["claims"] == [0, 1, 2, 3]
    assert _audit(sessions) == [("gone", "h1", "ok", "gone"), ("late", "h1", "ok", "state"),
                                ("rsv", "h1", "ok", "stale-reservation")]
    with sessions() as session:
        released = session.scalar(select(AuditRow).where(AuditRow.guest == "gone"))
        assert released.actor == "reconcile-test" and released.detail["placement"]["exclusive_cpus"] == [0, 1]
    assert leases.holders(["h1"])["h1"]["holder"] is None, "the lease must be released after the run"
    # a second run finds nothing left to write
    again = _reconciler(store, leases, [drifted_host]).run(["h1"]).to_dict()
    assert (again["released"], again["updated"]) == (0, 0)
    assert again["counts"] == {"pending": 1, "unmanaged": 1}  # "new" is a fresh reservation


def test_a_dry_run_writes_nothing(store, leases, sessions, drifted_host):
    before = {r.guest: (r.state, r.domain_uuid) for r in store.records("h1")}
    claims = _claims(sessions)

    report = _reconciler(store, leases, [drifted_host]).run(["h1"], dry_run=True).to_dict()

    assert report["dry_run"] and (report["released"], report["updated"]) == (2, 1)
    outcomes = {f["guest"]: f["outcome"] for f in report["hosts"][0]["findings"]}
    assert outcomes == {"gone": "would-apply", "rsv": "would-apply", "late": "would-apply",
                        "stranger": "reported"}
    after = store.records("h1")
    assert {r.guest: (r.state, r.domain_uuid) for r in after} == before
    assert all(r.age_s > HOUR for r in after), "a dry run must not touch updated_at"
    assert _claims(sessions) == claims
    assert _audit(sessions) == []


def test_records_changed_within_the_settle_window_are_left_alone(store, leases, sessions):
    _place(store, _placement("young", [0]), "running", "uuid-young")  # just written: a place may be in progress
    report = _reconciler(store, leases, [FakeHost("h1")]).run(["h1"], settle_s=60.0)
    finding = report.hosts[0].outcomes[0].finding
    assert (finding.kind, finding.deferred) == ("settling", "gone")
    assert store.get("young") is not None and _claims(sessions) == [0]
    report = _reconciler(store, leases, [FakeHost("h1")]).run(["h1"], settle_s=0.0)
    assert report.hosts[0].outcomes[0].finding.kind == "gone" and store.get("young") is None


def test_a_host_leased_elsewhere_is_busy_and_the_others_still_run(store, leases, sessions):
    _place(store, _placement("a", [0]), "running", "uuid-a")
    _place(store, _placement("b", [0], host="h2"), "running", "uuid-b")
    for guest in ("a", "b"):
        _age(sessions, guest, HOUR)
    assert leases.acquire(["h1"], "rebalance:ctl1:42", 600)

    report = _reconciler(store, leases, [FakeHost("h1"), FakeHost("h2")]).run(["h1", "h2"])

    assert [(h.host, h.status) for h in report.hosts] == [("h1", "busy"), ("h2", "reconciled")]
    assert "h1" in report.problems[0] and "rebalance:ctl1:42" in report.problems[0]
    assert not report.complete and report.to_dict()["status"] == "incomplete"
    assert store.get("a") is not None, "a busy host is not touched"
    assert store.get("b") is None
    assert leases.holders(["h1"])["h1"]["holder"] == "rebalance:ctl1:42", "someone else's lease is kept"


def test_an_unreachable_host_is_reported_and_the_others_still_run(store, leases, sessions):
    _place(store, _placement("a", [0]), "running", "uuid-a")
    _place(store, _placement("b", [0], host="h2"), "running", "uuid-b")
    for guest in ("a", "b"):
        _age(sessions, guest, HOUR)

    report = _reconciler(store, leases, [FakeHost("h1", down=True), FakeHost("h2")]).run(None)

    assert [(h.host, h.status) for h in report.hosts] == [("h1", "unreachable"), ("h2", "reconciled")]
    assert "Connection refused" in report.problems[0] and "h1" in report.problems[0]
    assert store.get("a") is not None and store.get("b") is None
    assert leases.holders(["h1"])["h1"]["holder"] is None


def test_unknown_hosts_and_bad_windows_are_bad_input(store, leases):
    reconciler = _reconciler(store, leases, [FakeHost("h1")])
    with pytest.raises(ReconcileError, match=r"unknown host\(s\) h9 \(configured: h1\)") as error:
        reconciler.run(["h9"])
    assert error.value.bad_input
    with pytest.raises(ReconcileError, match="settle_s: must be >= 0"):
        reconciler.run(["h1"], settle_s=-1)


def test_replaced_domain_frees_the_old_claims(store, leases, sessions):
    old = _placement("web", [0, 1])
    _place(store, old, "running", "uuid-old")
    _age(sessions, "web", HOUR)
    host = FakeHost("h1", [_live(_placement("web", [2]), "uuid-new")])
    report = _reconciler(store, leases, [host]).run(["h1"])
    assert [(o.finding.kind, o.outcome) for o in report.hosts[0].outcomes] == [("replaced", "applied")]
    assert store.get("web") is None and _claims(sessions) == []
    store.record("h1", URI, _placement("next", [0, 1]), {"name": "next"})
    assert store.get("next")["claims"] == [0, 1]


# ----- the command line (libvirt's test driver: a fresh, fixed host in every process) ----------------
@pytest.fixture
def cli_config(tmp_path) -> Path:
    try:
        import libvirt  # noqa: F401
    except ImportError:
        require(False, "libvirt-python is not installed")
    path = tmp_path / "vmplacer.yaml"
    path.write_text(f"database_url: sqlite:///{tmp_path / 'vmplacer.db'}\ndata_dir: {tmp_path}\n"
                    "hosts:\n  - {name: t1, uri: \"test:///default\", domain_type: qemu}\n")
    return path


def _cli(config: Path, *args: str) -> tuple[int, dict, str]:
    done = run_vmplacer("--config", str(config), *args)
    try:
        data = json.loads(done.stdout) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        data = {"text": done.stdout}
    return done.returncode, data, done.stderr


@pytest.fixture
def cli_db(cli_config):
    """The command's own SQLite database, opened by the test to set the scene and check it."""
    url = f"sqlite:///{cli_config.parent / 'vmplacer.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    yield SqlPlacementStore(sessions), sessions
    engine.dispose()


def test_cli_releases_a_gone_record_and_reports_the_unmanaged_domain(cli_config, cli_db):
    store, sessions = cli_db
    store.record("t1", "test:///default", _placement("vanished", [0, 1], host="t1"), {"name": "vanished"})
    store.set_state("vanished", "running", "uuid-vanished")
    _age(sessions, "vanished", HOUR)

    code, dry, err = _cli(cli_config, "reconcile", "--dry-run", "--format", "json")
    assert code == 0, err
    assert [(f["guest"], f["kind"], f["outcome"]) for f in dry["hosts"][0]["findings"]] == [
        ("test", "unmanaged", "reported"), ("vanished", "gone", "would-apply")]
    assert store.get("vanished") is not None

    code, data, err = _cli(cli_config, "reconcile", "--host", "t1", "--format", "json")
    assert code == 0, err
    assert data["status"] == "complete" and data["released"] == 1
    assert store.get("vanished") is None
    code, listed, err = _cli(cli_config, "placements", "--format", "json")
    assert code == 0 and listed == [], err


def test_cli_exit_1_names_a_busy_host(cli_config, cli_db):
    _, sessions = cli_db
    assert SqlLeaseStore(sessions).acquire(["t1"], "rebalance:elsewhere", 600)
    code, data, err = _cli(cli_config, "reconcile", "--all", "--format", "json")
    assert code == 1
    assert data["hosts"][0]["status"] == "busy"
    assert "host t1 busy" in err and "rebalance:elsewhere" in err


@pytest.mark.parametrize("args, message", [
    (["--host", "nope"], "--host 'nope': unknown host"),
    (["--settle", "soon"], "--settle: 'soon' is not a duration"),
    (["--reservation-grace=-1h"], "--reservation-grace: '-1h' is not a duration"),
])
def test_cli_bad_input_exits_2(cli_config, args, message):
    code, _, err = _cli(cli_config, "reconcile", *args)
    assert code == 2 and message in err, err


def test_cli_durations_accept_hours_minutes_and_seconds():
    from vmplacer.cli.common import UsageError, parse_duration

    assert parse_duration("1h", "--x", "s") == 3600.0
    assert parse_duration("0.5h", "--x", "s") == 1800.0
    assert parse_duration("30m", "--x", "s") == 1800.0
    assert parse_duration("90", "--x", "s") == 90.0
    assert parse_duration("60s", "--x", "s") == 60.0
    with pytest.raises(UsageError, match="--x: '1d' is not a duration"):
        parse_duration("1d", "--x", "s")


# ----- domains moved by hand -----------------------------------------------------------------------
def _following(store, leases, sessions, hosts: list[FakeHost]) -> Reconciler:
    from vmplacer.adapters.db.plans import SqlPlacementUpdates

    return Reconciler({h.name: h for h in hosts}, store, leases, holder="reconcile-test",
                      placements=SqlPlacementUpdates(sessions, {h.name: URI for h in hosts}))


def test_a_domain_migrated_by_hand_takes_its_record_to_the_new_host(store, leases, sessions):
    _place(store, _placement("web", [0, 1]), "running", "uuid-web")
    _age(sessions, "web", HOUR)
    now_on_h2 = _placement("web", [4, 5], host="h2")
    hosts = [FakeHost("h1", []), FakeHost("h2", [_live(now_on_h2, "uuid-web", "paused")])]

    dry = _following(store, leases, sessions, hosts).run(["h1"], dry_run=True).to_dict()
    assert [(f["kind"], f["action"], f["target_host"]) for f in dry["hosts"][0]["findings"]] == [
        ("moved", "follow", "h2")]
    assert store.get("web")["host"] == "h1", "a dry run writes nothing"

    report = _following(store, leases, sessions, hosts).run(["h1"]).to_dict()
    assert report["followed"] == 1 and report["released"] == 0, report
    record = store.get("web")
    assert (record["host"], record["state"], record["claims"]) == ("h2", "running", [4, 5])
    assert record["placement"]["vcpupin"] == {"0": [4], "1": [5]}
    assert store.occupied("h1") == [] and [p.guest for p in store.occupied("h2")] == ["web"]
    assert ("web", "h1", "ok", "moved") in _audit(sessions)
    assert all(v["holder"] is None for v in leases.holders(["h1", "h2"]).values()), "both leases released"


def test_a_moved_domain_whose_pcpus_are_claimed_there_is_released(store, leases, sessions):
    _place(store, _placement("web", [0, 1]), "running", "uuid-web")
    _place(store, _placement("db", [4], host="h2"), "running", "uuid-db")
    _age(sessions, "web", HOUR)
    hosts = [FakeHost("h1", []), FakeHost("h2", [_live(_placement("web", [4, 5], host="h2"), "uuid-web"),
                                                 _live(_placement("db", [4], host="h2"), "uuid-db")])]
    report = _following(store, leases, sessions, hosts).run(["h1"]).to_dict()
    finding = report["hosts"][0]["findings"][0]
    assert finding["kind"] == "moved" and "released instead" in finding["outcome_message"], finding
    assert store.get("web") is None and _claims(sessions) == [4]


def test_a_moved_domain_on_a_busy_host_keeps_its_record_until_the_next_run(store, leases, sessions):
    _place(store, _placement("web", [0, 1]), "running", "uuid-web")
    _age(sessions, "web", HOUR)
    hosts = [FakeHost("h1", []), FakeHost("h2", [_live(_placement("web", [4, 5], host="h2"), "uuid-web")])]
    assert leases.acquire(["h2"], "someone-else", 600)
    report = _following(store, leases, sessions, hosts).run(["h1"]).to_dict()
    finding = report["hosts"][0]["findings"][0]
    assert finding["outcome"] == "skipped", finding
    assert "host h2 busy" in finding["outcome_message"] and "next run" in finding["outcome_message"]
    assert store.get("web")["host"] == "h1" and _claims(sessions) == [0, 1]


def test_same_name_with_another_uuid_elsewhere_is_not_the_moved_domain(store, leases, sessions):
    _place(store, _placement("web", [0, 1]), "running", "uuid-web")
    _age(sessions, "web", HOUR)
    hosts = [FakeHost("h1", []), FakeHost("h2", [_live(_placement("web", [4], host="h2"), "uuid-other")])]
    report = _following(store, leases, sessions, hosts).run(["h1"]).to_dict()
    assert [f["kind"] for f in report["hosts"][0]["findings"]] == ["gone"]
    assert store.get("web") is None
