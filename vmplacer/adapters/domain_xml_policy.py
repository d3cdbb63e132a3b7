"""What a caller's domain XML may ask of a host: an allowlist, per host, with named exceptions.

An orchestrator's token lets it place guests, not run programs or read files on
the host. libvirt cannot draw that line: whoever may define a domain may name
any emulator binary, host file or device in it. So every caller-supplied
document (and again every document vmplacer renders) is walked against an
allowlist of elements and attributes (`SPEC`):

- anything not in the allowlist is refused (rule `allowlist`);
- a few constructs are refused by a named rule that a host's configuration may
  lift by that name (`xml_policy.allow`, see `EXCEPTIONS`);
- every host path (disk, serial, console, channel, filesystem sources, kernel
  and firmware files, sockets) must lie under the host's storage paths: the
  configured ones, else the target paths of the host's libvirt storage pools;
- `<emulator>` may only name the host's own emulator (libvirt's domain
  capabilities), or be absent.

A refusal names the element (an XPath-like path), the attribute and the rule.
"""

from __future__ import annotations

import posixpath
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lxml import etree

from vmplacer.adapters.domain_xml import DomainXmlError, parse_domain

ALLOWLIST = "allowlist"
SOURCE_PATH = "source-path"
# Named rules a host may lift with `xml_policy.allow: [NAME, ...]`.
EXCEPTIONS: Mapping[str, str] = {
    "domain-type": "domain types other than kvm and qemu",
    "emulator": "an <emulator> other than the host's own",
    SOURCE_PATH: "host paths outside the storage paths",
    "hostdev": "host devices: <hostdev>, <interface type='hostdev'>",
    "filesystem": "<filesystem>: host directories passed through to the guest",
    "seclabel": "a <seclabel> that weakens confinement: type none or static, relabel='no', a chosen label",
    "direct-boot": "<kernel>, <initrd>, <cmdline>, <dtb>; their files must still lie under the storage paths",
    "firmware": "<loader>, <nvram>, ACPI tables; their files must still lie under the storage paths",
    "hypervisor-namespace": "hypervisor pass-through elements such as qemu:commandline",
}
# Pool types whose target path is a directory of guest images (not /dev as a whole).
DIRECTORY_POOL_TYPES = ("dir", "fs", "netfs", "logical", "zfs")
# Never storage roots, whatever a pool or a configuration says.
SYSTEM_DIRECTORIES = frozenset({
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/root",
    "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/lib", "/var/run", "/var/tmp",
})
HYPERVISOR_NAMESPACE_PREFIX = "http://libvirt.org/schemas/domain/"
# libvirt's default storage pool: the storage path of a host known only from a capabilities file.
DEFAULT_POOL_PATH = "/var/lib/libvirt/images"
FACTS_TTL_S = 60.0
MAX_VIOLATIONS = 50  # a hostile document cannot make the answer arbitrarily long


class DomainXmlPolicyError(DomainXmlError):
    """A document the host's policy refuses; `violations` names each element, attribute and rule."""

    def __init__(self, host: str, guest: str, what: str, violations: Sequence[Violation]):
        self.host = host
        self.guest = guest
        self.what = what
        self.violations = tuple(violations)
        listed = "; ".join(str(v) for v in self.violations)
        if len(self.violations) >= MAX_VIOLATIONS:
            listed += f"; (only the first {MAX_VIOLATIONS} are listed)"
        super().__init__(f"guest {guest}: {what} refused by the domain XML policy of host {host}: {listed}")


@dataclass(frozen=True)
class Violation:
    element: str  # XPath-like: /domain/devices/disk[2]/source
    attribute: str | None
    rule: str
    reason: str

    def __str__(self) -> str:
        where = self.element + (f" @{self.attribute}" if self.attribute else "")
        return f"{where}: rule {self.rule}: {self.reason}"

    def to_dict(self) -> dict[str, str | None]:
        return {"element": self.element, "attribute": self.attribute, "rule": self.rule, "reason": self.reason}


