"""docs/postgresql.md's set-up, done for real: a role that is no superuser and may not create roles,
owning a database made as the page makes it (UTF8 from template0, closed to PUBLIC), is all
`vmplacer db upgrade` needs; the schema is created, `db current` reports the newest revision, a
token can be made, and the password stays out of `config show` and out of the one-line refusal
of a wrong one. The test server's own role (no superuser, no CREATEROLE) stands for the page's
`vmplacer` role; the page's `createdb` options are run as their SQL."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from tests.conftest import POSTGRES_ENV
from tests.support import clean_env, require, run_vmplacer

pytestmark = pytest.mark.postgres


@pytest.fixture
def role_url():
    """(URL of a fresh database owned by the role, the role's password)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin_url = os.environ.get(POSTGRES_ENV)
    require(bool(admin_url), f"{POSTGRES_ENV} is not set (make test starts PostgreSQL and sets it)")
    base = make_url(str(admin_url))
    name = f"vmplacer_doc_{uuid.uuid4().hex[:10]}"
    admin = create_engine(str(admin_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            role = connection.execute(text("SELECT rolsuper, rolcreaterole FROM pg_roles "
                                           "WHERE rolname = current_user")).one()
            connection.execute(text(f'CREATE DATABASE "{name}" OWNER "{base.username}" ENCODING \'UTF8\' '
                                    "TEMPLATE template0"))
            connection.execute(text(f'REVOKE ALL ON DATABASE "{name}" FROM PUBLIC'))
    except Exception as exc:  # noqa: BLE001 - the server is not usable for this
        admin.dispose()
        require(False, f"PostgreSQL unusable: {exc}")
    assert not role.rolsuper and not role.rolcreaterole, "the test role must be as unprivileged as the page's"
    url = base.set(drivername="postgresql", database=name).render_as_string(hide_password=False)
    try:
        yield url, str(base.password)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_the_documented_role_creates_and_reads_the_schema(role_url, tmp_path):
    url, password = role_url
    env = clean_env({"VMPLACER_DATABASE_URL": url, "VMPLACER_DATA_DIR": str(tmp_path)})
    upgraded = run_vmplacer("db", "upgrade", env=env, cwd=tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr
    current = run_vmplacer("db", "current", "--format", "json", env=env, cwd=tmp_path)
    assert current.returncode == 0, current.stderr
    revision = json.loads(current.stdout)
    assert revision["current"] == revision["head"] and revision["head"]
    shown = run_vmplacer("config", "show", env=env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f":{password}@" not in shown.stdout and ":***@" in shown.stdout
    token = run_vmplacer("token", "create", "orchestrator", "--scope", "read", env=env, cwd=tmp_path)
    assert token.returncode == 0 and token.stdout.strip(), token.stderr


def test_a_wrong_password_is_one_line_and_exit_1(role_url, tmp_path):
    url, password = role_url
    from sqlalchemy.engine import make_url

    wrong = make_url(url).set(password="not-the-password").render_as_string(hide_password=False)
    env = clean_env({"VMPLACER_DATABASE_URL": wrong, "VMPLACER_DATA_DIR": str(tmp_path)})
    done = run_vmplacer("db", "current", env=env, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "password authentication failed" in done.stderr, done.stderr
    assert ":not-the-password@" not in done.stderr and ":***@" in done.stderr
