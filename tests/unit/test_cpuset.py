from __future__ import annotations

import pytest

from vmplacer.core.topology.cpuset import CpusetError, format_cpuset, parse_cpumask, parse_cpuset


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", set()),
        ("0", {0}),
        ("0-3", {0, 1, 2, 3}),
        ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}),
        ("0-7,^2,^4-5", {0, 1, 3, 6, 7}),
        (" 1 , 3\n", {1, 3}),
    ],
)
def test_parse(text, cpus):
    assert parse_cpuset(text) == cpus


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "-1", "1,,x"])
def test_parse_rejects_garbage_naming_it(text):
    with pytest.raises(CpusetError) as excinfo:
        parse_cpuset(text)
    assert repr(text) in str(excinfo.value) or text.strip(",") in str(excinfo.value)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [(set(), ""), ({5}, "5"), ({0, 1, 2, 3, 8}, "0-3,8"), ({1, 3, 5}, "1,3,5"), ({2, 3}, "2-3")],
)
def test_format_round_trips(cpus, text):
    assert format_cpuset(cpus) == text
    assert parse_cpuset(text) == cpus


# ----- kernel hex masks (shared_cpu_map, thread_siblings, node cpumap) -----------------------

@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", set()),
        ("0\n", set()),
        ("3", {0, 1}),
        ("00000000,0000ff00", set(range(8, 16))),
        ("ff,00000001", {0, *range(32, 40)}),  # a short first word: the top bits
        ("00000001,00000000,00000000", {64}),
        ("80000000", {31}),
        ("0000000000000003", {0, 1}),  # one word: any width
    ],
)
def test_parse_cpumask(text, cpus):
    assert parse_cpumask(text) == cpus


@pytest.mark.parametrize("text", ["xyz", "1,123456789", "1,,2", "0-3"])
def test_parse_cpumask_rejects_garbage_naming_the_word(text):
    with pytest.raises(CpusetError, match=r"bad CPU mask word .* in "):
        parse_cpumask(text)


def test_mask_and_list_of_the_same_cpus_agree():
    cpus = {0, 5, 31, 32, 63, 64, 100}
    words = []
    value = sum(1 << c for c in cpus)
    while value:
        words.append(f"{value & 0xFFFFFFFF:08x}")
        value >>= 32
    assert parse_cpumask(",".join(reversed(words))) == parse_cpuset(format_cpuset(cpus)) == cpus
