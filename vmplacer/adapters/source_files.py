"""Reading operator YAML files (config, request files) so that every error names the file and
the line: PyYAML says `"<unicode string>"` for text parsed from memory, which tells an operator
nothing (adapters/xml_errors.py does the same for lxml's `(<string>, line 1)`).

YAML is read with a SafeLoader that refuses duplicate keys (PyYAML silently keeps the last,
so a second `hosts:` would drop the first without a word); every duplicate is reported at once.
"""

from __future__ import annotations

from typing import Any

import yaml

_LIMIT = 200  # longest parser message quoted: the parsers echo element and key names from the file


def _bounded(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _LIMIT else text[:_LIMIT] + "…"


class YamlFileError(ValueError):
    """A YAML document that cannot be read; `problems` holds one line per problem, each with its line."""

    def __init__(self, problems: list[str]):
        self.problems = tuple(problems)
        super().__init__("; ".join(problems))


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that notes every duplicate key (with both lines) instead of keeping the last."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self.duplicates: list[str] = []


# The same loader on libyaml's parser where PyYAML was built with it: a config of 10,000 hosts
# parses in a tenth of the time. Text it refuses is parsed again by the pure-Python one, whose
# messages (and only those) an operator is shown, the same on every machine.
_FAST_BASE = getattr(yaml, "CSafeLoader", None) if getattr(yaml, "__with_libyaml__", False) else None


class FastUniqueKeyLoader(*((_FAST_BASE,) if _FAST_BASE is not None else (yaml.SafeLoader,))):  # type: ignore[misc]
    """UniqueKeyLoader on libyaml's parser (the same constructor: the same data and duplicates)."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self.duplicates: list[str] = []


def _construct_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            seen = first_line.get(key)
        except TypeError:  # an unhashable key: construct_mapping refuses it with PyYAML's own words
            continue
        line = key_node.start_mark.line + 1
        if seen is not None:
            loader.duplicates.append(f"line {line}, column {key_node.start_mark.column + 1}: duplicate key "
                                     f"{_bounded(repr(key))} (first at line {seen})")
        else:
            first_line[key] = line
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
FastUniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """'invalid YAML at line 2, column 11: expected ',' or ']' ... (while parsing a flow sequence
    from line 2)': the line PyYAML points at, without its "<unicode string>" and source excerpt."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    also = ""
    if context:
        also = f" ({_bounded(context)}" + (f" from line {context_mark.line + 1}" if context_mark is not None else "") + ")"
    return f"invalid YAML{where}: {_bounded(problem)}{also}"


def load_yaml(text: str) -> Any:
    """The document in `text`; YamlFileError (each problem with its line) for bad YAML or any
    duplicate key."""
    data, duplicates = load_yaml_with_duplicates(text)
    if duplicates:
        raise YamlFileError(duplicates)
    return data


def load_yaml_with_duplicates(text: str) -> tuple[Any, list[str]]:
    """The document in `text` (a duplicate key's last value in it) and one line per duplicate key,
    for a reader that goes on to report the document's other problems too before refusing it.
    YamlFileError for YAML that does not parse."""
    fast = FastUniqueKeyLoader(text)
    try:
        return fast.get_single_data(), fast.duplicates
    except yaml.YAMLError:
        pass  # told below in the pure-Python parser's words
    finally:
        fast.dispose()
    loader = UniqueKeyLoader(text)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise YamlFileError([yaml_problem(exc)]) from None
    finally:
        loader.dispose()
    return data, loader.duplicates
