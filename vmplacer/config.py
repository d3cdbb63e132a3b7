"""Settings: one YAML file + environment overrides, validated once at start.

Read in the composition root only and passed down as typed objects. Every
error names the file and the key, so an operator can fix it without reading
code. With no file at all, vmplacer runs against libvirt's built-in test
driver and a SQLite file in the data dir, so a first run just works.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from vmplacer.cli.common import duration_seconds
from vmplacer.core.cpuset import CpusetError, parse_cpuset
from vmplacer.core.policies.admit import AllocationOptions
from vmplacer.core.protection import ProtectionDefaults, ProtectionError, check_floor, check_min_share

ENV_CONFIG = "VMPLACER_CONFIG"
ENV_DATABASE_URL = "VMPLACER_DATABASE_URL"
ENV_DATA_DIR = "VMPLACER_DATA_DIR"

DEFAULT_HOST_URI = "test:///default"
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
LIBVIRT_SCHEMES = re.compile(
    r"^(test|qemu|xen|lxc|bhyve|vz|ch)(\+(tcp|tls|ssh|libssh|libssh2|unix|ext))?$"
)
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg")
SAMPLER_METRICS = ("auto", "ipc", "cpu", "probe")


class ConfigError(ValueError):
    """A configuration problem; the message names the source and the key."""


@dataclass(frozen=True)
class XmlPolicySettings:
    """What callers' domain XML may ask of one host (docs/api.md, "Domain XML policy")."""

    allow: frozenset[str] = frozenset()  # named exceptions lifted on this host
    storage_paths: tuple[str, ...] | None = None  # None: the host's storage pools' target paths


@dataclass(frozen=True)
class HostSettings:
    name: str
    uri: str
    reserved_cpus: frozenset[int] = frozenset()
    domain_type: str = "kvm"  # 'qemu' (TCG) where hardware virtualization is missing
    sampler: str = "auto"
    # What the placement engine may use on this host (Nova's cpu_allocation_ratio,
    # reserved_host_memory_mb per NUMA node, and cpu_shared_set for emulator threads).
    cpu_allocation_ratio: float = 4.0
    reserved_memory_mib_per_node: int = 0
    emulator_cpus: frozenset[int] = frozenset()
    xml_policy: XmlPolicySettings = field(default_factory=XmlPolicySettings)

    @property
    def allocation(self) -> AllocationOptions:
        return AllocationOptions(cpu_allocation_ratio=self.cpu_allocation_ratio,
                                 emulator_cpus=self.emulator_cpus,
                                 reserved_memory_mib_per_node=self.reserved_memory_mib_per_node)


@dataclass(frozen=True)
class ProfilerSettings:
    t_m_ms: float = 10.0
    t_sleep_s: float = 10.0
    max_freeze_ms: float = 500.0
    excluded_domains: tuple[str, ...] = ()
    scope: tuple[str, ...] = ("*",)  # globs: the domains the profiler considers at all
    sensitive: str = "all"  # which VMs get ζb: all | label:KEY=VALUE | class:NAME


@dataclass(frozen=True)
class ProtectSettings:
    """The protection loop (docs/protect.md): class defaults and how it steps."""

    defaults: ProtectionDefaults = field(default_factory=ProtectionDefaults)
    interval_s: float = 2.0  # one profile + decision round per protected host every interval
    step: float = 0.1  # each throttle/release moves a guest's share by this much
    release_margin: float = 0.05  # release only when the ratio is this far above the floor (hysteresis)


@dataclass(frozen=True)
class ApiSettings:
    listen: str = "127.0.0.1:8470"
    max_request_bytes: int = 1_048_576


DAY_S = 86_400.0


@dataclass(frozen=True)
class RetentionSettings:
    """How long `vmplacer db prune` keeps finished records, in seconds (docs/operations.md,
    Retention). Placements are never pruned: they are the live record."""

    plans_s: float = 30 * DAY_S  # final plans (and their actions): post-mortems of recent rebalances
    profiles_s: float = 90 * DAY_S  # profile runs and samples; the model keeps what it learned
    audit_s: float = 180 * DAY_S  # who did what, for half a year
    jobs_s: float = 7 * DAY_S  # finished API jobs: clients read results within minutes


