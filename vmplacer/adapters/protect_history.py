"""The protection loop's per-round observations as JSON lines, one file per host, bounded in size.

`vmplacer protect status`, its `--plot` and `/metrics` read them back; nothing
decides from them, so a lost or torn line costs a point on a plot, never a
throttle. A file that reaches `max_bytes` becomes `<host>.jsonl.1` (the
previous one is dropped), so a host's history never takes more than twice that.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

DEFAULT_MAX_BYTES = 2 * 1024 * 1024
_HOST_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ProtectHistory:
    def __init__(self, directory: Path, *, max_bytes: int = DEFAULT_MAX_BYTES):
        if max_bytes < 1024:
            raise ValueError(f"protect history: max_bytes must be at least 1024, got {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> ProtectHistory:
        return cls(Path(data_dir) / "protect")

    def path(self, host: str) -> Path:
        if not _HOST_FILE.match(host):
            raise ValueError(f"protect history: host name {host!r} cannot name a file")
        return self.directory / f"{host}.jsonl"

    def append(self, record: dict[str, Any]) -> None:
        """Add one round (a RoundReport's dict; needs `host`)."""
        path = self.path(str(record["host"]))
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                if path.stat().st_size + len(line) > self.max_bytes:
                    os.replace(path, path.with_name(path.name + ".1"))
            except FileNotFoundError:
                pass
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(line)

    def read(self, host: str, *, since: float | None = None) -> list[dict[str, Any]]:
        """The host's rounds, oldest first (from `since`, epoch seconds, when given); torn lines skipped."""
        path = self.path(host)
        records = []
        for part in (path.with_name(path.name + ".1"), path):
            try:
                text = part.read_text(encoding="utf-8")
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line torn by a crash mid-write
                if isinstance(record, dict) and (since is None or float(record.get("at", 0)) >= since):
                    records.append(record)
        return records

    def hosts(self) -> list[str]:
        try:
            return sorted(p.name[:-len(".jsonl")] for p in self.directory.glob("*.jsonl"))
        except OSError:
            return []

    def latest(self, host: str) -> dict[str, Any] | None:
        """The newest round of a host (reads only the end of the file)."""
        path = self.path(host)
        try:
            with open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - 65536))
                tail = handle.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return None
        for line in reversed(tail.splitlines()):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                return record
        return None