@dataclass(frozen=True)
class HostFacts:
    """What the policy trusts about a host: its emulator binaries and its storage pools' paths."""

    emulators: frozenset[str] = frozenset()
    pool_paths: tuple[str, ...] = ()


# ----- the allowlist ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Values:
    """Allowed values of an attribute (or text); others are refused by `named[value]`, else `otherwise`."""

    allowed: frozenset[str]
    named: Mapping[str, str] = field(default_factory=dict)
    otherwise: str = ALLOWLIST

    def rule(self, value: str) -> str | None:
        """None when `value` is allowed, else the rule that refuses it."""
        return None if value in self.allowed else self.named.get(value, self.otherwise)


@dataclass(frozen=True)
class Spec:
    """One element: its attributes (None: any), children (None: any subtree), constraints."""

    attrs: frozenset[str] | None = frozenset()
    children: Mapping[str, Spec] | None = field(default_factory=dict)
    values: Mapping[str, Values] = field(default_factory=dict)
    paths: frozenset[str] = frozenset()  # attributes holding host paths
    text_path: bool = False  # the element's text (when there is one) is a host path
    text: Values | None = None  # allowed texts
    opaque: bool = False  # a subtree libvirt stores without acting on it (<metadata>)
    rule: str | None = None  # refused by this named rule unless the host lifts it
    check: str | None = None  # a special check: "emulator" | "seclabel"


INERT = Spec(attrs=None, children=None)  # guest-visible settings without host paths


def _spec(attrs: str = "", children: Mapping[str, Spec] | None = None, **kwargs: object) -> Spec:
    return Spec(attrs=frozenset(attrs.split()), children={} if children is None else children, **kwargs)  # type: ignore[arg-type]


def _values(*allowed: str, otherwise: str = ALLOWLIST, **named: str) -> Values:
    return Values(frozenset(allowed), named, otherwise)


TEXT = _spec()
ADDRESS = Spec(attrs=None, children={})
ALIAS = _spec("name")
DEVICE_SECLABEL = _spec("model relabel", check="seclabel")
DRIVER = INERT  # cache modes, queues, iothreads: no host paths
BOOT = _spec("order loadparm")

DISK_SOURCE = _spec("file dev dir pool volume mode startupPolicy index",
                    {"seclabel": DEVICE_SECLABEL,
                     "slices": _spec("", {"slice": _spec("type offset size")})},
                    paths=frozenset({"file", "dev", "dir"}))
DISK_TYPES = ("file", "block", "dir", "volume")


def _backing_store(depth: int) -> Spec:
    children: dict[str, Spec] = {"format": _spec("type"), "source": DISK_SOURCE}
    if depth:
        children["backingStore"] = _backing_store(depth - 1)
    return _spec("type index", children, values={"type": _values(*DISK_TYPES)})


DISK = _spec("type device snapshot model", {
    "driver": DRIVER, "source": DISK_SOURCE, "backingStore": _backing_store(8),
    "target": _spec("dev bus tray removable rotation_rate"), "iotune": INERT, "boot": BOOT,
    "readonly": TEXT, "shareable": TEXT, "transient": _spec("shareBacking"), "serial": TEXT, "wwn": TEXT,
    "vendor": TEXT, "product": TEXT, "address": ADDRESS, "alias": ALIAS, "geometry": _spec("cyls heads secs trans"),
    "blockio": _spec("logical_block_size physical_block_size discard_granularity"),
    "encryption": _spec("format engine", {"secret": _spec("type usage uuid")}),
}, values={"type": _values(*DISK_TYPES), "device": _values("disk", "cdrom", "floppy")})

CHAR_SOURCE = _spec("path mode append", {"seclabel": DEVICE_SECLABEL, "reconnect": _spec("enabled timeout")},
                    paths=frozenset({"path"}))
