"""JSON Schemas of vmplacer's files: a request file (`vmplacer plan --request`, `vmplacer place`),
generated from the API's validating model of one guest, so an editor or a pipeline checks a file
with the same fields, types and ranges the API takes; and the config file, generated from the
table of keys its reader refuses every other key by (vmplacer/config_schema.py).

The schemas ship inside the package (vmplacer/data/schemas/) and `vmplacer config schema
request|config` prints that copy, without importing pydantic; tests/unit/test_file_schemas.py
fails when a copy differs from what its source generates now. `python -m vmplacer.api.file_schemas`
writes it again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "schemas"
# What the API adds to a guest (where and how to place it): not keys of a request file's guest.
_API_ONLY = ("host", "dry_run", "define", "start")


def request_file_schema() -> dict[str, Any]:
    """`{guests: [guest, ...]}`, each guest the API's PlacementRequest without the API's routing
    fields; `base_xml` is a file path there (relative to the request file), not XML text."""
    from vmplacer.adapters.request_file import MAX_GUESTS
    from vmplacer.api.schemas import PlacementRequest

    guest = PlacementRequest.model_json_schema(ref_template="#/$defs/{model}")
    defs = guest.pop("$defs", {})
    for field in _API_ONLY:
        guest["properties"].pop(field, None)
    guest["required"] = [name for name in guest.get("required", []) if name not in _API_ONLY]
    guest["properties"]["base_xml"] = {
        "anyOf": [{"type": "string", "minLength": 1}, {"type": "null"}], "default": None,
        "description": "a domain XML file to start from, relative to the request file; vmplacer replaces "
                       "only what it owns", "title": "Base Xml"}
    guest["title"] = "Guest"
    guest["description"] = "One guest to place (the fields of POST /v1/placements without host, dry_run, " \
                           "define and start)."
    return {
        "$schema": SCHEMA_DIALECT,
        "title": "vmplacer request file",
        "description": "The guests `vmplacer plan --request FILE` and `vmplacer place FILE` place, in order.",
        "type": "object",
        "additionalProperties": False,  # the loader refuses any top-level key but `guests`
        "required": ["guests"],
        "properties": {"guests": {"type": "array", "minItems": 1, "maxItems": MAX_GUESTS,
                                  "items": {"$ref": "#/$defs/Guest"}}},
        "$defs": {**defs, "Guest": guest},
    }


def config_file_schema() -> dict[str, Any]:
    """The config file's schema, from the reader's own table of keys (vmplacer/config_keys.py)."""
    from vmplacer.config_schema import config_file_schema as from_key_table

    return from_key_table()


GENERATED = {"request": request_file_schema, "config": config_file_schema}


def schema_text(schema: dict[str, Any]) -> str:
    """The file's text: stable key order and indentation, so the shipped copy diffs cleanly."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_shipped(directory: Path = SHIPPED_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in GENERATED.items():
        path = directory / f"{name}.schema.json"
        path.write_text(schema_text(make()), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write_shipped():
        sys.stdout.write(f"wrote {path}\n")
