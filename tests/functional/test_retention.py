"""Data retention on the real database (SQLite and PostgreSQL): `Pruner` deletes finished
plans, profile runs, audit entries, jobs and expired idempotency keys past their age, keeps
everything still live (and each guest's newest profile runs), never touches placements;
`vmplacer db prune` through the console script; the systemd units."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from tests.support import run_vmplacer, systemd_verify_problems
from vmplacer.adapters.db import migrate
from vmplacer.adapters.db.api import SqlIdempotencyStore, SqlJobStore
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.models import (
    AuditRow,
    CpuClaimRow,
    IdempotencyKeyRow,
    JobRow,
    PlacementRow,
    PlanActionRow,
    PlanRow,
    ProfileRunRow,
    ProfileSampleRow,
    utcnow,
)
from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.plans import SqlPlanStore
from vmplacer.adapters.db.profiles import SqlProfileStore
from vmplacer.adapters.db.repositories import record_audit
from vmplacer.adapters.db.retention import KINDS, Pruner, RetentionAges
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import PLAN_FINAL_STATES, PLAN_STATES, Action, Plan
from vmplacer.ports import ProfileSample

ROOT = Path(__file__).resolve().parents[2]
DAY = 86_400.0
AGES = RetentionAges(plans_s=30 * DAY, profiles_s=90 * DAY, audit_s=180 * DAY, jobs_s=7 * DAY)
OLD = 400 * DAY  # past every age above
RECENT = 3600.0  # within every age above
TABLES = (PlanRow, PlanActionRow, ProfileRunRow, ProfileSampleRow, AuditRow, JobRow, IdempotencyKeyRow,
          PlacementRow, CpuClaimRow)


def _ago(seconds: float) -> datetime:
    return utcnow() - timedelta(seconds=seconds)


def _set(sessions, column, key, **values) -> None:
    """Backdate a row: the stores stamp the clock, retention reads these columns."""
    with sessions.begin() as session:
        session.execute(update(column.class_).where(column == key).values(**values))


def _count(sessions, table) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(table)))


def _ids(sessions, column) -> set:
    with sessions() as session:
        return set(session.scalars(select(column)))


@dataclass
class Seeded:
    """What the scene holds and which of it retention must delete."""

    doomed: dict[str, set] = field(default_factory=lambda: {kind: set() for kind in KINDS})
    kept: dict[str, set] = field(default_factory=lambda: {kind: set() for kind in KINDS})
    doomed_children: dict[str, int] = field(default_factory=lambda: {"plan_actions": 0, "profile_samples": 0})
    guests: tuple[str, ...] = ()

    def expected_counts(self) -> dict[str, int]:
        counts = {kind: len(ids) for kind, ids in self.doomed.items()}
        counts.update(self.doomed_children)
        return counts


# ----- the scene: real rows through the real stores, then backdated -------------------------------------
def _plans(sessions, seeded: Seeded) -> None:
    store = SqlPlanStore(sessions)

    def plan(state: str, age: float) -> int:
        # "empty" plans (nothing worth doing) have no actions; every other plan has one.
        actions = () if state == "empty" else (Action(index=0, kind="probe", host="h1"),)
        saved = store.save(Plan(actions=actions, hosts=("h1",), state=state, summary=f"{state}, {age:g} s old"))
        _set(sessions, PlanRow.id, saved.id, created_at=_ago(age + 60), updated_at=_ago(age))
        return saved.id

    for state in PLAN_FINAL_STATES:
        seeded.doomed["plans"].add(plan(state, OLD))
        seeded.doomed_children["plan_actions"] += 0 if state == "empty" else 1
    for state in PLAN_STATES:
        if state not in PLAN_FINAL_STATES:  # still live however old
            seeded.kept["plans"].add(plan(state, OLD))
    for state in PLAN_FINAL_STATES:  # the last one is the newest plan, so no id rule interferes
        seeded.kept["plans"].add(plan(state, RECENT))


def _samples(guests: tuple[str, ...], age: float) -> list[ProfileSample]:
    at = _ago(age).timestamp()
    return [ProfileSample(guest=g, kind=kind, metric="cpu", value=0.8, window_s=0.01, t_m_ms=10.0, at=at)
            for g in guests for kind in ("zeta", "zeta_b")]


def _profiles(sessions, seeded: Seeded) -> None:
    store = SqlProfileStore(sessions)

    def run(guests: tuple[str, ...], status: str | None, age: float) -> int:
        run_id = store.start_run("h1", "cpu", {"guests": list(guests)})
        store.add_samples(run_id, _samples(guests, age))
        if status is not None:
            store.finish_run(run_id, {"guests": list(guests)}, status=status)
        _set(sessions, ProfileRunRow.id, run_id, started_at=_ago(age + 60),
             finished_at=_ago(age) if status is not None else None)
        return run_id

    # (guests, status (None: still running), age, deleted?)
    scene = [
        (("a", "b"), "finished", OLD, True),  # a and b both have newer runs
        (("a",), "finished", OLD, False),  # a's newest finished run (what learning reads)
        (("b",), "finished", RECENT, False),  # recent
        (("c",), "finished", OLD, False),  # c's newest finished run
        (("c",), "failed", OLD, False),  # c's newest run of all
        (("e",), None, OLD, False),  # running: never touched
        ((), "failed", OLD, True),  # failed before its first sample
        (("a",), "failed", OLD, False),  # a's newest run of all
        (("b", "f"), "finished", RECENT, False),  # recent, the newest run
    ]
    for guests, status, age, deleted in scene:
        run_id = run(guests, status, age)
        (seeded.doomed if deleted else seeded.kept)["profile_runs"].add(run_id)
        if deleted:
            seeded.doomed_children["profile_samples"] += 2 * len(guests)
    seeded.guests = ("a", "b", "c", "e", "f")


def _audit(sessions, seeded: Seeded) -> None:
    for index, age in enumerate((OLD, OLD, 200 * DAY, 100 * DAY, RECENT)):
        with sessions.begin() as session:
            row = record_audit(session, actor="retention-test", action="test", outcome="ok",
                               host="h1", message=f"entry {index}")
            session.flush()
            row_id = row.id
        _set(sessions, AuditRow.id, row_id, at=_ago(age))
        (seeded.doomed if age > AGES.audit_s else seeded.kept)["audit"].add(row_id)


def _jobs(sessions, seeded: Seeded) -> None:
    store = SqlJobStore(sessions)

    def job(final: str | None, run: bool, age: float) -> str:
        record = store.create("profile", ["h1"], {"seconds": 1}, "retention-test")
        if run:
            assert store.claim(record.id, "owner-1")
        if final is not None:
            assert store.finish(record.id, "owner-1", final, {"ok": final == "succeeded"},
                                None if final == "succeeded" else {"code": "x", "message": "x"})
        stamps = {"created_at": _ago(age + 60)}
        if run:
            stamps.update(started_at=_ago(age + 30), heartbeat_at=_ago(age))
        if final is not None:
            stamps["finished_at"] = _ago(age)
        _set(sessions, JobRow.id, record.id, **stamps)
        return record.id

    seeded.doomed["jobs"] |= {job("succeeded", True, OLD), job("failed", True, 8 * DAY)}
    seeded.kept["jobs"] |= {job(None, False, OLD), job(None, True, OLD),  # queued, running
                            job("succeeded", True, 6 * DAY), job("failed", True, RECENT)}


def _idempotency(sessions, seeded: Seeded) -> None:
    store = SqlIdempotencyStore(sessions)
    for key, age in (("old", store.retention_s + 3600), ("new", 60.0)):
        begun = store.begin("orchestrator", key, "f" * 64, "POST", "/v1/placements")
        assert begun.outcome == "new"
        store.finish(begun.row_id, 201, "application/json", "{}")
        _set(sessions, IdempotencyKeyRow.id, begun.row_id, created_at=_ago(age))
        (seeded.doomed if key == "old" else seeded.kept)["idempotency_keys"].add(begun.row_id)


def _placements(sessions) -> None:
    store = SqlPlacementStore(sessions, actor="retention-test")
    placement = Placement(guest="db1", host="h1", vcpupin={0: frozenset({2}), 1: frozenset({3})},
                          memory_nodes=frozenset({0}), memory_kib=65536, dedicated=True,
                          exclusive_cpus=frozenset({2, 3}))
    store.record("h1", "qemu:///system", placement, {"name": "db1"})
    store.set_state("db1", "running", "uuid-db1")
    with sessions.begin() as session:
        session.execute(update(PlacementRow).values(created_at=_ago(OLD), updated_at=_ago(OLD)))


def seed(sessions) -> Seeded:
    seeded = Seeded()
    _placements(sessions)
    _plans(sessions, seeded)
    _profiles(sessions, seeded)
    _jobs(sessions, seeded)
    _idempotency(sessions, seeded)
    _audit(sessions, seeded)  # last: the newest audit entry is a recent one
    return seeded


def _latest_runs(sessions, guests) -> dict[str, int]:
    store = SqlProfileStore(sessions)
    return {g: store.latest_run_with([g]).id for g in guests}


# ----- the pruner ---------------------------------------------------------------------------------------
def test_prune_deletes_what_is_old_and_final_and_keeps_the_rest(sessions):
    seeded = seed(sessions)
    before = {table.__tablename__: _count(sessions, table) for table in TABLES}
    latest = _latest_runs(sessions, seeded.guests)
    audit_before = _ids(sessions, AuditRow.id)

    dry = Pruner(sessions, batch_size=2).prune(AGES, dry_run=True)
    assert dry.dry_run and dry.counts == seeded.expected_counts()
    assert {table.__tablename__: _count(sessions, table) for table in TABLES} == before
    assert _ids(sessions, AuditRow.id) == audit_before  # a dry run writes nothing, not even the audit

    report = Pruner(sessions, batch_size=2, actor="retention-test").prune(AGES)
    assert report.counts == seeded.expected_counts()
    for kind, column in (("plans", PlanRow.id), ("profile_runs", ProfileRunRow.id), ("jobs", JobRow.id),
                         ("idempotency_keys", IdempotencyKeyRow.id)):
        remaining = _ids(sessions, column)
        assert not remaining & seeded.doomed[kind], kind
        assert remaining >= seeded.kept[kind], kind
    assert _ids(sessions, PlanActionRow.plan_id) == {
        pid for pid in seeded.kept["plans"] if SqlPlanStore(sessions).get(pid).actions}
    assert _ids(sessions, ProfileSampleRow.run_id) == seeded.kept["profile_runs"] - {
        rid for rid in seeded.kept["profile_runs"] if not SqlProfileStore(sessions).samples(rid)}
    assert _latest_runs(sessions, seeded.guests) == latest  # every guest keeps its newest run
    # placements (and their pCPU claims) are the live record: never pruned, however old
    assert _count(sessions, PlacementRow) == before["placements"] == 1
    assert SqlPlacementStore(sessions).get("db1")["claims"] == [2, 3]

    audit_after = _ids(sessions, AuditRow.id)
    assert audit_before - audit_after == seeded.doomed["audit"]
    [entry] = audit_after - audit_before  # the prune's own entry
    with sessions() as session:
        row = session.get(AuditRow, entry)
        assert (row.action, row.actor, row.detail["counts"]) == ("db-prune", "retention-test", report.counts)

    again = Pruner(sessions).prune(AGES)  # nothing left to do: nothing deleted, nothing audited
    assert again.counts == dict.fromkeys(KINDS, 0)
    assert _ids(sessions, AuditRow.id) == audit_after


def test_the_newest_row_of_a_table_stays_however_old(sessions):
    """SQLite hands the highest id out again once its row is gone: a new plan would inherit
    an old plan's audit entries, a new profile run be skipped by learning as already seen."""
    plans = SqlPlanStore(sessions)
    plan_ids = [plans.save(Plan(actions=(Action(index=0, kind="probe", host="h1"),), hosts=("h1",),
                                state=PLAN_FINAL_STATES[0])).id for _ in range(3)]
    profiles = SqlProfileStore(sessions)
    run_ids = []
    for _ in range(3):
        run_id = profiles.start_run("h1", "cpu", {})
        profiles.finish_run(run_id, {}, status="failed")
        run_ids.append(run_id)
    with sessions.begin() as session:
        audit_ids = []
        for _ in range(3):
            row = record_audit(session, actor="retention-test", action="test", outcome="ok")
            session.flush()
            audit_ids.append(row.id)
        session.execute(update(PlanRow).values(updated_at=_ago(OLD)))
        session.execute(update(ProfileRunRow).values(started_at=_ago(OLD), finished_at=_ago(OLD)))
        session.execute(update(AuditRow).values(at=_ago(OLD)))

    report = Pruner(sessions).prune(AGES)
    assert (report.counts["plans"], report.counts["profile_runs"], report.counts["audit"]) == (2, 2, 2)
    assert _ids(sessions, PlanRow.id) == {max(plan_ids)}
    assert _ids(sessions, ProfileRunRow.id) == {max(run_ids)}
    assert max(audit_ids) in _ids(sessions, AuditRow.id)
    assert plans.save(Plan(actions=(), hosts=("h1",))).id > max(plan_ids)
    assert profiles.start_run("h1", "cpu", {}) > max(run_ids)


