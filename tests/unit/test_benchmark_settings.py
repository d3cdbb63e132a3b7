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
    assert bench.setting_overrides(["trials=1"]) == {"trials": True}
    assert bench.setting_overrides(["trials=0"]) == {"trials": False}
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


def test_the_settings_a_run_overrode_are_recorded_and_parts_never_mixed(bench, tmp_path):
    parts = []
    for name, settings in (("a", {"backoff_s": 600.0}), ("b", {})):
        part = tmp_path / f"{name}.json"
        part.write_text(json.dumps({"cases": [], "model_form": "additive", "settings": settings,
                                    "load_average": {"start": [0, 0, 0]}}))
        parts += ["--rows-from", str(part)]
    with pytest.raises(SystemExit, match="different --setting overrides"):
        bench.main([*parts, "--quick", "--out", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()
    bench.main([*parts[:2], "--quick", "--out", str(tmp_path / "out.json")])
    assert json.loads((tmp_path / "out.json").read_text())["settings"] == {"backoff_s": 600.0}


def test_the_summary_counts_only_the_steps_a_perfect_model_would_take_as_the_models_misses(bench):
    def row(seed, gap, within):
        return {"matrix": "m.csv", "shape": "s", "start": "random", "seed": seed,
                "objective_optimum": {"fairness": 0.25, "objective_per_vm": 0.5, "vmplacer_objective_per_vm": 0.5 - gap,
                                      "step": {"true_gain": 8 * gap, "threshold": 0.04, "within_threshold": within}}}
    summary = bench.objective_optimum_summary([row(0, 0.0, True), row(1, 0.004, True), row(2, 0.015, False),
                                               row(3, 0.0, False),  # at the optimum: no step (threshold 0)
                                               {"matrix": "m.csv", "objective_optimum": None}])
    assert (summary["cases"], summary["cases_a_perfect_model_would_move"]) == (4, 1)
    assert summary["gap_per_vm_max"] == 0.015 and summary["gap_per_vm_mean"] == pytest.approx(0.019 / 4, abs=1e-4)
    assert [entry["seed"] for entry in summary["list"]] == [2]
    assert bench.objective_optimum_summary([{"matrix": "m.csv"}]) is None


def test_trial_counts_are_summed_over_the_cases_and_close_calls_counted(bench):
    from vmplacer.lab.rebalance_eval import trial_summary
    from vmplacer.core.rebalance.plan import Action, Plan
    from vmplacer.core.rebalance.trial import CLOSE_CALL_NOTE

    def probe(index: int, kind: str, state: str, message: str) -> Action:
        return Action(index, "probe", "h", parameters={"trial": {"kind": kind}}, state=state, message=message)

    plan = Plan(actions=(probe(0, "confirm", "succeeded", "measured …: kept"),
                         probe(1, "explore", "rolled_back", f"measured …: undone (explore); {CLOSE_CALL_NOTE}"),
                         probe(2, "confirm", "rolled_back", f"measured …: undone; {CLOSE_CALL_NOTE}")), hosts=("h",))
    counts = trial_summary([plan])
    assert counts == {"explored": 1, "kept": 0, "undone": 1, "confirmed": 1, "moves_undone": 1, "rechecked": 2}
    rows = [{"trials": counts}, {"trials": {**counts, "rechecked": 0}}, {"trials": None}]
    assert bench.trial_totals(rows) == {"confirmed": 2, "explored": 2, "kept": 0, "moves_undone": 2, "rechecked": 2,
                                        "undone": 2}
