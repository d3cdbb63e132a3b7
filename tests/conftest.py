"""Database fixtures: every test that needs a database runs the real Alembic
migrations against SQLite and, where named, a real PostgreSQL server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from sqlalchemy.engine import make_url

from tests.support import require
from vmplacer.testbed.postgres import scratch_database

POSTGRES_ENV = "VMPLACER_TEST_POSTGRES_URL"


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'vmplacer.db'}"


def _postgres_admin_url() -> str | None:
    return os.environ.get(POSTGRES_ENV)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    admin_url = _postgres_admin_url()
    require(bool(admin_url), f"{POSTGRES_ENV} is not set (make test starts PostgreSQL and sets it)")
    assert admin_url is not None
    with ExitStack() as stack:
        try:
            url = stack.enter_context(scratch_database(admin_url, "vmplacer_test"))
        except Exception as exc:  # noqa: BLE001 - any failure means the server is not usable
            require(False, f"PostgreSQL at {make_url(admin_url).render_as_string()} unusable: {exc}")
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request) -> str:
    """Run the test once on SQLite and once on PostgreSQL."""
    return request.getfixturevalue(f"{request.param}_url" if request.param == "sqlite" else "postgres_url")


@pytest.fixture
def migrated_url(database_url) -> str:
    """`database_url`, migrated to the newest revision by Alembic: for tests that open engines
    of their own (two instances on one database, a runner in another thread)."""
    from vmplacer.adapters.db import migrate

    migrate.upgrade(database_url)
    return database_url


@pytest.fixture
def sessions(migrated_url):  # type: ignore[no-untyped-def]
    """A session factory on a database migrated to the newest revision by Alembic, once on
    SQLite and once on PostgreSQL (`database_url`)."""
    from vmplacer.adapters.db.engine import make_engine, make_session_factory

    engine = make_engine(migrated_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def db(sessions):  # type: ignore[no-untyped-def]
    """`sessions`, under the name the tests of simulated hosts use."""
    return sessions
