"""Every key of the config file, by section, with its JSON type, range or choices and meaning:
the one table the reader's unknown-key check (`CONFIG_KEYS`) and the file's JSON Schema
(vmplacer/config_schema.py, shipped as vmplacer/data/schemas/config.schema.json) are both made from,
so a key cannot be read without being in the schema, or be in it without being read.

The reader (vmplacer/config.py) still says the last word: rules that span keys (unique host
names, `capabilities` only for test:// hosts, a plan setting's range) are its alone.
tests/unit/test_config_schema.py holds the table's ranges and choices to what the reader refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vmplacer.config_rebalance import REBALANCE_KEYS
from vmplacer.core.durations import duration_pattern

SAMPLER_METRICS = ("auto", "ipc", "cpu", "probe")
DOMAIN_TYPES = ("kvm", "qemu")
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg")
HOST_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
LISTEN_PATTERN = r"^[\w.\-:\[\]]+:\d{1,5}$"
SENSITIVE_PATTERN = r"^(all|label:[^=\s]+=\S*|class:\S+)$"
NON_EMPTY = r"\S"  # a string with more than blanks (the reader strips them)
MAX_TRUSTED_PROXIES = 64  # networks api.trusted_proxies may list


@dataclass(frozen=True)
class Key:
    """One key: the JSON Schema of its value (without description) and what it means."""

    schema: dict[str, Any]
    description: str


def _number(low: float, high: float, text: str, integer: bool = False) -> Key:
    return Key({"type": "integer" if integer else "number", "minimum": low, "maximum": high},
               f"{text} ({low:g} to {high:g})")


def _seconds(low: float, high: float, text: str) -> Key:
    """A duration key named for its unit (`*_s`): seconds as a number, or a number and its unit."""
    return Key({"anyOf": [{"type": "number", "minimum": low, "maximum": high},
                          {"type": "string", "pattern": duration_pattern(days=True)}]},
               f"{text} ({low:g} to {high:g} s; a number of seconds or text with a unit: 30s, 10m, 1h, 1d)")


def _duration(text: str) -> Key:
    """A duration key not named for a unit: a number and its unit, never a bare number (read as
    seconds, `retention.plans: 30` would keep almost nothing; core/durations.config_duration)."""
    return Key({"anyOf": [{"type": "string", "pattern": duration_pattern(days=True, unit_required=True)},
                          {"type": "null"}]},
               f"{text}. A duration longer than 0: a number and its unit, s, m, h or d (30d, 12h, 10m, 60s); "
               "a bare number is refused")


def _choice(choices: tuple[str, ...], text: str) -> Key:
    return Key({"enum": list(choices)}, f"{text}: {' | '.join(choices)}")


def _stripped(pattern: str) -> str:
    """A ^...$ pattern with the blanks around the value the reader strips."""
    return r"^\s*" + pattern[1:-1] + r"\s*$"


def _section(text: str) -> Key:
    return Key({"type": ["object", "null"]}, text)  # its keys: the table's section of the same name


def _cpuset(text: str) -> Key:
    return Key({"type": ["string", "integer", "null"]}, f"{text}, in cpuset syntax ('0-3,8'); default none")


def _strings(text: str, item: dict[str, Any] | None = None, nullable: bool = True, min_items: int = 0) -> Key:
    schema: dict[str, Any] = {"type": ["array", "null"] if nullable else "array",
                              "items": item or {"type": "string"}}
    if min_items:
        schema["minItems"] = min_items
    return Key(schema, text)


# section -> key -> Key, in the order the reader lists allowed keys. "hosts[]": each entry of the
# hosts list; "hosts[].xml_policy": its xml_policy mapping. The rebalance section comes from
# config_rebalance.REBALANCE_KEYS (see `rebalance_keys`).
CONFIG_FIELDS: dict[str, dict[str, Key]] = {
    "": {
        "data_dir": Key({"type": ["string", "null"]}, "where vmplacer keeps its state (SQLite database, journals); "
                        "default /var/lib/vmplacer as root, else ~/.local/share/vmplacer; $VMPLACER_DATA_DIR wins"),
        "database_url": Key({"type": ["string", "null"]},
                            f"SQLAlchemy URL, scheme {' | '.join(DATABASE_SCHEMES)}; default sqlite:///<data_dir>/"
                            "vmplacer.db; $VMPLACER_DATABASE_URL wins"),
        "hosts": Key({"type": ["array", "null"], "minItems": 1, "items": {"$ref": "#/$defs/Host"}},
                     "the libvirt hosts vmplacer observes and acts on, names unique; default: the built-in "
                     "example host"),
        "profiler": _section("Freeze'nSense profiler defaults"),
        "placement": _section("placing new guests with the learned interference model (docs/placement.md)"),
        "api": _section("the REST API (`vmplacer serve`)"),
        "retention": _section("how long `vmplacer db prune` keeps finished records"),
        "protect": _section("protecting latency-critical guests in place (docs/protect.md)"),
        "rebalance": _section("the defaults of every rebalancing run, by stage of planning (docs/rebalance.md)"),
        "web": _section("signing in to the web view under /ui/ (docs/web.md)"),
    },
    "hosts[]": {
        "name": Key({"type": "string", "pattern": _stripped(HOST_NAME_PATTERN)},
                    "the host's name in the CLI and the API, unique"),
        "uri": Key({"type": "string", "pattern": NON_EMPTY},
                   "libvirt URI: qemu:///system, qemu+tcp://HOST/system, qemu+ssh://..., test:///default"),
        "reserved_cpus": _cpuset("host CPUs never given to guests"),
        "domain_type": _choice(DOMAIN_TYPES, "domain type of the guests vmplacer defines (qemu: TCG)"),
        "sampler": _choice(SAMPLER_METRICS, "Freeze'nSense metric"),
        "cpu_allocation_ratio": _number(0.1, 64, "floating (shared-policy) vCPUs per shared-pool pCPU"),
        "reserved_memory_mib_per_node": _number(0, 1 << 30, "MiB kept for the host on every NUMA node",
                                                integer=True),
        "emulator_cpus": _cpuset("where 'share' emulator threads of pinned guests run; default: the guest's "
                                 "own pCPUs"),
        "domain_resync_s": _seconds(0, 3600, "seconds: every domain's XML is re-read at least this often "
                                            "(0: on every read)"),
        "connect_timeout_s": _seconds(1, 3600, "seconds to wait for the host's libvirtd to answer a connection"),
        "xml_policy": Key({"type": ["object", "null"]}, "what callers' domain XML may ask of this host "
                                                        "(docs/api.md, \"Domain XML policy\")"),
        "capabilities": Key({"type": ["string", "null"]},
                            "test:// hosts only: the topology from this capabilities file (relative to the "
                            "config file); default: the host's own"),
    },
    "hosts[].xml_policy": {
        "allow": Key({"type": ["array", "null"], "items": {"type": "string"}},
                     "named exceptions lifted on this host; default none"),  # items' enum: config_schema.py
        "storage_paths": _strings("absolute directories guests' files may be in; default: the target paths of "
                                  "the host's directory storage pools", {"type": "string", "pattern": "^/"}),
    },
    "profiler": {
        "t_m_ms": _number(0.1, 10_000, "ms: sampling window while neighbours are frozen"),
        "t_sleep_s": _seconds(0, 86_400, "seconds between rounds"),
        "max_freeze_ms": _number(1, 60_000, "ms: hard cap; a watchdog resumes everything after this"),
        "excluded_domains": _strings("domains never frozen, never profiled"),
        "scope": _strings("globs: the only domains the profiler looks at", {"type": "string", "pattern": NON_EMPTY},
                          nullable=False, min_items=1),
        "sensitive": Key({"type": "string", "pattern": _stripped(SENSITIVE_PATTERN)},
                         "which VMs get ζb: all | label:KEY=VALUE | class:NAME"),
        "pair_probes": _number(0, 1000, "per round: freeze all but a VM and one neighbour, sample both",
                               integer=True),
    },
    "placement": {
        "interference_weight": _number(0, 100, "weight of the predicted loss against all topology scorers "
                                               "together (0: off)"),
        "interference_candidates": _number(0, 1024, "extra candidate starting cores per node the model may "
                                                    "choose from", integer=True),
        "model_refresh": _duration("how often a long-running process reloads the learned model"),
    },
    "api": {
        "listen": Key({"type": "string", "pattern": _stripped(LISTEN_PATTERN)}, "HOST:PORT the API listens on"),
        "max_request_bytes": _number(1024, 1 << 30, "larger request bodies get 413"),
        "trusted_proxies": Key({"type": ["array", "null"], "maxItems": MAX_TRUSTED_PROXIES,
                                "items": {"type": "string", "pattern": NON_EMPTY}},
                               "IP networks (CIDR, e.g. 127.0.0.1/32, 10.0.0.0/8) of the reverse proxies whose "
                               "X-Forwarded-For names the client; default none: the client is the connection's peer"),
    },
    "retention": {
        name: _duration(f"how long finished {what} are kept")
        for name, what in (("plans", "plans (with their actions)"), ("profiles", "profile runs and their samples"),
                           ("audit", "audit log entries"), ("jobs", "API jobs"))
    },
    "protect": {
        "latency_critical_floor": Key({"anyOf": [{"type": "number", "minimum": 0.05, "maximum": 0.99},
                                                 {"const": "none"}, {"type": "null"}]},
                                      "ζ/ζb floor held for latency-critical guests without a label (0.05 to "
                                      "0.99), or none"),
        "batch_min_share": Key({"anyOf": [{"type": "number", "minimum": 0.01, "maximum": 1.0},
                                          {"const": "none"}, {"type": "null"}]},
                               "batch guests may be throttled down to this share of their CPU time (0.01 to 1), "
                               "or none"),
        "interval_s": _seconds(0.2, 3600, "seconds: one profile + decision round every interval"),
        "step": _number(0.01, 0.5, "a throttle or release moves a guest's share by this much"),
        "release_margin": _number(0, 0.5, "release only when the ratio is this far above the floor"),
        "slow_interval_s": _seconds(0.2, 3600, "seconds: the slowest pace, while every floor holds with margin"),
        "freeze_budget": _number(0.001, 1, "neighbours frozen at most this share of any budget_window_s"),
        "budget_window_s": _seconds(10, 86_400, "seconds the freeze budget is counted over"),
        "startup_allowance_s": _seconds(0, 3600, "frozen seconds allowed beyond freeze_budget × time running "
                                              "until a window has passed (at most one window's budget)"),
    },
    "web": {
        "session_lifetime_s": _seconds(1, 30 * 86_400, "seconds a web sign-in lasts at most, however busy"),
        "session_idle_s": _seconds(1, 30 * 86_400, "seconds without a request after which a web sign-in ends"),
    },
}

_KIND_TYPES = {"number": "number", "integer": "integer", "flag": "boolean"}


def _rebalance_schema(kind: str) -> dict[str, Any]:
    if kind == "seconds":  # a number of seconds, or text with a unit
        return {"anyOf": [{"type": "number"}, {"type": "string", "pattern": duration_pattern(days=True)}]}
    return {"type": _KIND_TYPES[kind]}


def rebalance_keys() -> dict[str, dict[str, Key]]:
    """The rebalance stages' keys as table sections ("rebalance.STAGE"). Their ranges are the
    plan settings' own, checked by the reader through RebalanceSettings, not by the schema."""
    return {f"rebalance.{stage}": {
        key: Key(_rebalance_schema(kind), f"the default of the plan setting {name} (docs/rebalance.md)"
                 + ("" if kind == "flag" else "; `vmplacer config check` checks its range")
                 + ("; seconds, or text with a unit: 30s, 10m, 1h, 1d" if kind == "seconds" else ""))
        for key, (name, kind) in keys.items()} for stage, keys in REBALANCE_KEYS.items()}


# Every key the config file may hold, by section: the reader refuses any other.
CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    **{section: tuple(keys) for section, keys in CONFIG_FIELDS.items()},
    "rebalance": tuple(REBALANCE_KEYS),
    **{section: tuple(keys) for section, keys in rebalance_keys().items()},
}
