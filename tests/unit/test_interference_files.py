"""Reading pair files (matrix and long form) and counter profiles: values and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmplacer.core.model.counter_profiles import ProfileFileError, parse_profiles
from vmplacer.core.model.pairs import PairFileError, parse_pairs
from vmplacer.core.topology.host import DistanceClass

DATA = Path(__file__).resolve().parents[1] / "data"
MATRICES = sorted((DATA / "interference").glob("*_pairs.csv"))


def test_the_shipped_matrices_parse():
    assert len(MATRICES) == 3
    for path in MATRICES:
        table = parse_pairs(path.read_text(), path.name)
        n = len(table.workloads)
        assert n >= 6 and len(table.losses) == n * n
        assert table.distances == {None}


def test_matrix_values_are_fractions_of_the_column_workload():
    table = parse_pairs((DATA / "interference" / "e7600_2core_pairs.csv").read_text(), "e7600")
    # row SDAGP (background), column MATRIX (foreground): 37.1 %
    assert table.loss("SDAGP", "MATRIX") == pytest.approx(0.371)
    assert table.loss("MATH", "MATRIX") == pytest.approx(-0.027)  # a small speed-up, kept
    # seed ch. 4: sensitivity = column mean, interference = row mean
    column = [12.1, 37.1, 41.8, -2.7, 11.0, 43.3]
    row = [11.4, 25.9, 41.8, 0.3, 7.5, 13.0]
    assert table.sensitivity()["MATRIX"] == pytest.approx(sum(column) / 600)
    assert table.interference()["MATRIX"] == pytest.approx(sum(row) / 600)


def test_long_pairs_average_repeats_and_carry_distances():
    text = """# comment
distance,foreground,background,perf_alone,perf_shared
same-llc,A,B,2.0,1.5
same-llc,A,B,2.0,1.7
remote_node,A,B,1.0,0.9

,B,A,1.0,1.0
"""
    table = parse_pairs(text, "long.csv")
    assert table.loss("B", "A", DistanceClass.SAME_LLC) == pytest.approx(0.2)
    assert table.loss("B", "A", DistanceClass.REMOTE_NODE) == pytest.approx(0.1)
    assert table.loss("A", "B", None) == 0.0
    assert table.workloads == ("A", "B")
    assert table.mean_loss_by_pair()[("B", "A")] == pytest.approx(0.15)


def test_columns_of_a_long_file_may_come_in_any_order():
    for header in ("background,foreground,distance,perf_shared,perf_alone",
                   "foreground,background,distance,perf_shared,perf_alone"):
        first, second = ("B", "A") if header.startswith("background") else ("A", "B")
        table = parse_pairs(f"{header}\n{first},{second},same-core,0.5,1.0\n", "x.csv")
        assert table.loss("B", "A", DistanceClass.SAME_CORE) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        ("", None, None, "no header"),
        ("# only comments\n", None, None, "no header"),
        ("workload,x\nA,1\n", 1, None, "header must start"),
        ("background,A,B\nA,1,x\n", 2, "B", "not a number"),
        ("background,A,B\nA,1\n", 2, None, "1 values for 2 columns"),
        ("background,A,B\nA,1,2\nA,3,4\n", 3, "background", "repeats"),
        ("background,A,A\nA,1,2\n", None, "header", "twice"),
        ("background,A\nA,150\n", 2, "A", "outside"),
        ("background,A\n", None, None, "no background rows"),
        ("distance,foreground,background,perf_alone,perf_shared\nnear,A,B,1,1\n", 2, "distance", "near"),
        ("distance,foreground,background,perf_alone,perf_shared\nsame-cpu,A,B,1,1\n", 2, "distance", "same-cpu"),
        ("distance,foreground,background,perf_alone,perf_shared\nsame-llc,A,B,0,1\n", 2, "perf_alone", "> 0"),
        ("distance,foreground,background,perf_alone,perf_shared\nsame-llc,A,,1,1\n", 2, "background", "empty"),
        ("distance,foreground,background,perf_alone,perf_shared\nsame-llc,A,B,1\n", 2, None, "fields"),
    ],
)
def test_bad_pair_files_name_the_line_and_field(text, line, field, words):
    with pytest.raises(PairFileError) as error:
        parse_pairs(text, "bad.csv")
    message = str(error.value)
    assert message.startswith("bad.csv" if line is None else f"bad.csv:{line}:")
    assert words in message
    assert error.value.line == line and error.value.field == field


def test_profiles_parse_and_normalise_by_cycles():
    text = ("# c\nworkload,event,value\nA,cycles,1000\nA,instructions,1500\nA,LLC-stores,20\n"
            "B,cycles,10\nB,instructions,5\n")
    profiles = parse_profiles(text, "p.csv")
    assert profiles.workloads == ("A", "B")
    assert profiles.rates()["A"] == {"instructions": 1.5, "LLC-stores": 0.02}
    assert profiles.rates()["B"] == {"instructions": 0.5}


def test_the_synthetic_profiles_cover_the_shipped_workloads():
    profiles = parse_profiles((DATA / "profiles" / "synthetic_counter_profiles.csv").read_text(), "synthetic")
    for path in MATRICES:
        table = parse_pairs(path.read_text(), path.name)
        assert set(table.workloads) <= set(profiles.workloads)


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("workload,value\nA,1\n", None, "header"),
        ("workload,event,value\nA,cycles,-1\n", "value", ">= 0"),
        ("workload,event,value\nA,cycles,many\n", "value", "not a number"),
        ("workload,event,value\nA,cycles,1\nA,cycles,2\n", "event", "repeats line 2"),
        ("workload,event,value\nA,instructions,1\n", "cycles", "'A'"),
        ("workload,event,value\n", None, "no counts"),
    ],
)
def test_bad_profile_files_name_the_field(text, field, words):
    with pytest.raises(ProfileFileError) as error:
        parse_profiles(text, "prof.csv")
    assert str(error.value).startswith("prof.csv")
    assert words in str(error.value) and error.value.field == field