def test_an_explicit_now_and_bad_ages_are_checked(sessions):
    seeded = seed(sessions)
    # A year from now every finished job, plan, run and entry is past its age (the id and
    # newest-run rules still hold): the same scene, another clock.
    later = Pruner(sessions).prune(AGES, now=utcnow() + timedelta(days=365), dry_run=True)
    assert later.counts["jobs"] == len(seeded.doomed["jobs"]) + 2  # the two recent finished jobs too
    assert later.counts["plans"] == len(seeded.doomed["plans"]) + len(PLAN_FINAL_STATES) - 1
    with pytest.raises(ValueError, match="time zone"):
        Pruner(sessions).prune(AGES, now=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="retention age jobs must be longer than 0"):
        RetentionAges(plans_s=1, profiles_s=1, audit_s=1, jobs_s=0)


# ----- the command line -----------------------------------------------------------------------------------
def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer("--config", str(config), "db", "prune", *args)


@pytest.fixture
def cli_scene(tmp_path):
    url = f"sqlite:///{tmp_path / 'vmplacer.db'}"
    config = tmp_path / "vmplacer.yaml"
    config.write_text(f"database_url: {url}\ndata_dir: {tmp_path}\n"
                      "retention: {plans: 30d, profiles: 90d, audit: 180d, jobs: 7d}\n")
    migrate.upgrade(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    yield config, sessions, seed(sessions)
    engine.dispose()


def test_cli_prunes_by_the_configured_ages(cli_scene):
    config, sessions, seeded = cli_scene
    plans_before = _count(sessions, PlanRow)

    done = _cli(config, "--dry-run", "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["dry_run"] is True and data["counts"] == seeded.expected_counts()
    assert data["older_than_s"] == {"plans": AGES.plans_s, "profiles": AGES.profiles_s, "audit": AGES.audit_s,
                                    "jobs": AGES.jobs_s}
    assert _count(sessions, PlanRow) == plans_before

    done = _cli(config)
    assert done.returncode == 0, done.stderr
    # piped: plain aligned rows, the kind first and the count last
    lines = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.split()}
    for kind, n in seeded.expected_counts().items():
        assert lines[kind][-1] == str(n), (kind, done.stdout)
    assert "deleted" in done.stdout
    assert _count(sessions, PlanRow) == plans_before - len(seeded.doomed["plans"])
    assert _count(sessions, PlacementRow) == 1


def test_cli_older_than_overrides_every_age(cli_scene):
    config, sessions, seeded = cli_scene
    done = _cli(config, "--older-than", "2d", "--dry-run", "--format", "json")
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)["counts"]
    assert counts["jobs"] == len(seeded.doomed["jobs"]) + 1  # the 6-day-old job too, not the 1-hour-old one
    assert counts["audit"] == len(seeded.doomed["audit"]) + 1  # the 100-day-old entry too
    assert counts["plans"] == len(seeded.doomed["plans"])  # the recent plans are an hour old


