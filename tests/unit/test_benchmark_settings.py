"""The rebalance benchmark's --setting: an experiment runs with exactly the settings it names."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("rebalance_benchmark", ROOT / "benchmarks" / "rebalance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_settings_are_typed_as_the_product_types_them(bench):
    assert bench.setting_overrides(["min_migration_gain=0.05", "trial_max=2"]) == {
        "min_migration_gain": 0.05, "trial_max": 2}
    assert isinstance(bench.setting_overrides(["trial_max=2"])["trial_max"], int)
    assert bench.setting_overrides([]) == {}


@pytest.mark.parametrize("pair, named", [
    ("min_gian=0.1", "no rebalance setting is called 'min_gian'"),
    ("min_gain=fast", "the value must be a number"),
    ("min_gain=-1", "field 'min_gain' must be a number >= 0"),
])
def test_a_bad_setting_stops_the_run_naming_it(bench, pair, named):
    with pytest.raises(SystemExit) as stopped:
        bench.setting_overrides([pair])
    assert named in str(stopped.value)


def test_the_model_form_is_chosen_recorded_and_never_mixed(bench, tmp_path):
    assert bench.model_config().form == "additive"
    assert bench.model_config("multiplicative").form == "multiplicative"
    parts = []
    for form in ("additive", "multiplicative"):
        part = tmp_path / f"{form}.json"
        part.write_text(json.dumps({"cases": [], "model_form": form, "load_average": {"start": [0, 0, 0]}}))
        parts += ["--rows-from", str(part)]
    with pytest.raises(SystemExit, match="different model forms"):
        bench.main([*parts, "--out", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()
