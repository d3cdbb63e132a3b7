"""`vmplacer model learn|show` through the console script on a real SQLite file."""

from __future__ import annotations

import json

from tests.functional.test_cli_basics import run
from tests.functional.test_learn_store import _run
from vmplacer.adapters.db import migrate
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.profiles import SqlProfileStore


def test_learn_then_show(tmp_path):
    env = {"VMPLACER_DATA_DIR": str(tmp_path)}
    empty = json.loads(run("model", "show", "--format", "json", env=env).stdout)
    assert empty["observations"] == 0 and empty["guests"] == []

    url = f"sqlite:///{tmp_path / 'vmplacer.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    run_id = _run(SqlProfileStore(make_session_factory(engine)), loss_of_a=0.3)
    engine.dispose()

    learned = run("model", "learn", "--format", "json", env=env)
    assert learned.returncode == 0, learned.stderr
    assert json.loads(learned.stdout)["runs"] == [run_id]
    shown = json.loads(run("model", "show", "--format", "json", env=env).stdout)
    assert shown["observations"] == 40 and shown["last_run_id"] == run_id
    by_guest = {g["guest"]: g for g in shown["guests"]}
    assert by_guest["a"]["sensitivity"] > by_guest["b"]["sensitivity"]

    bad = run("model", "learn", "--run", "999", env=env)
    assert bad.returncode == 2 and "999" in bad.stderr
