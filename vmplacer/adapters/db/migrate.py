"""Run Alembic migrations programmatically (`vmplacer db upgrade`, tests, start-up checks)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from vmplacer.resources import resource_dir

MIGRATIONS_DIR = resource_dir("migrations")


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    head = script.get_current_head()
    assert head is not None, "migrations directory has no revisions"
    return head


def known_revisions() -> list[tuple[str, str]]:
    """(revision, what it does) of every migration this code ships, oldest first."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return [(rev.revision, (rev.doc or "").strip().splitlines()[0] if rev.doc else "")
            for rev in reversed(list(script.walk_revisions()))]


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
