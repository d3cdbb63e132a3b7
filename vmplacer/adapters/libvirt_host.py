"""A libvirt host behind the `Hypervisor` port (libvirt-python, no shell).

Every libvirt failure becomes a `HypervisorError` naming the host and the
domain, so callers (CLI, API, executor) can report it without knowing libvirt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

import libvirt

from vmplacer.adapters.libvirt_domain_events import DomainEvents
from vmplacer.adapters.libvirt_errors import operation_failed, refused_definition, refused_start
from vmplacer.adapters.libvirt_open import OpenTimedOut, open_within
from vmplacer.adapters.shared_read import SharedRead
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.bandwidth import UNLIMITED, BandwidthError, CpuBandwidth
from vmplacer.core.topology.host import HostTopology
from vmplacer.ports import DomainGone, DomainInfo, Hypervisor, HypervisorError

T = TypeVar("T")

# libvirt prints every error to stderr by default; we report them ourselves.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)

_STATE_NAMES = {
    libvirt.VIR_DOMAIN_NOSTATE: "nostate",
    libvirt.VIR_DOMAIN_RUNNING: "running",
    libvirt.VIR_DOMAIN_BLOCKED: "blocked",
    libvirt.VIR_DOMAIN_PAUSED: "paused",
    libvirt.VIR_DOMAIN_SHUTDOWN: "shutdown",
    libvirt.VIR_DOMAIN_SHUTOFF: "shutoff",
    libvirt.VIR_DOMAIN_CRASHED: "crashed",
    libvirt.VIR_DOMAIN_PMSUSPENDED: "pmsuspended",
}
_PAUSE_REASONS = {
    libvirt.VIR_DOMAIN_PAUSED_UNKNOWN: "unknown",
    libvirt.VIR_DOMAIN_PAUSED_USER: "user",
    libvirt.VIR_DOMAIN_PAUSED_MIGRATION: "migration",
    libvirt.VIR_DOMAIN_PAUSED_SAVE: "save",
    libvirt.VIR_DOMAIN_PAUSED_DUMP: "dump",
    libvirt.VIR_DOMAIN_PAUSED_IOERROR: "ioerror",
    libvirt.VIR_DOMAIN_PAUSED_WATCHDOG: "watchdog",
    libvirt.VIR_DOMAIN_PAUSED_FROM_SNAPSHOT: "snapshot",
    libvirt.VIR_DOMAIN_PAUSED_SHUTTING_DOWN: "shutting-down",
    libvirt.VIR_DOMAIN_PAUSED_SNAPSHOT: "snapshot",
    libvirt.VIR_DOMAIN_PAUSED_CRASHED: "crashed",
    libvirt.VIR_DOMAIN_PAUSED_STARTING_UP: "starting-up",
    libvirt.VIR_DOMAIN_PAUSED_POSTCOPY: "postcopy",
    libvirt.VIR_DOMAIN_PAUSED_POSTCOPY_FAILED: "postcopy-failed",
}
# What the kernel reports for "no limit" besides -1 (cgroup v2 'max' as libvirt hands it over).
_QUOTA_UNLIMITED_FROM = 17_592_186_044_415


def state_name(state: int) -> str:
    return _STATE_NAMES.get(state, f"state-{state}")


def pause_reason_name(reason: int) -> str:
    return _PAUSE_REASONS.get(reason, f"reason-{reason}")


class HostAddress(Protocol):
    """What the adapter needs to know of a host (the config's HostSettings has it): plain
    values, so adapters stay below the config layer."""

    @property
    def name(self) -> str: ...
    @property
    def uri(self) -> str: ...
    @property
    def reserved_cpus(self) -> frozenset[int]: ...
    @property
    def capabilities(self) -> Path | None:
        """Topology from this file instead of the host (test driver only)."""
        ...
    @property
    def domain_resync_s(self) -> float:
        """Every domain's XML is re-read at least this often (s) although no event said it changed; 0: always."""
        ...
    @property
    def connect_timeout_s(self) -> float:
        """The longest wait for the daemon to answer an open."""
        ...


class LibvirtHost(Hypervisor):
    """One libvirt connection, opened lazily and reopened after the daemon restarts."""

    def __init__(self, settings: HostAddress, clock: Callable[[], float] = time.monotonic):
        self.name = settings.name
        self.uri = settings.uri
        self.settings = settings
        self._conn: libvirt.virConnect | None = None
        self._lock = threading.Lock()
        # Parsed domain XML by domain UUID: (the XML text it came from, placement, labels).
        # Keyed by the text itself, so any change libvirt reports, by anyone, is parsed anew.
        self._parsed: dict[str, tuple[str, Placement, dict[str, str]]] = {}
        self._topology_from_file: tuple[tuple[int, int, int], HostTopology] | None = None
        # What placing read of each domain, by name: its XML text and that text parsed. Only the
        # domains `_events` marks are read again, besides every domain each resync.
        self._placing_view: dict[str, tuple[str, tuple[Placement, dict[str, str]]]] = {}
        self._events = DomainEvents(self.name, settings.domain_resync_s, clock)
        # Placing reads on the current connection. Domain events only pay off from a connection's
        # second read (the first reads every domain anyway), so they are registered then: a
        # one-shot command reading each of 10,000 hosts once never registers (nor, closing,
        # deregisters) five callbacks per host.
        self._placing_reads = 0
        # Concurrent callers share a read that started after they called (see shared_read).
        self._domains_read = SharedRead(self._read_domains)
        self._placements_read = SharedRead(self._read_placements)
        self._topology_read = SharedRead(self._read_topology)

    # ----- connection ----------------------------------------------------------------
    def connection(self) -> libvirt.virConnect:
        with self._lock:
            if self._conn is not None:
                try:
                    if self._conn.isAlive():
                        return self._conn
                except libvirt.libvirtError:
                    pass
                self._close_quietly()
            try:
                self._conn = open_within(self.uri, self.settings.connect_timeout_s)
            except (libvirt.libvirtError, OpenTimedOut) as exc:
                why = exc.get_error_message() if isinstance(exc, libvirt.libvirtError) else str(exc)
                raise HypervisorError(f"host {self.name}: cannot connect to {self.uri}: {why}",
                                      host=self.name, retriable=True) from None
            self._placing_reads = 0  # events are asked for at this connection's second placing read
            return self._conn

    def close(self) -> None:
        with self._lock:
            self._close_quietly()

    def _close_quietly(self) -> None:
        if self._conn is not None:
            self._events.unwatch(self._conn)
            try:
                self._conn.close()
            except libvirt.libvirtError:
                pass
            self._conn = None

    def _call(self, what: str, fn: Callable[[], T], domain: str = "") -> T:
        try:
            return fn()
        except libvirt.libvirtError as exc:
            raise self._failure(what, exc, domain) from None

    def _changing(self, name: str, what: str, fn: Callable[[], T]) -> T:
        """An operation that changes the domain: marked changed however it ends (a failure may
        have changed it part way)."""
        try:
            return self._call(what, fn, name)
        finally:
            self.changed(name)

    def _failure(self, what: str, exc: libvirt.libvirtError, domain: str = "") -> HypervisorError:
        return operation_failed(exc, host=self.name, domain=domain, what=what)

    def ping(self) -> dict[str, object]:
        """Liveness facts for `vmplacer hosts` and /readyz; raises HypervisorError."""
        conn = self.connection()
        return {
            "hostname": self._call("getHostname", conn.getHostname),
            "libvirt_version": self._call("getLibVersion", conn.getLibVersion),
            "driver": self._call("getType", conn.getType),
            "domains": len(self._call("listAllDomains", conn.listAllDomains)),
        }

    # ----- topology and domains --------------------------------------------------------
    def capabilities_xml(self) -> str:
        conn = self.connection()
        return self._call("getCapabilities", conn.getCapabilities)

    def topology(self) -> HostTopology:
        """The host's topology with its free memory now (read by libvirt after this call), or
        from the configured capabilities file (a test-driver host standing in for a real
        machine: read as idle, its domains then count)."""
        return self._topology_read.get()

    @property
    def capabilities_source(self) -> str:
        """Where `topology` reads the host's pCPUs from, as messages name it: the configured
        capabilities file, or libvirt's capabilities of the host's URI."""
        if self.settings.capabilities is not None:
            return f"capabilities file {self.settings.capabilities}"
        return f"libvirt capabilities of {self.uri}"

    def _read_topology(self) -> HostTopology:
        from vmplacer.adapters.capabilities import CapabilitiesError, read_capabilities_file, read_capabilities_live

        try:
            if self.settings.capabilities is not None:
                self.connection()  # the host must answer all the same: its domains live there
                return self._file_topology(read_capabilities_file)
            else:
                conn = self.connection()
                topology = self._call("read capabilities", lambda: read_capabilities_live(conn, self.name))
        except CapabilitiesError as exc:
            raise HypervisorError(f"host {self.name}: unreadable capabilities: {exc}", host=self.name) from None
        return self._reserved(topology)

    def _file_topology(self, read: Callable[[Path, str], HostTopology]) -> HostTopology:
        """The topology of the host's capabilities file, the same object for as long as the file
        is unchanged: what is computed from a topology (the fleet index's room, its shape) is
        kept with it and found again."""
        path = Path(self.settings.capabilities or "")
        try:
            stat = path.stat()
        except OSError as exc:
            raise HypervisorError(f"host {self.name}: unreadable capabilities: {path}: cannot read "
                                  f"({exc.strerror or exc})", host=self.name) from None
        key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        known = self._topology_from_file
        if known is not None and known[0] == key:
            return known[1]
        topology = self._reserved(read(path, self.name))
        self._topology_from_file = (key, topology)
        return topology

    def _reserved(self, topology: HostTopology) -> HostTopology:
        if not self.settings.reserved_cpus:
            return topology
        try:
            return topology.with_reserved(self.settings.reserved_cpus)
        except ValueError as exc:
            raise HypervisorError(f"host {self.name}: reserved_cpus: {exc}", host=self.name) from None

    def _lookup(self, name: str) -> libvirt.virDomain:
        conn = self.connection()
        try:
            return self._call("lookup", lambda: conn.lookupByName(name), name)
        except (ValueError, UnicodeError):  # a NUL or a lone surrogate: libvirt cannot even carry the name
            shown = name.encode("unicode_escape").decode("ascii")
            raise DomainGone(f"host {self.name}: no domain can be named {shown}", host=self.name,
                             domain=shown) from None

    def _info(self, dom: libvirt.virDomain, with_placement: bool = True) -> DomainInfo:
        name = dom.name()
        state, reason = self._call("state", dom.state, name)
        info = self._call("info", dom.info, name)
        uuid = dom.UUIDString()
        placement = None
        labels: dict[str, str] = {}
        if with_placement:
            xml = self._call("XMLDesc", lambda: dom.XMLDesc(0), name)
            placement, labels = self._parsed_xml(uuid, xml)
        return DomainInfo(
            name=name,
            uuid=uuid,
            state=state_name(state),
            pause_reason=pause_reason_name(reason) if state == libvirt.VIR_DOMAIN_PAUSED else None,
            vcpus=int(info[3]),
            memory_kib=int(info[2]),
            placement=placement,
            labels=labels,
        )

    def _parsed_xml(self, uuid: str, xml: str) -> tuple[Placement, dict[str, str]]:
        """A domain's placement and labels, parsed once per distinct XML text: parsing is most
        of the cost of reading a host (~0.4 ms a domain), and placing reads every domain."""
        cached = self._parsed.get(uuid)
        if cached is not None and cached[0] == xml:
            return cached[1], dict(cached[2])
        from vmplacer.adapters.domain_xml import parse_placement_and_labels

        placement, labels = parse_placement_and_labels(xml, self.name)
        self._parsed[uuid] = (xml, placement, labels)
        return placement, dict(labels)

    def domains(self) -> list[DomainInfo]:
        """Every domain with its placement and labels, as libvirt lists them after this call."""
        return list(self._domains_read.get())

    def _read_domains(self) -> list[DomainInfo]:
        conn = self.connection()
        result = []
        for dom in self._call("listAllDomains", conn.listAllDomains):
            try:
                result.append(self._info(dom))
            except DomainGone:
                continue  # undefined while we listed: not ours to report
        self._forget_parses_but({d.uuid for d in result})
        return sorted(result, key=lambda d: d.name)

    def _forget_parses_but(self, listed: set[str]) -> None:
        """Drop the parses of domains no longer listed (undefined). Two reads (`domains`,
        `placements`) may run at once: `list()` copies the keys in one step."""
        for uuid in [u for u in list(self._parsed) if u not in listed]:
            self._parsed.pop(uuid, None)

    def placements(self) -> dict[str, Placement]:
        """Every domain's placement by name, as libvirt lists them after this call: what placing
        needs, with one call per domain (its XML) instead of the three `domains` makes."""
        return {name: placement for name, (placement, _) in self._placements_read.get().items()}

    def labelled_placements(self) -> dict[str, tuple[Placement, dict[str, str]]]:
        """`placements`, each with the domain's labels (what admission scores neighbours by)."""
        return {name: (placement, dict(labels)) for name, (placement, labels) in self._placements_read.get().items()}

    def _read_placements(self) -> dict[str, tuple[Placement, dict[str, str]]]:
        """Every listed domain's placement and labels. libvirt lists the domains (one call, so
        additions and removals are always seen); the XML is read again only of domains not
        read before and of those an event or an own change marked, or of all at a resync
        (`DomainEvents`). Each distinct text is parsed once."""
        conn = self.connection()
        if self._placing_reads == 1 and not self._events.watching:
            self._events.watch(conn)  # everything read before is suspect: this read is a full one
        self._placing_reads += 1
        full, dirty = self._events.take()
        try:
            view = self._read_placing_view(conn, full, dirty)
        except BaseException:
            self._events.give_back(full, dirty)
            raise
        self._placing_view = view
        return {parsed[0].guest: parsed for _, parsed in view.values()}

    def _read_placing_view(self, conn: libvirt.virConnect, full: bool,
                           dirty: frozenset[str]) -> dict[str, tuple[str, tuple[Placement, dict[str, str]]]]:
        from vmplacer.adapters.domain_xml import parse_placement_and_labels

        before = self._placing_view
        by_text: dict[str, tuple[Placement, dict[str, str]]] | None = None  # built when a domain is read
        view: dict[str, tuple[str, tuple[Placement, dict[str, str]]]] = {}
        for dom in self._call("listAllDomains", conn.listAllDomains):
            name = dom.name()
            known = before.get(name)
            if known is not None and not full and name not in dirty:
                view[name] = known
                continue
            try:
                xml = dom.XMLDesc(0)
            except libvirt.libvirtError as exc:
                failure = self._failure("XMLDesc", exc, name)
                if isinstance(failure, DomainGone):
                    continue  # undefined while we listed
                raise failure from None
            if by_text is None:
                by_text = {text: parsed for text, parsed in before.values()}
            parsed = by_text.get(xml)
            if parsed is None:
                parsed = parse_placement_and_labels(xml, self.name)
            view[name] = (xml, parsed)
        return view

    @property
    def domain_events(self) -> DomainEvents:
        """What libvirt's events have said of this host's domains (tests wait on it)."""
        return self._events

    def changed(self, name: str) -> None:
        """Say that this domain was changed by vmplacer (through this connection or another):
        the next read of the host's domains reads it again, not waiting for libvirt's event."""
        self._events.mark(name)

    def domain(self, name: str) -> DomainInfo:
        return self._info(self._lookup(name))

    def domain_state(self, name: str) -> tuple[str, str | None]:
        """(state, pause reason) without parsing XML: cheap enough for freeze loops."""
        dom = self._lookup(name)
        state, reason = self._call("state", dom.state, name)
        return state_name(state), (pause_reason_name(reason) if state == libvirt.VIR_DOMAIN_PAUSED else None)

    def cpu_time_s(self, name: str) -> float:
        """CPU time the domain used since it started (vCPUs and QEMU's threads), from
        virDomainGetInfo: a read that never pauses the guest, for telling an idle guest from a busy one."""
        dom = self._lookup(name)
        info = self._call("info", dom.info, name)
        return float(info[4]) / 1e9

    def domain_xml(self, name: str, inactive: bool = False) -> str:
        dom = self._lookup(name)
        flags = libvirt.VIR_DOMAIN_XML_INACTIVE if inactive else 0
        return self._call("XMLDesc", lambda: dom.XMLDesc(flags), name)

    # ----- operations ------------------------------------------------------------------
    def define(self, xml: str, name: str = "") -> str:
        """Define a domain; a document libvirt refuses for what it says is a DomainRefused."""
        conn = self.connection()
        try:
            dom = conn.defineXML(xml)
        except libvirt.libvirtError as exc:
            refused = refused_definition(exc, host=self.name, domain=name, what="defineXML",
                                         clash=lambda: self._holder_of(conn, xml))
            raise (refused or self._failure("defineXML", exc, name)) from None
        self.changed(_name_of(dom) or name)
        return dom.UUIDString()

    def _holder_of(self, conn: libvirt.virConnect, xml: str) -> str | None:
        """The domain that already has this document's UUID or name, described; None if none."""
        from vmplacer.adapters.domain_xml import DomainXmlError, parse_domain

        try:
            root = parse_domain(xml, "domain XML")
        except DomainXmlError:
            return None
        uuid, name = root.findtext("uuid"), root.findtext("name")
        for what, value, lookup in (("UUID", uuid, conn.lookupByUUIDString), ("name", name, conn.lookupByName)):
            if not value:
                continue
            try:
                holder = lookup(value.strip())
            except (libvirt.libvirtError, ValueError, UnicodeError):
                continue
            return f"domain {holder.name()} already has the {what} {value.strip()}"
        return None

    def start(self, name: str) -> None:
        """Start a defined domain; a start refused for what its XML asks is a DomainRefused."""
        dom = self._lookup(name)
        try:
            dom.create()
        except libvirt.libvirtError as exc:
            refused = refused_start(exc, host=self.name, domain=name)
            raise (refused or self._failure("create", exc, name)) from None
        finally:
            self.changed(name)

    def destroy(self, name: str) -> None:
        dom = self._lookup(name)
        if dom.isActive():
            try:
                self._call("destroy", dom.destroy, name)
            finally:
                self.changed(name)

    def undefine(self, name: str) -> None:
        dom = self._lookup(name)
        self._changing(name, "undefine", dom.undefine)

    def suspend(self, name: str) -> None:
        dom = self._lookup(name)
        self._changing(name, "suspend", dom.suspend)

    def resume(self, name: str) -> None:
        dom = self._lookup(name)
        self._changing(name, "resume", dom.resume)

    def _affect_flags(self, dom: libvirt.virDomain) -> int:
        flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG if dom.isPersistent() else 0
        if dom.isActive():
            flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
        return flags

    def _cpumap(self, cpus: frozenset[int]) -> tuple[bool, ...]:
        conn = self.connection()
        host_cpus = self._call("getCPUMap", lambda: conn.getCPUMap(0))[0]
        bad = sorted(c for c in cpus if c >= host_cpus or c < 0)
        if not cpus or bad:
            raise HypervisorError(
                f"host {self.name}: cpuset {sorted(cpus)} invalid (host has {host_cpus} CPUs)",
                host=self.name,
            )
        return tuple(i in cpus for i in range(host_cpus))

    def pin_vcpu(self, name: str, vcpu: int, cpus: frozenset[int]) -> None:
        dom = self._lookup(name)
        if self._defined_only(dom):
            self._repin_definition(dom, name, cpus, vcpu)
            return
        cpumap = self._cpumap(cpus)
        self._changing(name, "pinVcpuFlags", lambda: dom.pinVcpuFlags(vcpu, cpumap, self._affect_flags(dom)))

    def pin_emulator(self, name: str, cpus: frozenset[int]) -> None:
        """The emulator threads and the domain's IOThreads (which float with them) onto `cpus`."""
        dom = self._lookup(name)
        if self._defined_only(dom):
            self._repin_definition(dom, name, cpus, None)
            return
        cpumap = self._cpumap(cpus)
        flags = self._affect_flags(dom)
        self._changing(name, "pinEmulator", lambda: dom.pinEmulator(cpumap, flags))
        for iothread, _ in self._call("ioThreadInfo", lambda: dom.ioThreadInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE),
                                      name) or ():
            self._changing(name, "pinIOThread", partial(dom.pinIOThread, iothread, cpumap, flags))

    def set_exclusive_cpus(self, name: str, cpus: frozenset[int]) -> None:
        """Record in the domain's vmplacer metadata (live and persistent) that it owns `cpus`
        exclusively: a repin or a migration of a dedicated guest moves what it owns. A domain
        without vmplacer metadata (not placed by vmplacer) is left as it is."""
        from vmplacer.adapters.domain_xml import metadata_with_exclusive_cpus
        from vmplacer.adapters.domain_xml_fields import NAMESPACE

        dom = self._lookup(name)
        element = libvirt.VIR_DOMAIN_METADATA_ELEMENT

        def read() -> str | None:
            try:
                return str(dom.metadata(element, NAMESPACE, 0))
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN_METADATA:
                    return None
                raise

        current = self._call("metadata", read, name)
        if current is None:
            return
        xml = metadata_with_exclusive_cpus(current, frozenset(cpus))
        flags = self._affect_flags(dom)
        self._changing(name, "setMetadata", lambda: dom.setMetadata(element, xml, "vmplacer", NAMESPACE, flags))

    def _defined_only(self, dom: libvirt.virDomain) -> bool:
        """A persistent domain that is not running: its pins live only in its definition."""
        return bool(self._call("isActive", dom.isActive) == 0 and self._call("isPersistent", dom.isPersistent))

    def _repin_definition(self, dom: libvirt.virDomain, name: str, cpus: frozenset[int], vcpu: int | None) -> None:
        """Change the pins of a defined-only domain by redefining its own document (what
        AFFECT_CONFIG does, without a cpumap bounded by the CPUs of the machine libvirt runs on)."""
        from vmplacer.adapters.domain_xml import with_pin

        if not cpus or min(cpus) < 0:
            raise HypervisorError(f"host {self.name}: cpuset {sorted(cpus)} invalid", host=self.name, domain=name)
        xml = self._call("XMLDesc", lambda: dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE),
                         name)
        conn = self.connection()
        self._changing(name, "defineXML", lambda: conn.defineXML(with_pin(xml, cpus, vcpu)))

    def migrate(
        self,
        name: str,
        destination: Hypervisor,
        *,
        bandwidth_mib_s: int | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Live-migrate, persisting on the destination and undefining here.

        Peer to peer: the QEMU driver refuses client-driven ("direct")
        migration, so the source libvirtd connects to the destination itself.
        The timeout is enforced by aborting the job: libvirt then leaves the
        guest running on the source, which is the state we promise on failure.
        """
        if not isinstance(destination, LibvirtHost):
            raise HypervisorError(f"host {self.name}: cannot migrate {name} to a non-libvirt host", host=self.name)
        dom = self._lookup(name)
        flags = (
            libvirt.VIR_MIGRATE_LIVE
            | libvirt.VIR_MIGRATE_PERSIST_DEST
            | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
            | libvirt.VIR_MIGRATE_PEER2PEER
        )
        params: dict[str, object] = {}
        dest_host = destination.uri.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1].split(":")[0]
        if dest_host:
            params[libvirt.VIR_MIGRATE_PARAM_URI] = f"tcp://{dest_host}"
        if bandwidth_mib_s:
            params[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = int(bandwidth_mib_s)
        timer = None
        if timeout_s:
            def _abort() -> None:
                try:
                    dom.abortJob()
                except libvirt.libvirtError:
                    pass

            timer = threading.Timer(timeout_s, _abort)
            timer.daemon = True
            timer.start()
        try:
            self._call(
                f"migrate to {destination.name}",
                lambda: dom.migrateToURI3(destination.uri, params, flags),
                name,
            )
        finally:
            if timer is not None:
                timer.cancel()
            self.changed(name)
            destination.changed(name)

    # ----- CPU bandwidth (CFS quota) ------------------------------------------------------
    def cpu_bandwidth(self, name: str) -> CpuBandwidth:
        """The guest's vCPU and emulator CFS bandwidth as libvirt reads it back (live when running)."""
        dom = self._lookup(name)
        flags = libvirt.VIR_DOMAIN_AFFECT_LIVE if dom.isActive() else libvirt.VIR_DOMAIN_AFFECT_CONFIG
        params = self._bandwidth_call("schedulerParametersFlags", lambda: dom.schedulerParametersFlags(flags), name)
        if "vcpu_quota" not in params or "vcpu_period" not in params:
            raise HypervisorError(f"host {self.name}, domain {name}: the driver reports no vcpu_quota/vcpu_period: "
                                  "CPU bandwidth control is not available", host=self.name, domain=name)

        def quota(key: str) -> int | None:
            if key not in params:
                return None
            value = int(params[key])
            return UNLIMITED if value <= 0 or value >= _QUOTA_UNLIMITED_FROM else value

        try:
            return CpuBandwidth(int(params["vcpu_period"]), quota("vcpu_quota") or UNLIMITED,
                                int(params["emulator_period"]) if "emulator_period" in params else None,
                                quota("emulator_quota"))
        except BandwidthError as exc:
            raise HypervisorError(f"host {self.name}, domain {name}: unexpected CPU bandwidth: {exc}",
                                  host=self.name, domain=name) from None

    def set_cpu_bandwidth(self, name: str, bandwidth: CpuBandwidth) -> None:
        """Set vCPU (and, when given, emulator) CFS bandwidth, live and in the persistent
        definition, so a restarted guest keeps the limit (revert sets the old values the same way)."""
        dom = self._lookup(name)
        params: dict[str, int] = {"vcpu_period": bandwidth.vcpu_period_us, "vcpu_quota": bandwidth.vcpu_quota_us}
        if bandwidth.emulator_quota_us is not None:
            params["emulator_period"] = bandwidth.emulator_period_us or bandwidth.vcpu_period_us
            params["emulator_quota"] = bandwidth.emulator_quota_us
        flags = self._affect_flags(dom)
        try:
            dom.setSchedulerParametersFlags(params, flags)
            self.changed(name)
            return
        except libvirt.libvirtError as exc:
            both = libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG
            if not (flags & both == both and "mutually exclusive" in (exc.get_error_message() or "")):
                raise self._bandwidth_failure("setSchedulerParametersFlags", exc, name) from None
        # Drivers that take one of LIVE/CONFIG per call: the running guest first, then its definition.
        try:
            for one in (libvirt.VIR_DOMAIN_AFFECT_LIVE, libvirt.VIR_DOMAIN_AFFECT_CONFIG):
                self._bandwidth_call("setSchedulerParametersFlags",
                                     partial(dom.setSchedulerParametersFlags, params, one), name)
        finally:
            self.changed(name)

    def _bandwidth_call(self, what: str, fn: Callable[[], T], domain: str) -> T:
        try:
            return fn()
        except libvirt.libvirtError as exc:
            raise self._bandwidth_failure(what, exc, domain) from None

    def _bandwidth_failure(self, what: str, exc: libvirt.libvirtError, domain: str) -> HypervisorError:
        """A driver without CFS bandwidth control says so plainly; anything else as usual."""
        code, message = exc.get_error_code(), exc.get_error_message() or ""
        unsupported = code in (libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_CONFIG_UNSUPPORTED,
                               libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED)
        if unsupported or (code == libvirt.VIR_ERR_INVALID_ARG and "unsupported" in message):
            return HypervisorError(f"host {self.name}, domain {domain}: CPU bandwidth control is not supported "
                                   f"here ({what}: {message})", host=self.name, domain=domain)
        return self._failure(what, exc, domain)


def _name_of(dom: libvirt.virDomain) -> str:
    try:
        return dom.name()
    except libvirt.libvirtError:
        return ""