CHAR_CHILDREN: dict[str, Spec] = {
    "source": CHAR_SOURCE, "target": _spec("type port name state address", {"model": _spec("name")}),
    "log": _spec("file append", paths=frozenset({"file"})), "alias": ALIAS, "address": ADDRESS,
}
CHAR_TYPES = ("pty", "file", "unix", "null", "vc", "pipe")
SERIAL = _spec("type", CHAR_CHILDREN, values={"type": _values(*CHAR_TYPES)})
CHANNEL = _spec("type", CHAR_CHILDREN, values={"type": _values(*CHAR_TYPES, "spicevmc", "spiceport",
                                                                "qemu-vdagent")})

INTERFACE = _spec("type trustGuestRxFilters", {
    "source": _spec("network portgroup bridge", {"address": ADDRESS}), "mac": _spec("address type check"),
    "model": _spec("type"), "target": _spec("dev"),
    "driver": Spec(attrs=None, children={"host": ADDRESS, "guest": ADDRESS}),
    "virtualport": _spec("type", {"parameters": ADDRESS}), "bandwidth": INERT, "vlan": INERT,
    "link": _spec("state"), "mtu": _spec("size"), "boot": BOOT, "rom": _spec("bar enabled"), "address": ADDRESS,
    "alias": ALIAS, "coalesce": INERT, "filterref": INERT, "ip": ADDRESS, "route": ADDRESS, "tune": INERT,
    "acpi": _spec("index"), "teaming": _spec("type persistent"), "guest": _spec("dev actual"),
}, values={"type": _values("network", "bridge", "user", hostdev="hostdev")})

FILESYSTEM = _spec("type accessmode model multidevs fmode dmode", {
    "driver": DRIVER, "source": _spec("dir file dev name usage units", paths=frozenset({"dir", "file", "dev"})),
    "target": _spec("dir"), "readonly": TEXT, "address": ADDRESS, "alias": ALIAS, "idmap": INERT,
    "space_hard_limit": _spec("unit"), "space_soft_limit": _spec("unit"),
}, rule="filesystem")

GRAPHICS = _spec("type port autoport tlsPort listen passwd passwdValidTo connected keymap sharePolicy "
                 "websocket defaultMode socket", {
                     "listen": _spec("type address network socket", paths=frozenset({"socket"})),
                     "channel": INERT, "image": INERT, "jpeg": INERT, "zlib": INERT, "playback": INERT,
                     "streaming": INERT, "clipboard": INERT, "mouse": INERT, "filetransfer": INERT,
                     "gl": _spec("enable"), "audio": _spec("id"),
                 }, values={"type": _values("vnc", "spice")}, paths=frozenset({"socket"}))

DEVICES: dict[str, Spec] = {
    "emulator": _spec(check="emulator"),
    "disk": DISK,
    "controller": INERT,
    "interface": INTERFACE,
    "serial": SERIAL, "console": SERIAL, "parallel": SERIAL, "channel": CHANNEL,
    "input": _spec("type bus model", {"address": ADDRESS, "alias": ALIAS, "driver": DRIVER},
                   values={"type": _values("mouse", "tablet", "keyboard")}),
    "graphics": GRAPHICS,
    "video": _spec("", {"model": _spec("type vram vram64 ram vgamem heads primary blob", {
        "acceleration": _spec("accel3d accel2d"), "resolution": _spec("x y")}), "address": ADDRESS, "alias": ALIAS}),
    "sound": _spec("model", {"codec": _spec("type"), "audio": _spec("id"), "address": ADDRESS, "alias": ALIAS}),
    "audio": _spec("id type", values={"type": _values("none", "spice")}),
    "watchdog": _spec("model action", {"address": ADDRESS, "alias": ALIAS}),
    "memballoon": _spec("model autodeflate freePageReporting", {"stats": _spec("period"), "address": ADDRESS,
                                                                "alias": ALIAS, "driver": DRIVER}),
    "rng": _spec("model", {"backend": _spec("model", values={"model": _values("random")},
                                            text=_values("", "/dev/urandom", "/dev/random")),
                           "rate": _spec("bytes period"), "address": ADDRESS, "alias": ALIAS, "driver": DRIVER}),
    "tpm": _spec("model", {"backend": _spec("type version persistent_state", {
        "encryption": _spec("secret"), "active_pcr_banks": INERT}, values={"type": _values("emulator")}),
        "alias": ALIAS}),
    "panic": _spec("model", {"address": ADDRESS}),
    "vsock": _spec("model", {"cid": _spec("auto address"), "address": ADDRESS, "alias": ALIAS, "driver": DRIVER}),
    "iommu": _spec("model", {"driver": DRIVER, "address": ADDRESS, "alias": ALIAS}),
    "memory": _spec("model access discard", {
        "target": INERT, "source": _spec("", {"pagesize": _spec("unit"), "nodemask": TEXT, "alignsize": _spec("unit")}),
        "address": ADDRESS, "alias": ALIAS}, values={"model": _values("dimm", "virtio-mem")}),
    "crypto": _spec("model type", {"backend": _spec("model queues"), "address": ADDRESS, "alias": ALIAS}),
    "hub": _spec("type", {"address": ADDRESS, "alias": ALIAS}),
    "filesystem": FILESYSTEM,
    "hostdev": Spec(attrs=None, children=None, rule="hostdev"),
}

