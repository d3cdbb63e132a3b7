"""The cyclic garbage collector held off while a large computation builds state it keeps.

A fleet's rebalance plan allocates millions of small objects (layouts, moves, placements) that
all live until the plan is built. Each full pass of Python's cyclic collector rescans every live
object, and the passes come more often as the heap grows, so a plan of n hosts would spend time
growing faster than n on collections that free nothing. Reference counting still frees what
planning drops; only cycles wait, and planning makes none worth collecting early.

Each hold restores what it found: holds that overlap (nested, or in several threads) end with the
collector as it was before the first of them (one that finds it held leaves it to the holder).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collection_held() -> Iterator[None]:
    """Within: the cyclic collector does not run (unless an overlapping hold ended first)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
