"""Scratch PostgreSQL databases (vmplacer.testbed.postgres): the one helper the tests' fixture
and the plan-store benchmark create and drop their databases with."""

from __future__ import annotations

import os

import pytest
from sqlalchemy import create_engine, make_url, text

from tests.conftest import POSTGRES_ENV
from tests.support import require
from vmplacer.testbed.postgres import scratch_database


@pytest.mark.parametrize("prefix", ["", "Upper", "9starts_with_digit", 'quote"d', "semi;colon", "x" * 42])
def test_a_prefix_that_is_not_a_plain_identifier_is_refused_before_anything_is_created(prefix):
    with pytest.raises(ValueError, match="scratch database prefix"):
        with scratch_database("postgresql://nobody@127.0.0.1:1/none", prefix):
            pass


def test_the_database_exists_inside_and_is_gone_after_even_with_a_connection_left_open():
    admin_url = os.environ.get(POSTGRES_ENV)
    require(bool(admin_url), f"{POSTGRES_ENV} is not set (make test starts PostgreSQL and sets it)")
    assert admin_url is not None
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")

    def exists(name: str) -> bool:
        with admin.connect() as connection:
            return connection.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first() is not None

    try:
        with scratch_database(admin_url, "vmplacer_scratch") as url:
            name = make_url(url).database
            assert name.startswith("vmplacer_scratch_") and exists(name)
            left_open = create_engine(url)
            with left_open.connect() as connection:
                connection.execute(text("CREATE TABLE t (x int)"))
                connection.commit()
            held = left_open.connect()  # a pool the caller forgot to dispose of
        assert not exists(name)
        held.close()
        left_open.dispose()
    finally:
        admin.dispose()