RETENTION_KEYS = ("plans", "profiles", "audit", "jobs")


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    database_url: str
    hosts: tuple[HostSettings, ...]
    profiler: ProfilerSettings = field(default_factory=ProfilerSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    source: str = "built-in defaults"
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    protect: ProtectSettings = field(default_factory=ProtectSettings)

    def host(self, name: str) -> HostSettings:
        for host in self.hosts:
            if host.name == name:
                return host
        known = ", ".join(h.name for h in self.hosts) or "none"
        raise ConfigError(f"unknown host {name!r} (configured: {known})")


def default_data_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/vmplacer")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "vmplacer"


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'vmplacer.db'}"


# ---------------------------------------------------------------------------
# validation helpers: each takes the dotted key path for its error messages
# ---------------------------------------------------------------------------

class _Reader:
    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, reason: str) -> ConfigError:
        return ConfigError(f"{self.source}: key '{key}': {reason}")

    def mapping(self, value: Any, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping, got {type(value).__name__}")
        for name in value:
            if name not in allowed:
                where = f"{key}.{name}" if key else str(name)
                raise self.fail(where, f"unknown key (allowed: {', '.join(allowed)})")
        return value

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, "must be a non-empty string")
        return value.strip()

    def number(self, value: Any, key: str, low: float, high: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"must be a number, got {value!r}")
        if not low <= value <= high:
            raise self.fail(key, f"must be between {low:g} and {high:g}, got {value!r}")
        return float(value)


def _check_libvirt_uri(reader: _Reader, uri: str, key: str) -> str:
    parts = urlsplit(uri)
    if not parts.scheme or not LIBVIRT_SCHEMES.match(parts.scheme):
        raise reader.fail(key, f"not a libvirt URI: {uri!r} (e.g. qemu:///system, qemu+tcp://host/system)")
    if parts.scheme.startswith("qemu") and parts.path not in ("/system", "/session"):
        raise reader.fail(key, f"qemu URIs end in /system or /session, got {uri!r}")
    return uri


def _check_database_url(reader: _Reader, url: str, key: str) -> str:
    scheme = urlsplit(url).scheme
    if scheme not in DATABASE_SCHEMES:
        raise reader.fail(key, f"unsupported database URL scheme {scheme!r} (use sqlite:/// or postgresql://)")
    if scheme == "postgresql":
        # SQLAlchemy's default PostgreSQL driver is psycopg2; vmplacer ships psycopg 3.
        url = "postgresql+psycopg" + url[len("postgresql"):]
    return url


def _parse_host(reader: _Reader, raw: Any, index: int) -> HostSettings:
    key = f"hosts[{index}]"
    data = reader.mapping(raw, key, ("name", "uri", "reserved_cpus", "domain_type", "sampler",
                                     "cpu_allocation_ratio", "reserved_memory_mib_per_node", "emulator_cpus",
                                     "xml_policy"))
    if "name" not in data:
        raise reader.fail(f"{key}.name", "is required")
    if "uri" not in data:
        raise reader.fail(f"{key}.uri", "is required")
    name = reader.string(data["name"], f"{key}.name")
    if not HOST_NAME_RE.match(name):
        raise reader.fail(f"{key}.name", f"must match {HOST_NAME_RE.pattern}, got {name!r}")
    uri = _check_libvirt_uri(reader, reader.string(data["uri"], f"{key}.uri"), f"{key}.uri")
    reserved = _cpuset(reader, data.get("reserved_cpus"), f"{key}.reserved_cpus")
    emulator_cpus = _cpuset(reader, data.get("emulator_cpus"), f"{key}.emulator_cpus")
    ratio = reader.number(data.get("cpu_allocation_ratio", 4.0), f"{key}.cpu_allocation_ratio", 0.1, 64)
    reserve = reader.number(data.get("reserved_memory_mib_per_node", 0), f"{key}.reserved_memory_mib_per_node",
                            0, 1 << 30)
    if reserve != int(reserve):
        raise reader.fail(f"{key}.reserved_memory_mib_per_node", f"must be a whole number of MiB, got {reserve:g}")
    domain_type = str(data.get("domain_type", "kvm"))
    if domain_type not in ("kvm", "qemu"):
        raise reader.fail(f"{key}.domain_type", f"must be kvm or qemu, got {domain_type!r}")
    sampler = str(data.get("sampler", "auto"))
    if sampler not in SAMPLER_METRICS:
        raise reader.fail(f"{key}.sampler", f"must be one of {', '.join(SAMPLER_METRICS)}")
    xml_policy = _xml_policy(reader, data.get("xml_policy"), f"{key}.xml_policy")
    return HostSettings(name, uri, reserved, domain_type, sampler, ratio, int(reserve), emulator_cpus, xml_policy)