OS = _spec("firmware", {
    "type": _spec("arch machine"), "boot": _spec("dev"), "bootmenu": _spec("enable timeout"),
    "smbios": _spec("mode", values={"mode": _values("emulate", "sysinfo")}),
    "bios": _spec("useserial rebootTimeout"), "firmware": _spec("", {"feature": _spec("enabled name")}),
    "kernel": _spec(rule="direct-boot", text_path=True), "initrd": _spec(rule="direct-boot", text_path=True),
    "dtb": _spec(rule="direct-boot", text_path=True), "cmdline": _spec(rule="direct-boot"),
    "loader": _spec("readonly secure type stateless format", rule="firmware", text_path=True),
    "nvram": _spec("template format type", rule="firmware", text_path=True, paths=frozenset({"template"})),
    "acpi": _spec("", {"table": _spec("type", text_path=True)}, rule="firmware"),
})

SMBIOS_BLOCK = _spec("", {"entry": _spec("name")})
DOMAIN = _spec("type id", {
    "name": TEXT, "uuid": TEXT, "genid": TEXT, "title": TEXT, "description": TEXT,
    # other applications' data: libvirt stores it and never acts on it
    "metadata": Spec(attrs=None, children=None, opaque=True),
    "maxMemory": _spec("slots unit"), "memory": _spec("unit dumpCore"), "currentMemory": _spec("unit"),
    "blkiotune": _spec("", {"weight": TEXT}),
    "memtune": _spec("", {k: _spec("unit") for k in ("hard_limit", "soft_limit", "swap_hard_limit",
                                                      "min_guarantee")}),
    "memoryBacking": _spec("", {
        "hugepages": _spec("", {"page": _spec("size unit nodeset")}), "nosharepages": TEXT, "locked": TEXT,
        "source": _spec("type"), "access": _spec("mode"), "allocation": _spec("mode threads"), "discard": TEXT}),
    "vcpu": _spec("placement cpuset current"),
    "vcpus": _spec("", {"vcpu": _spec("id enabled hotpluggable order")}),
    "iothreads": TEXT,
    "iothreadids": _spec("", {"iothread": INERT}),
    "defaultiothread": _spec("thread_pool_min thread_pool_max"),
    "cputune": _spec("", {
        **{k: TEXT for k in ("shares", "period", "quota", "global_period", "global_quota", "emulator_period",
                             "emulator_quota", "iothread_period", "iothread_quota")},
        "vcpupin": _spec("vcpu cpuset"), "emulatorpin": _spec("cpuset"), "iothreadpin": _spec("iothread cpuset")}),
    "numatune": _spec("", {"memory": _spec("mode nodeset placement"), "memnode": _spec("cellid mode nodeset")}),
    "sysinfo": _spec("type", {k: SMBIOS_BLOCK for k in ("bios", "system", "baseBoard", "chassis",
                                                        "processor", "memory", "oemStrings")},
                     values={"type": _values("smbios")}),
    "os": OS,
    "features": INERT, "cpu": INERT, "clock": INERT, "pm": INERT, "perf": INERT,
    "on_poweroff": TEXT, "on_reboot": TEXT, "on_crash": TEXT, "on_lockfailure": TEXT,
    "devices": _spec("", DEVICES),
    "seclabel": _spec("type model relabel", check="seclabel"),
    "keywrap": _spec("", {"cipher": _spec("name state")}),
}, values={"type": _values("kvm", "qemu", otherwise="domain-type")})

