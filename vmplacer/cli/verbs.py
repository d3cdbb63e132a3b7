"""Noun-verb grammar for the commands whose verb may be left out.

`vmplacer profile run VM...`, `vmplacer plans show 12`, `vmplacer protect status`: the verb comes
right after the command. The older spellings without it (`profile VM...`, `plans 12`, `plans`,
`protect`) still work for this release, each with one deprecation line on stderr naming the new
spelling: a first word that is no verb belongs to the default verb. A word that is both a verb
and a name (a VM called `show`) is the verb; the explicit form (`profile run show`) says the name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vmplacer.cli.common import WORDS_ANYWHERE, UsageError
from vmplacer.core.text import excerpt


ACTION_WORDS = "action_words"  # the parser attribute listing its actions (for shell completion)


def words_anywhere(parser: argparse.ArgumentParser, dest: str, verbs: Sequence[str]) -> None:
    """Let the words of positional `dest` (nargs="*"), which start with one of `verbs`, also come
    after options: argparse alone refuses `plans show --format json 12` ("unrecognized arguments: 12")."""
    setattr(parser, WORDS_ANYWHERE, dest)
    setattr(parser, ACTION_WORDS, tuple(verbs))


def split_verb(command: str, words: Sequence[str], verbs: Sequence[str], *, bare: str,
               other: str | None) -> tuple[str, list[str]]:
    """(verb, the words after it). `bare`: the verb of the command alone; `other`: the verb a first
    word that is no verb belongs to (None: such a word is refused, exit 2, naming the verbs)."""
    if not words:
        deprecated(command, [], bare)
        return bare, []
    first, *rest = words
    if first in verbs:
        return first, rest
    if other is None:
        raise UsageError(f"{command}: {first!r} is not an action (one of {', '.join(verbs)})")
    deprecated(command, words, other)
    return other, list(words)


def deprecated(command: str, words: Sequence[str], verb: str) -> None:
    """One line on stderr: the spelling without the verb still works this release, and which one
    replaces it (`vmplacer: `plans 12` is deprecated; use `plans show 12``)."""
    said = " ".join(word if word.isprintable() and len(word) <= 64 else excerpt(word, 64) for word in words)
    old = f"{command} {said}".strip()
    sys.stderr.write(f"vmplacer: `{old}` is deprecated; use `{command} {verb}{' ' + said if said else ''}`\n")


def no_more_words(command: str, verb: str, rest: Sequence[str], hint: str = "") -> None:
    """Exit 2 when a verb that takes no words got some."""
    if rest:
        raise UsageError(f"{command} {verb}: takes no arguments, got {' '.join(rest)}{hint}")
