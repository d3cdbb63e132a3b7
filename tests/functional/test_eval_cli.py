"""`vmplacer eval model|rank` in-process and through the real console script."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support import run_vmplacer
from vmplacer.cli.main import main

DATA = Path(__file__).resolve().parents[1] / "data"
MATRICES = sorted((DATA / "interference").glob("*_pairs.csv"))
PROFILES = DATA / "profiles" / "synthetic_counter_profiles.csv"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer(*args)


@pytest.mark.parametrize("matrix", MATRICES, ids=lambda p: p.stem)
def test_eval_model_in_process(matrix, capsys):
    code = main(["eval", "model", "--pairs", str(matrix), "--cores", "8", "--trials", "8", "--rounds", "2",
                 "--seed", "3", "--format", "json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert {"model_rrmse", "linear_rrmse", "trials", "matrix"} <= set(data)
    assert data["matrix"] == matrix.name and data["trials"] == 8
    assert 0 < data["model_rrmse"] < data["linear_rrmse"]


HOST_SIZES = list(zip(MATRICES, ["2", "16", "8"]))  # every matrix once, every host size once


@pytest.mark.parametrize(("matrix", "cores"), HOST_SIZES, ids=lambda v: getattr(v, "stem", v))
def test_eval_model_console_script(matrix, cores):
    result = run("eval", "model", "--pairs", str(matrix), "--cores", cores, "--trials", "5",
                 "--vms-per-core", "1-3", "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["cores"] == int(cores) and data["vms_per_core"] == "1-3"
    assert data["model_rrmse"] < data["linear_rrmse"]


def test_eval_model_is_reproducible_and_table_output_names_the_numbers(capsys):
    args = ["eval", "model", "--pairs", str(MATRICES[0]), "--cores", "2", "--trials", "6", "--seed", "9"]
    assert main([*args, "--format", "json"]) == 0
    first = capsys.readouterr().out
    assert main([*args, "--format", "json"]) == 0
    assert capsys.readouterr().out == first
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "model R_rmse" in table and "linear R_rmse" in table and MATRICES[0].name in table


def test_eval_model_accepts_long_pairs_and_distance_factors(tmp_path, capsys):
    long_file = tmp_path / "long.csv"
    long_file.write_text(
        "# two distance classes measured\n"
        "distance,foreground,background,perf_alone,perf_shared\n"
        + "".join(
            f"{dist},{fg},{bg},1.0,{1 - loss * (1 if dist == 'same-llc' else 0.4):.4f}\n"
            for dist in ("same-llc", "remote-node")
            for fg, bg, loss in [("A", "A", 0.1), ("A", "B", 0.3), ("B", "A", 0.2), ("B", "B", 0.05)]
        )
    )
    code = main(["eval", "model", "--pairs", str(long_file), "--cores", "16", "--trials", "6",
                 "--distance-factor", "same-node=0.5", "--format", "json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["matrix"] == "long.csv" and data["distance_factors"]["same-node"] == 0.5
    assert data["model_rrmse"] < data["linear_rrmse"] / 4


def test_eval_rank_in_process_and_console(capsys):
    matrix = DATA / "interference" / "exynos4412_arm_pairs.csv"
    assert main(["eval", "rank", "--pairs", str(matrix), "--profiles", str(PROFILES), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["workloads"]) == 9
    for target in ("sensitivity", "interference"):
        assert -1.0 <= data[target]["spearman"] <= 1.0
        assert data[target]["counters"] and all(c["chosen_in"] >= 1 for c in data[target]["counters"])
    result = run("eval", "rank", "--pairs", str(matrix), "--profiles", str(PROFILES))
    assert result.returncode == 0, result.stderr
    assert "Spearman" in result.stdout and "sensitivity" in result.stdout


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        ("background,A,B\nA,1,x\n", ":2: field 'B'"),
        ("nonsense\n", ":1:"),
        ("distance,foreground,background,perf_alone,perf_shared\nsame-llc,A,B,-1,1\n", ":2: field 'perf_alone'"),
    ],
)
def test_bad_pair_files_exit_2_naming_file_line_and_field(tmp_path, content, expect, capsys):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    assert main(["eval", "model", "--pairs", str(path), "--trials", "1"]) == 2
    assert f"{path}{expect}" in capsys.readouterr().err


def test_bad_pair_file_through_the_console_script(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("background,A,B\nA,1\n")
    result = run("eval", "model", "--pairs", str(path))
    assert result.returncode == 2
    assert f"{path}:2:" in result.stderr and "1 values for 2 columns" in result.stderr


def test_usage_errors_exit_2(tmp_path, capsys):
    matrix = str(MATRICES[0])
    assert main(["eval", "model", "--pairs", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv" in capsys.readouterr().err
    assert main(["eval", "model", "--pairs", matrix, "--vms-per-core", "0-2"]) == 2
    assert "--vms-per-core" in capsys.readouterr().err
    assert main(["eval", "model", "--pairs", matrix, "--trials", "0"]) == 2
    assert main(["eval", "model", "--pairs", matrix, "--distance-factor", "far=2"]) == 2
    assert "--distance-factor" in capsys.readouterr().err
    bad_profiles = tmp_path / "p.csv"
    bad_profiles.write_text("workload,event,value\nA,cycles,ten\n")
    assert main(["eval", "rank", "--pairs", matrix, "--profiles", str(bad_profiles)]) == 2
    assert f"{bad_profiles}:2: field 'value'" in capsys.readouterr().err
    few = tmp_path / "few.csv"
    few.write_text("workload,event,value\nBLOSC,cycles,10\nBLOSC,instructions,5\n")
    assert main(["eval", "rank", "--pairs", matrix, "--profiles", str(few)]) == 2
    assert "at least 4" in capsys.readouterr().err
    assert main(["eval"]) == 2
