""""Did you mean ...?" for a mistyped option or choice: the closest spelling the parser knows."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")
CUTOFF = 0.6  # difflib's ratio: below it a "suggestion" is a guess, not a typo's fix


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known spelling closest to `word`, or None when none is close."""
    found = difflib.get_close_matches(word, sorted(set(known)), n=1, cutoff=CUTOFF)
    return found[0] if found else None


def suggest(message: str, unknown_option: str | None, options: Iterable[str]) -> str | None:
    """What to suggest for argparse's `message`: the closest long option to `unknown_option`
    (`--hots` → `--host`), or the closest choice of an invalid one (`plna` → `plan`)."""
    if unknown_option:
        long_options = [option for option in options if option.startswith("--")]
        return closest(unknown_option, long_options)
    found = _INVALID_CHOICE.search(message)
    if found:
        choices = re.findall(r"'([^']*)'", found.group(2))
        match = closest(found.group(1), choices)
        return f"'{match}'" if match else None
    return None