@pytest.mark.parametrize("value", ["3x", "-1d", "0", ""])
def test_cli_bad_duration_exits_2_naming_the_option(cli_scene, value):
    config, _, _ = cli_scene
    done = _cli(config, "--older-than", value)
    assert done.returncode == 2 and "--older-than" in done.stderr, done.stderr


def test_cli_bad_retention_config_exits_2_naming_file_and_key(tmp_path):
    config = tmp_path / "vmplacer.yaml"
    config.write_text(f"database_url: sqlite:///{tmp_path / 'v.db'}\nretention: {{jobs: soon}}\n")
    done = _cli(config, "--dry-run")
    assert done.returncode == 2
    assert str(config) in done.stderr and "key 'retention.jobs'" in done.stderr, done.stderr


# ----- systemd ----------------------------------------------------------------------------------------------
def _unit(name: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in (ROOT / "systemd" / name).read_text().splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def test_prune_units_are_hardened_and_daily(tmp_path):
    service = _unit("vmplacer-prune.service")
    assert service["Type"] == ["oneshot"]
    assert [v.split()[-2:] for v in service["ExecStart"]] == [["db", "prune"]]
    for key, value in {"ProtectSystem": "strict", "NoNewPrivileges": "yes", "PrivateTmp": "yes",
                       "ProtectHome": "yes", "PrivateDevices": "yes", "RestrictSUIDSGID": "yes",
                       "MemoryDenyWriteExecute": "yes", "CapabilityBoundingSet": "", "User": "vmplacer"}.items():
        assert service.get(key) == [value], key
    assert service["ReadWritePaths"] == ["/var/lib/vmplacer"]  # no libvirt socket: it touches no host
    assert service["Environment"] == ["VMPLACER_CONFIG=/etc/vmplacer/vmplacer.yaml"]
    assert "SystemCallFilter" in service
    timer = _unit("vmplacer-prune.timer")
    assert timer["OnCalendar"] == ["daily"] and timer["Persistent"] == ["true"]
    assert timer["RandomizedDelaySec"] and timer["WantedBy"] == ["timers.target"]
    problems = systemd_verify_problems([ROOT / "systemd" / "vmplacer-prune.timer",
                                        ROOT / "systemd" / "vmplacer-prune.service"], tmp_path)
    assert not problems, problems
