"""Scratch PostgreSQL databases: one created per test or benchmark run on the server of an
admin URL and dropped after it, so runs never share rows or schema versions."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, make_url, text

_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,40}")


@contextmanager
def scratch_database(admin_url: str, prefix: str) -> Iterator[str]:
    """The URL of a new empty database named `prefix`_<random>, dropped on exit (its client
    connections ended first: a pool left open must not keep the database alive)."""
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"scratch database prefix {prefix!r}: lower-case letters, digits and '_', "
                         "not starting with a digit, at most 41 characters")
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as connection:
                connection.execute(
                    # client backends only: autovacuum workers belong to the superuser (DROP DATABASE stops them)
                    text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = :n AND backend_type = 'client backend' AND pid <> pg_backend_pid()"),
                    {"n": name},
                )
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    finally:
        admin.dispose()
