"""Load a YAML request file: the guests to place, in order, each with an optional base XML.

```yaml
guests:
  - name: db1
    vcpus: 4
    memory_mib: 8192
    cpu_policy: dedicated
    base_xml: db1.xml          # optional, relative to this file
```

Every problem in the file is reported at once, each naming the file, the
guest (index and name), the field and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmplacer.adapters.domain_xml import DomainXmlError, parse_domain
from vmplacer.adapters.source_files import UniqueKeyLoader, YamlFileError, load_yaml
from vmplacer.core.placement.guest import GuestSpec, GuestSpecError

TOP_LEVEL_KEYS = ("guests",)
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_GUESTS = 10_000


class RequestFileError(ValueError):
    """Everything wrong with a request file; `problems` holds one line per problem."""

    def __init__(self, path: Path | str, problems: list[str]):
        self.path = str(path)
        self.problems = tuple(problems)
        super().__init__("\n".join(f"{path}: {p}" for p in problems))


@dataclass(frozen=True)
class GuestRequest:
    index: int
    spec: GuestSpec
    base_xml: str | None = None
    base_xml_path: Path | None = None


_UniqueKeyLoader = UniqueKeyLoader  # the loader request files and the config share


def load_request_file(path: str | Path) -> list[GuestRequest]:
    """The guests of a request file, in file order; RequestFileError lists every problem."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise RequestFileError(path, [f"file is {size} bytes, the limit is {MAX_FILE_BYTES}"])
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RequestFileError(path, ["file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RequestFileError(path, [f"cannot read: {exc}"]) from None
    return parse_request_text(text, path)


def parse_request_text(text: str, path: str | Path = "<request>") -> list[GuestRequest]:
    path = Path(path)
    try:
        data = load_yaml(text)
    except YamlFileError as exc:
        raise RequestFileError(path, list(exc.problems)) from None
    if not isinstance(data, dict):
        raise RequestFileError(path, ["must be a mapping with a 'guests' list"])
    problems = [f"unknown top-level key {key!r} (allowed: {', '.join(TOP_LEVEL_KEYS)})"
                for key in data if key not in TOP_LEVEL_KEYS]
    guests = data.get("guests")
    if not isinstance(guests, list) or not guests:
        problems.append("'guests' must be a non-empty list of guests")
        raise RequestFileError(path, problems)
    if len(guests) > MAX_GUESTS:
        raise RequestFileError(path, [*problems, f"{len(guests)} guests, the limit is {MAX_GUESTS}"])

    requests: list[GuestRequest] = []
    names: dict[str, int] = {}
    for index, raw in enumerate(guests):
        label = _label(index, raw)
        if not isinstance(raw, dict):
            problems.append(f"{label}: must be a mapping, got {type(raw).__name__}")
            continue
        fields = dict(raw)
        base_ref = fields.pop("base_xml", None)
        try:
            spec = GuestSpec.from_mapping(fields)
        except GuestSpecError as exc:
            problems.extend(f"{label}: field {p.field}: {p.reason}" for p in exc.problems)
            spec = None
        base_xml, base_path = _base_xml(base_ref, path, label, problems)
        name = fields.get("name")
        if isinstance(name, str):
            if name in names:
                problems.append(f"{label}: field name: {name!r} is already used by guest #{names[name]}")
                continue
            names[name] = index
        if spec is not None:
            requests.append(GuestRequest(index, spec, base_xml, base_path))
    if problems:
        raise RequestFileError(path, problems)
    return requests


def _label(index: int, raw: Any) -> str:
    name = raw.get("name") if isinstance(raw, dict) else None
    return f"guest #{index} ({name})" if isinstance(name, str) else f"guest #{index}"


def _base_xml(ref: Any, request_path: Path, label: str, problems: list[str]) -> tuple[str | None, Path | None]:
    if ref is None:
        return None, None
    if not isinstance(ref, str) or not ref.strip():
        problems.append(f"{label}: field base_xml: must be a file path, got {ref!r}")
        return None, None
    file = Path(ref)
    if not file.is_absolute():
        file = request_path.parent / file
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        problems.append(f"{label}: field base_xml: file {file} not found")
        return None, None
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{label}: field base_xml: cannot read {file}: {exc}")
        return None, None
    try:
        parse_domain(text, str(file))
    except DomainXmlError as exc:
        problems.append(f"{label}: field base_xml: {exc}")
        return None, None
    return text, file
