"""The config file's JSON Schema, made from the reader's own table of keys (vmplacer/config_keys.py)
with the defaults the settings dataclasses hold, so it cannot list a key the reader refuses or
miss one it reads. vmplacer/api/file_schemas.py writes it to vmplacer/data/schemas/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vmplacer.adapters.domain_xml_policy import EXCEPTIONS
from vmplacer.config import HostSettings, Settings, settings_to_mapping
from vmplacer.config_keys import CONFIG_FIELDS, Key, rebalance_keys


def _object(section: str, keys: dict[str, Key], defaults: dict[str, Any], refs: dict[str, str]) -> dict[str, Any]:
    properties = {}
    for name, key in keys.items():
        prop = {**key.schema, "description": key.description}
        if f"{section}.{name}".lstrip(".") in refs:
            prop["$ref"] = refs[f"{section}.{name}".lstrip(".")]
        if name in defaults:
            prop["default"] = defaults[name]
        properties[name] = prop
    return {"type": ["object", "null"], "additionalProperties": False, "properties": properties}


def config_file_schema() -> dict[str, Any]:
    """The JSON Schema of the config file, from the table above; defaults from the settings
    dataclasses as `config show` writes them (the host-dependent ones left out)."""
    shown = settings_to_mapping(Settings(Path("/"), "", (HostSettings("host", "test:///default"),)))
    host_defaults = {k: v for k, v in shown["hosts"][0].items() if k not in ("name", "uri")}
    refs = {f"{section}": f"#/$defs/{section}" for section in ("profiler", "placement", "api", "retention",
                                                                "protect", "rebalance", "web")}
    refs["hosts[].xml_policy"] = "#/$defs/XmlPolicy"
    defs: dict[str, Any] = {}
    for section in ("profiler", "placement", "api", "retention", "protect", "web"):
        defs[section] = _object(section, CONFIG_FIELDS[section], shown[section], {})
    policy = _object("hosts[].xml_policy", CONFIG_FIELDS["hosts[].xml_policy"], host_defaults["xml_policy"], {})
    policy["properties"]["allow"]["items"] = {"enum": list(EXCEPTIONS)}
    defs["XmlPolicy"] = policy
    host = _object("hosts[]", CONFIG_FIELDS["hosts[]"], host_defaults, {"hosts[].xml_policy": refs.pop(
        "hosts[].xml_policy")})
    host["type"] = "object"
    host["required"] = ["name", "uri"]
    defs["Host"] = host
    stages = {}
    for section, keys in rebalance_keys().items():
        stage = section.split(".", 1)[1]
        defs[f"rebalance.{stage}"] = _object(section, keys, shown["rebalance"][stage], {})
        stages[stage] = {"$ref": f"#/$defs/rebalance.{stage}"}
    defs["rebalance"] = {"type": ["object", "null"], "additionalProperties": False, "properties": stages}
    top = _object("", CONFIG_FIELDS[""], {}, refs)
    top.update({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "vmplacer config file",
        "description": "vmplacer's YAML config (--config FILE or $VMPLACER_CONFIG; examples/vmplacer.yaml lists "
                       "every key). `vmplacer config check` has the last word: it also holds the rules that span "
                       "keys (unique host names, capabilities only for test:// hosts, rebalance settings' ranges).",
        "$defs": defs,
    })
    return top
