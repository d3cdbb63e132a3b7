"""`vmplacer db prune --older-than` through the console script: an age is a number and its unit
(s, m, h, d); `30` alone is refused before anything is read or deleted — one line, exit 2, naming
the option and the units — where it once meant 30 seconds, every finished record but the newest."""

from __future__ import annotations

import json

from tests.functional.test_api_helpers import vmplacer, write_config


def test_an_age_without_a_unit_is_refused_in_one_line_and_nothing_is_touched(tmp_path):
    database = tmp_path / "prune.db"
    config = write_config(tmp_path, f"sqlite:///{database}", [{"name": "t", "uri": "test:///default"}])
    done = vmplacer(config, "db", "prune", "--older-than", "30")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr == ("vmplacer: error: argument --older-than: '30' has no unit: write one of s, m, h, d, "
                           "e.g. 30d or 30h (a bare number is refused here: read as seconds it would keep almost "
                           "nothing) (`vmplacer db prune --help` lists the options)\n")
    assert not database.exists()  # refused before the database was opened


def test_an_age_with_its_unit_prunes(tmp_path):
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'prune.db'}", [{"name": "t", "uri": "test:///default"}])
    assert vmplacer(config, "db", "upgrade").returncode == 0
    for age, seconds in (("30d", 30 * 86_400), ("12h", 43_200), ("90m", 5400), ("3600s", 3600)):
        done = vmplacer(config, "db", "prune", "--older-than", age, "--dry-run", "--format", "json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["older_than_s"]["plans"] == seconds