def _xml_policy(reader: _Reader, raw: Any, key: str) -> XmlPolicySettings:
    from vmplacer.adapters.domain_xml_policy import EXCEPTIONS, SYSTEM_DIRECTORIES, normal_path

    data = reader.mapping(raw, key, ("allow", "storage_paths"))
    allow = data.get("allow") or []
    if not isinstance(allow, list) or not all(isinstance(x, str) for x in allow):
        raise reader.fail(f"{key}.allow", "must be a list of exception names")
    for index, name in enumerate(allow):
        if name not in EXCEPTIONS:
            raise reader.fail(f"{key}.allow[{index}]", f"unknown exception {name!r} (known: {', '.join(EXCEPTIONS)})")
    paths = data.get("storage_paths")
    if paths is None:
        return XmlPolicySettings(frozenset(allow))
    if not isinstance(paths, list) or not all(isinstance(x, str) for x in paths):
        raise reader.fail(f"{key}.storage_paths", "must be a list of absolute directory paths")
    for index, path in enumerate(paths):
        where = f"{key}.storage_paths[{index}]"
        if normal_path(path) != path:
            raise reader.fail(where, f"must be an absolute path without '..', '//' or a trailing '/', got {path!r}")
        if path in SYSTEM_DIRECTORIES:
            raise reader.fail(where, f"{path} is a system directory, not a place for guest files")
    return XmlPolicySettings(frozenset(allow), tuple(paths))


def _cpuset(reader: _Reader, value: Any, key: str) -> frozenset[int]:
    if value in (None, ""):
        return frozenset()
    try:
        return parse_cpuset(str(value))
    except CpusetError as exc:
        raise reader.fail(key, str(exc)) from None


def _retention(reader: _Reader, raw: Any) -> RetentionSettings:
    data = reader.mapping(raw, "retention", RETENTION_KEYS)
    defaults = RetentionSettings()
    ages: dict[str, float] = {}
    for name in RETENTION_KEYS:
        key = f"retention.{name}"
        value = data.get(name)
        if value is None:
            ages[f"{name}_s"] = getattr(defaults, f"{name}_s")
            continue
        seconds = None if isinstance(value, bool) else duration_seconds(str(value), "s", days=True)
        if seconds is None:
            raise reader.fail(key, f"must be a duration such as 30d, 12h, 90m or 3600 (seconds), got {value!r}")
        if seconds <= 0:
            raise reader.fail(key, f"must be longer than 0, got {value!r}")
        ages[f"{name}_s"] = seconds
    return RetentionSettings(**ages)