SECLABEL_MODELS = ("selinux", "apparmor", "dac")


# ----- checking -------------------------------------------------------------------------------------
class DomainXmlPolicy:
    """The policy of one host: its lifted rules, storage paths and (read when needed) facts."""

    def __init__(self, host: str, *, allow: Iterable[str] = (), storage_paths: Sequence[str] | None = None,
                 facts: Callable[[], HostFacts] | None = None, facts_ttl_s: float = FACTS_TTL_S,
                 clock: Callable[[], float] = time.monotonic):
        """`storage_paths` None: the host's pool paths (from `facts`). `facts` is called only when a
        document names an emulator or a host path, and its answer kept for `facts_ttl_s`."""
        unknown = sorted(set(allow) - set(EXCEPTIONS))
        if unknown:
            raise ValueError(f"unknown domain XML policy exceptions: {', '.join(unknown)}")
        self.host = host
        self.allow = frozenset(allow)
        self.storage_paths = None if storage_paths is None else tuple(storage_paths)
        self._facts = facts or HostFacts
        self._ttl = facts_ttl_s
        self._clock = clock
        self._cached: tuple[float, HostFacts] | None = None
        self._lock = threading.Lock()

    def facts(self) -> HostFacts:
        with self._lock:
            if self._cached is not None and self._clock() - self._cached[0] < self._ttl:
                return self._cached[1]
        facts = self._facts()
        with self._lock:
            self._cached = (self._clock(), facts)
        return facts

    def roots(self) -> tuple[str, ...]:
        """The directories host paths must lie under."""
        if self.storage_paths is not None:
            return self.storage_paths
        return tuple(p for p in (normal_path(p) for p in self.facts().pool_paths) if p and safe_storage_root(p))

    def violations(self, document: str | bytes | etree._Element) -> list[Violation]:
        root = parse_domain(document) if isinstance(document, (str, bytes)) else document
        walk = _Walk(self)
        walk.element(root, DOMAIN, f"/{root.tag}")
        return walk.found

    def check(self, document: str | bytes | etree._Element, guest: str, what: str = "base_xml") -> None:
        """Raise DomainXmlPolicyError listing every violation, if any."""
        found = self.violations(document)
        if found:
            raise DomainXmlPolicyError(self.host, guest, what, found)


