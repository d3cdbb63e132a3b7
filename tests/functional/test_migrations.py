"""Alembic migrations on real SQLite and real PostgreSQL: up, down, and no drift from the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from vmplacer.adapters.db import migrate
from vmplacer.adapters.db.engine import make_engine
from vmplacer.adapters.db.models import Base

TABLES = {"hosts", "placements", "cpu_claims", "audit_log"}


def test_upgrade_to_head_then_downgrade_to_base(database_url):
    migrate.upgrade(database_url, "head")
    engine = make_engine(database_url)
    try:
        assert TABLES <= set(inspect(engine).get_table_names())
        assert migrate.current_revision(engine) == migrate.head_revision()
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        assert diff == [], f"models and migrations differ: {diff}"
        migrate.downgrade(database_url, "base")
        remaining = set(inspect(engine).get_table_names()) - {"alembic_version"}
        assert remaining == set()
        assert migrate.current_revision(engine) is None
        migrate.upgrade(database_url, "head")  # and back up again: migrations are repeatable
        assert TABLES <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_sqlite_uses_wal(sqlite_url):
    migrate.upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
    engine.dispose()


def test_claims_survive_the_guest_name_rebuild(database_url):
    """Widening guest names rebuilds `placements` on SQLite: its CPU claims must not cascade away."""
    migrate.upgrade(database_url, "0010")
    engine = make_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO hosts (id, name, uri, created_at) VALUES (1, 'h1', 'test:///', "
                                    "CURRENT_TIMESTAMP)"))
            connection.execute(text(
                "INSERT INTO placements (id, guest, host_id, state, vcpus, memory_kib, spec, placement, created_at, "
                "updated_at) VALUES (7, 'a', 1, 'defined', 2, 65536, '{}', '{}', CURRENT_TIMESTAMP, "
                "CURRENT_TIMESTAMP)"))
            connection.execute(text("INSERT INTO cpu_claims (host_id, cpu, placement_id) VALUES (1, 0, 7), (1, 1, 7)"))
        migrate.upgrade(database_url, "0011")
        with engine.connect() as connection:
            claims = connection.execute(text("SELECT cpu FROM cpu_claims WHERE placement_id = 7 ORDER BY cpu"))
            assert [row[0] for row in claims] == [0, 1]
            if engine.dialect.name == "sqlite":
                assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
        migrate.downgrade(database_url, "0010")  # short names fit the old width again
        with engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM cpu_claims")).scalar() == 2
    finally:
        engine.dispose()


def test_a_251_byte_guest_name_is_stored_by_every_store(postgres_url):
    """PostgreSQL enforces column widths: libvirt's longest domain name fits every guest column."""
    from vmplacer.adapters.db.engine import make_session_factory
    from vmplacer.adapters.db.placements import SqlPlacementStore
    from vmplacer.adapters.db.plans import SqlPlanStore
    from vmplacer.adapters.db.profiles import SqlProfileStore
    from vmplacer.adapters.db.throttles import SqlThrottleLedger
    from vmplacer.core.placement.bandwidth import CpuBandwidth, throttled_to
    from vmplacer.core.placement.guest_placement import Placement
    from vmplacer.core.rebalance.plan import Action, Plan
    from vmplacer.ports import ProfileSample

    name = "é" * 125 + "x"  # 251 bytes of UTF-8, 126 characters
    other = "g" * 251
    assert len(name.encode()) == 251
    migrate.upgrade(postgres_url)
    engine = make_engine(postgres_url)
    try:
        sessions = make_session_factory(engine)
        placements = SqlPlacementStore(sessions)
        placement = Placement(guest=other, host="h1", vcpupin={0: frozenset({0})}, memory_nodes=frozenset({0}),
                              memory_kib=65536, dedicated=True, exclusive_cpus=frozenset({0}))
        placements.record("h1", "test:///default", placement, {"name": other})
        placements.audit(action="place", outcome="ok", host="h1", guest=name, message="")
        assert placements.get(other)["claims"] == [0]

        ledger = SqlThrottleLedger(sessions)
        ledger.note("h1", name, throttled_to(0.4), CpuBandwidth(), protects=other, plan_id=None)
        assert [(t.guest, t.protects) for t in ledger.current("h1")] == [(name, other)]

        profiles = SqlProfileStore(sessions)
        run = profiles.start_run("h1", "ipc", {})
        profiles.add_samples(run, [ProfileSample(name, "zeta", "ipc", 1.0, 0.1, 5.0, 1_700_000_000.0)])
        assert [s["guest"] for s in profiles.samples(run)] == [name]

        plans = SqlPlanStore(sessions)
        saved = plans.save(Plan(actions=(Action(index=0, kind="probe", host="h1", guest=name),), hosts=("h1",)))
        assert saved.id is not None
        assert [a.guest for a in plans.get(saved.id).actions] == [name]
        with engine.connect() as connection:
            stored = connection.execute(text("SELECT guest FROM audit_log")).scalars().all()
        assert stored == [name]
    finally:
        engine.dispose()