def settings_from_mapping(raw: Any, source: str, environ: dict[str, str] | None = None) -> Settings:
    """Validate a parsed YAML document (or None) and apply environment overrides."""
    env = os.environ if environ is None else environ
    reader = _Reader(source)
    data = reader.mapping(raw, "", ("database_url", "data_dir", "hosts", "profiler", "api", "retention", "protect"))

    data_dir_value = env.get(ENV_DATA_DIR) or data.get("data_dir")
    data_dir = Path(reader.string(data_dir_value, "data_dir")) if data_dir_value else default_data_dir()

    hosts_raw = data.get("hosts")
    if hosts_raw is None:
        hosts: tuple[HostSettings, ...] = (HostSettings("default", DEFAULT_HOST_URI),)
    else:
        if not isinstance(hosts_raw, list) or not hosts_raw:
            raise reader.fail("hosts", "must be a non-empty list of {name, uri}")
        hosts = tuple(_parse_host(reader, item, i) for i, item in enumerate(hosts_raw))
        names = [h.name for h in hosts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise reader.fail("hosts", f"duplicate host names: {', '.join(duplicates)}")

    url_value = env.get(ENV_DATABASE_URL) or data.get("database_url")
    key = ENV_DATABASE_URL if env.get(ENV_DATABASE_URL) else "database_url"
    database_url = (
        _check_database_url(reader, reader.string(url_value, key), key)
        if url_value
        else sqlite_url(data_dir)
    )

    prof = reader.mapping(data.get("profiler"), "profiler", ("t_m_ms", "t_sleep_s", "max_freeze_ms", "excluded_domains",
                                                            "scope", "sensitive"))
    excluded = prof.get("excluded_domains", []) or []
    if not isinstance(excluded, list) or not all(isinstance(x, str) for x in excluded):
        raise reader.fail("profiler.excluded_domains", "must be a list of domain names")
    scope = prof.get("scope", ["*"])
    if not isinstance(scope, list) or not scope or not all(isinstance(x, str) and x.strip() for x in scope):
        raise reader.fail("profiler.scope", "must be a non-empty list of domain name globs, e.g. ['web-*']")
    sensitive = reader.string(prof.get("sensitive", "all"), "profiler.sensitive")
    if not (sensitive == "all" or re.match(r"^label:[^=\s]+=\S*$", sensitive) or re.match(r"^class:\S+$", sensitive)):
        raise reader.fail("profiler.sensitive", f"must be all, label:KEY=VALUE or class:NAME, got {sensitive!r}")
    profiler = ProfilerSettings(
        t_m_ms=reader.number(prof.get("t_m_ms", 10.0), "profiler.t_m_ms", 0.1, 10_000),
        t_sleep_s=reader.number(prof.get("t_sleep_s", 10.0), "profiler.t_sleep_s", 0.0, 86_400),
        max_freeze_ms=reader.number(prof.get("max_freeze_ms", 500.0), "profiler.max_freeze_ms", 1, 60_000),
        excluded_domains=tuple(excluded),
        scope=tuple(x.strip() for x in scope),
        sensitive=sensitive,
    )
    api_raw = reader.mapping(data.get("api"), "api", ("listen", "max_request_bytes"))
    listen = reader.string(api_raw.get("listen", "127.0.0.1:8470"), "api.listen")
    if not re.match(r"^[\w.\-:\[\]]+:\d{1,5}$", listen):
        raise reader.fail("api.listen", f"must be HOST:PORT, got {listen!r}")
    api = ApiSettings(
        listen=listen,
        max_request_bytes=int(reader.number(api_raw.get("max_request_bytes", 1_048_576), "api.max_request_bytes", 1024, 1 << 30)),
    )
    retention = _retention(reader, data.get("retention"))
    return Settings(data_dir, database_url, hosts, profiler, api, source, retention, _protect(reader, data.get("protect")))


def _protect(reader: _Reader, raw: Any) -> ProtectSettings:
    data = reader.mapping(raw, "protect", ("latency_critical_floor", "batch_min_share", "interval_s", "step",
                                           "release_margin"))
    base = ProtectSettings()
    values: dict[str, float | None] = {}
    for key, check in (("latency_critical_floor", check_floor), ("batch_min_share", check_min_share)):
        value = data.get(key, getattr(base.defaults, key))
        try:  # `none` switches the class default off
            values[key] = None if value is None or value == "none" else check(value, f"protect.{key}")
        except ProtectionError as exc:
            raise reader.fail(f"protect.{key}", str(exc).split(": ", 1)[1] + " (or none)") from None
    defaults = ProtectionDefaults(**values)  # type: ignore[arg-type]
    return ProtectSettings(
        defaults=defaults,
        interval_s=reader.number(data.get("interval_s", base.interval_s), "protect.interval_s", 0.2, 3600),
        step=reader.number(data.get("step", base.step), "protect.step", 0.01, 0.5),
        release_margin=reader.number(data.get("release_margin", base.release_margin), "protect.release_margin",
                                     0.0, 0.5),
    )


def load_settings(path: str | os.PathLike[str] | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Find the config (argument, then $VMPLACER_CONFIG), read and validate it."""
    env = os.environ if environ is None else environ
    chosen = str(path) if path else env.get(ENV_CONFIG)
    if not chosen:
        return settings_from_mapping(None, "built-in defaults", env)
    file = Path(chosen)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {file}: not found") from None
    except (PermissionError, IsADirectoryError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {file}: unreadable ({exc.__class__.__name__}: {exc})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {file}: invalid YAML: {exc}") from None
    return settings_from_mapping(raw, str(file), env)