class _Walk:
    def __init__(self, policy: DomainXmlPolicy):
        self.policy = policy
        self.found: list[Violation] = []

    def refuse(self, where: str, attribute: str | None, rule: str, reason: str) -> None:
        if len(self.found) < MAX_VIOLATIONS:
            self.found.append(Violation(where, attribute, rule, reason))

    def lifted(self, rule: str) -> bool:
        return rule in self.policy.allow

    def unless(self, rule: str) -> str:
        return f"not allowed on host {self.policy.host} without the exception {rule!r}"

    def element(self, element: etree._Element, spec: Spec, where: str) -> None:
        if spec.rule and not self.lifted(spec.rule):
            self.refuse(where, None, spec.rule, f"<{_name(element)}> is {self.unless(spec.rule)}")
            return
        if spec.check == "seclabel":
            if not self.lifted("seclabel"):
                self.seclabel(element, where)
            return
        if spec.check == "emulator":
            self.emulator(element, where)
        self.attributes(element, spec, where)
        text = (element.text or "").strip()
        if spec.text is not None and spec.text.rule(text):
            self.refuse(where, None, ALLOWLIST, f"text {text!r} is not allowed (allowed: "
                        f"{', '.join(repr(t) for t in sorted(spec.text.allowed))})")
        if spec.text_path and text:
            self.path(where, None, text)
        if spec.children is None:
            if not spec.opaque:
                self.scan_namespaces(element, where)
            return
        children = [child for child in element if isinstance(child.tag, str)]  # not comments, PIs
        totals: dict[str, int] = {}
        for child in children:
            totals[child.tag] = totals.get(child.tag, 0) + 1
        counts: dict[str, int] = {}
        for child in children:
            tag = child.tag
            counts[tag] = counts.get(tag, 0) + 1
            path = f"{where}/{_name(child)}" + (f"[{counts[tag]}]" if totals[tag] > 1 else "")
            if tag[0] == "{":
                self.foreign(child, etree.QName(tag).namespace, path)
            elif tag in spec.children:
                self.element(child, spec.children[tag], path)
            else:
                self.refuse(path, None, ALLOWLIST, f"<{tag}> is not in the allowlist under <{_name(element)}>")

    def scan_namespaces(self, element: etree._Element, where: str) -> None:
        """Inside a subtree allowed as a whole, still no element of another namespace."""
        for child in element.iterdescendants():
            if isinstance(child.tag, str) and child.tag[0] == "{":
                self.foreign(child, etree.QName(child).namespace, f"{where}//{_name(child)}")

    def foreign(self, element: etree._Element, namespace: str, where: str) -> None:
        if namespace.startswith(HYPERVISOR_NAMESPACE_PREFIX):
            if not self.lifted("hypervisor-namespace"):
                self.refuse(where, None, "hypervisor-namespace",
                            f"<{_name(element)}> of namespace {namespace} passes raw settings to the hypervisor: "
                            + self.unless("hypervisor-namespace"))
            return
        self.refuse(where, None, ALLOWLIST, f"elements of namespace {namespace} belong only inside <metadata>")

    def attributes(self, element: etree._Element, spec: Spec, where: str) -> None:
        for key, value in element.attrib.items():
            name = _name_of(key)
            if key[0] == "{" or (spec.attrs is not None and key not in spec.attrs):
                self.refuse(where, name, ALLOWLIST, f"attribute {name} of <{_name(element)}> is not in the allowlist")
                continue
            allowed = spec.values.get(key)
            rule = allowed.rule(value) if allowed is not None else None
            if rule == ALLOWLIST:
                choices = ", ".join(sorted(allowed.allowed))  # type: ignore[union-attr]
                self.refuse(where, name, ALLOWLIST, f"{name}={value!r} is not allowed (allowed: {choices})")
            elif rule is not None and not self.lifted(rule):
                self.refuse(where, name, rule, f"{name}={value!r} is {self.unless(rule)}")
            if key in spec.paths:
                self.path(where, name, value)

    def path(self, where: str, attribute: str | None, value: str) -> None:
        if self.lifted(SOURCE_PATH):
            return
        path = normal_path(value)
        if path is None:
            self.refuse(where, attribute, SOURCE_PATH, f"{value!r} is not an absolute path")
            return
        roots = self.policy.roots()
        if not roots:
            self.refuse(where, attribute, SOURCE_PATH,
                        f"{path}: host {self.policy.host} has no storage paths (no directory storage pool, "
                        "none configured in xml_policy.storage_paths)")
        elif not any(path == root or path.startswith(root + "/") for root in roots):
            shown = path if path == value else f"{value!r} (that is {path})"
            self.refuse(where, attribute, SOURCE_PATH,
                        f"{shown} is outside the storage paths of host {self.policy.host} ({', '.join(roots)})")

    def emulator(self, element: etree._Element, where: str) -> None:
        if self.lifted("emulator"):
            return
        text = (element.text or "").strip()
        own = self.policy.facts().emulators
        if text not in own:
            known = ", ".join(sorted(own)) or "none known, so <emulator> must be left out"
            self.refuse(where, None, "emulator", f"{text!r} is not the emulator of host {self.policy.host} ({known})")

    def seclabel(self, element: etree._Element, where: str) -> None:
        """Only confinement as the host configures it: dynamic labels, relabelling on, no chosen label."""
        parent = element.getparent()
        device = parent is not None and parent.tag != "domain"  # a disk's or a console's own label
        kind = element.get("type", "dynamic")
        if device and "type" in element.attrib:
            self.refuse(where, "type", ALLOWLIST, "attribute type of a device's <seclabel> is not in the allowlist")
        elif kind != "dynamic":
            self.refuse(where, "type", "seclabel", f"type={kind!r} turns confinement off or chooses the label: "
                        + self.unless("seclabel"))
        if element.get("relabel", "yes") != "yes":
            self.refuse(where, "relabel", "seclabel", f"relabel={element.get('relabel')!r} leaves files unlabelled: "
                        + self.unless("seclabel"))
        model = element.get("model")
        if model is not None and model not in SECLABEL_MODELS:
            self.refuse(where, "model", "seclabel", f"model={model!r} (allowed: {', '.join(SECLABEL_MODELS)})")
        for key in element.attrib:
            if key not in ("type", "model", "relabel"):
                self.refuse(where, _name_of(key), ALLOWLIST, f"attribute {_name_of(key)} of <seclabel> "
                            "is not in the allowlist")
        for child in element:
            if isinstance(child.tag, str):
                self.refuse(f"{where}/{_name(child)}", None, "seclabel",
                            f"<{_name(child)}> chooses the label itself: " + self.unless("seclabel"))


