"""Operator YAML is read by libyaml's parser where PyYAML has it, with the same results as the
pure-Python one: the same data, the same duplicate keys (lines and columns), and for text
that does not parse, the pure-Python parser's own message."""

from __future__ import annotations

import pytest
import yaml

from vmplacer.adapters import source_files
from vmplacer.adapters.source_files import UniqueKeyLoader, YamlFileError, load_yaml_with_duplicates

SAMPLES = [
    "hosts:\n  - {name: a, uri: 'test:///default'}\n  - name: b\n    uri: qemu:///system\n    reserved_cpus: \"0\"\n",
    "rebalance:\n  search: {memory_budget_mib: 1024}\n  search: {host_budget_s: 10}\nhosts: []\nhosts: [x]\n",
    "a: yes\nb: 1e3\nc: 0o17\nd: ~\ne: 2026-12-07\nf: !!str 5\ng: [1, {h: i}]\n",
]


def python_reading(text: str):
    loader = UniqueKeyLoader(text)
    try:
        return loader.get_single_data(), loader.duplicates
    finally:
        loader.dispose()


@pytest.mark.parametrize("text", SAMPLES)
def test_the_same_data_and_duplicates_as_the_pure_python_parser(text):
    assert load_yaml_with_duplicates(text) == python_reading(text)


def test_libyaml_reads_configs():
    # the pinned PyYAML wheels carry libyaml; a build without it would read 10x slower
    assert yaml.__with_libyaml__
    assert source_files.FastUniqueKeyLoader.__mro__[1] is yaml.CSafeLoader


def test_text_that_does_not_parse_is_told_in_the_pure_python_parsers_words():
    with pytest.raises(YamlFileError) as caught:
        load_yaml_with_duplicates("hosts: [a, b\nx: 1\n")
    with pytest.raises(yaml.YAMLError) as direct:
        python_reading("hosts: [a, b\nx: 1\n")
    assert caught.value.problems == (source_files.yaml_problem(direct.value),)
    assert "line 2" in caught.value.problems[0]
