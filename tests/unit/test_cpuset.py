from __future__ import annotations

import pytest

from vmplacer.core.cpuset import CpusetError, format_cpuset, parse_cpuset


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