def _name(element: etree._Element) -> str:
    """The element's name as written: `disk`, `qemu:commandline`."""
    tag = element.tag
    if tag[0] != "{":
        return tag
    localname = etree.QName(tag).localname
    return f"{element.prefix}:{localname}" if element.prefix else localname


def _name_of(key: str) -> str:
    return etree.QName(key).localname if key[0] == "{" else key


# ----- paths ----------------------------------------------------------------------------------------
def normal_path(value: str) -> str | None:
    """`value` as an absolute, lexically normalised path (no `..`, no `//`), or None."""
    if not value.startswith("/") or "\x00" in value:
        return None
    path = posixpath.normpath(value)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return path


def safe_storage_root(path: str) -> bool:
    """A directory that may hold guest files: absolute, normalised, not a system directory."""
    return normal_path(path) == path and path not in SYSTEM_DIRECTORIES


# ----- facts from libvirt's own documents ---------------------------------------------------------
def _parse(xml_text: str) -> etree._Element | None:
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)
    try:
        return etree.fromstring(xml_text.encode("utf-8"), parser)
    except etree.XMLSyntaxError:
        return None


def emulators_in(capabilities_xml: str, domain_capabilities_xml: Iterable[str] = ()) -> frozenset[str]:
    """The emulator binaries a host reports: domain capabilities' <path>, capabilities' <emulator>s."""
    found: set[str] = set()
    for text in domain_capabilities_xml:
        root = _parse(text)
        if root is not None:
            found.update(p.strip() for p in root.xpath("/domainCapabilities/path/text()") if p.strip())
    root = _parse(capabilities_xml)
    if root is not None:
        found.update(p.strip() for p in root.xpath("/capabilities/guest/arch//emulator/text()") if p.strip())
    return frozenset(found)


def pool_path(pool_xml: str) -> str | None:
    """The target directory of a storage pool whose type keeps guest images there, else None."""
    root = _parse(pool_xml)
    if root is None or root.get("type") not in DIRECTORY_POOL_TYPES:
        return None
    path = normal_path(root.findtext("target/path") or "")
    return path if path and safe_storage_root(path) else None
