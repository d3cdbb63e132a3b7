"""Reading the files of one sysfs tree: every value passes through one read function.

Dumps of real machines carry what live files do not: trailing NUL bytes
(`'0-3\\n\\x00'`), stray whitespace, files that are missing because the kernel
or the architecture has no such attribute. `SysfsFiles.text` strips NULs and
whitespace once, for every file; the typed readers on top of it turn bad
content into a `SysfsError` naming the file and quoting what it holds.
Optional files that are missing are not errors: the caller records a warning
(`warn`), collapsed into one line per kind of file so a host with 512 CPUs
does not print 512 of them.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path

from vmplacer.core.topology.cpuset import CpusetError, parse_cpumask, parse_cpuset

_BLANK = string.whitespace + "\x00"


class SysfsError(ValueError):
    """A sysfs tree that cannot be read as a topology; the message names the file and its content."""


class SysfsFiles:
    """Typed, NUL-safe access to the files under one ROOT, and the warnings of one read."""

    def __init__(self, root: Path):
        self.root = root
        self._warnings: dict[str, tuple[Path, str, int]] = {}

    # ----- the one read function ----------------------------------------------------------
    def text(self, path: Path) -> str | None:
        """The file's content without NULs and surrounding whitespace; None when it does not exist."""
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise SysfsError(f"{path}: cannot read ({exc.strerror or exc})") from None
        return data.decode("utf-8", errors="replace").strip(_BLANK)

    # ----- typed readers ------------------------------------------------------------------
    def required(self, path: Path) -> str:
        text = self.text(path)
        if text is None:
            raise SysfsError(f"{path}: cannot read (No such file or directory)")
        return text

    def integer(self, path: Path) -> int | None:
        """An integer file; None when missing or empty (it says nothing), an error when it holds anything else."""
        text = self.text(path)
        if not text:
            return None
        try:
            return int(text)
        except ValueError:
            raise SysfsError(f"{path}: expected an integer, found {text!r}") from None

    def cpulist(self, path: Path) -> frozenset[int] | None:
        """A CPU list file ("0-3,8"); None when missing."""
        text = self.text(path)
        if text is None:
            return None
        try:
            return parse_cpuset(text)
        except CpusetError as exc:
            raise SysfsError(f"{path}: {exc}") from None

    def cpumask(self, path: Path) -> frozenset[int] | None:
        """A hex CPU mask file ("00000000,0000ff00"); None when missing."""
        text = self.text(path)
        if text is None:
            return None
        try:
            return parse_cpumask(text)
        except CpusetError as exc:
            raise SysfsError(f"{path}: {exc}") from None

    def cpus(self, directory: Path, lists: Sequence[str], masks: Sequence[str] = (), *,
             nonempty: bool = False) -> frozenset[int] | None:
        """The first of `lists` (list syntax) or `masks` (hex masks) that exists in `directory`
        (with `nonempty`: that names a CPU — a CPU's own sibling set never is empty)."""
        candidates = [(self.cpulist, directory / n) for n in lists] + [(self.cpumask, directory / n) for n in masks]
        for read, path in candidates:
            found = read(path)
            if found is not None and (found or not nonempty):
                return found
        return None

    def absence(self, path: Path) -> str:
        """Why a file gave nothing, for a warning: "missing" or "empty"."""
        return "empty" if path.exists() else "missing"

    # ----- warnings -----------------------------------------------------------------------
    def warn(self, kind: str, path: Path, consequence: str) -> None:
        """Record that `path` could not be used and what was assumed; one line per `kind`."""
        first, text, count = self._warnings.get(kind, (path, consequence, 0))
        self._warnings[kind] = (first, text, count + 1)

    def warnings(self) -> list[str]:
        lines = []
        for first, consequence, count in self._warnings.values():
            more = f" (and {count - 1} more like it)" if count > 1 else ""
            lines.append(f"{first}{more}: {consequence}")
        return lines
