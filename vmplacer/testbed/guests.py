"""Define, start, measure and remove the testbed's tiny guests.

A guest is the testbed image (kernel + initramfs, no disk, no network) run
under TCG (`<domain type='qemu'>`: hardware virtualization is not available to
these machines). Its serial console goes to a file under the testbed state
directory, outside the directories host 2 mounts privately, so the same path
holds the guest's output on either host, before and after a live migration
(the console is opened in append mode on both sides).

The progress lines the guest prints (see `guest_init`) give its speed without
asking libvirt or vmplacer: `progress_rate` is the independent check the
interference measurements are compared against.
"""

from __future__ import annotations

import os
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import libvirt

from vmplacer.testbed.guest_init import BOOT_TAG, DEFAULT_REPORT_MS, PROGRESS_TAG, WORKLOADS
from vmplacer.testbed.image import GuestImage, build_image
from vmplacer.testbed.paths import StateDirs

GUEST_PREFIX = "vmpt-"
# The Debian kernel keeps ~58 MiB for itself (code, data, bss, page tables):
# below ~90 MiB the guest runs out of memory while unpacking its initramfs.
MIN_MEMORY_MIB = 96
MAX_VCPUS = 8

PinSpec = int | str | Mapping[int, int | str] | None

_PROGRESS_LINE = re.compile(rf"{PROGRESS_TAG} (\d+) (\d+(?:\.\d+)?) (\d+)\s*$")


class GuestError(RuntimeError):
    """A testbed guest could not be defined, started or measured."""


@dataclass(frozen=True)
class GuestHandle:
    name: str
    console: Path
    vcpus: int
    memory_mib: int
    workload: str


@dataclass(frozen=True)
class ProgressSample:
    seq: int
    uptime_s: float
    units: int


def _cpuset(value: int | str, name: str, field: str) -> str:
    text = str(value).strip()
    if not re.fullmatch(r"\^?\d+(-\d+)?(,\^?\d+(-\d+)?)*", text):
        raise GuestError(f"guest {name}: {field}={value!r} is not a cpuset like '1' or '0-1,3'")
    return text


def _vcpupins(name: str, vcpus: int, pin: PinSpec) -> dict[int, str]:
    if pin is None:
        return {}
    if isinstance(pin, Mapping):
        pins = {}
        for vcpu, cpus in pin.items():
            if not 0 <= int(vcpu) < vcpus:
                raise GuestError(f"guest {name}: pin names vCPU {vcpu}, but the guest has vCPUs 0-{vcpus - 1}")
            pins[int(vcpu)] = _cpuset(cpus, name, f"pin[{vcpu}]")
        return pins
    cpuset = _cpuset(pin, name, "pin")
    return {vcpu: cpuset for vcpu in range(vcpus)}


def domain_xml(name: str, image: GuestImage, console: Path, *, vcpus: int = 1, memory_mib: int = 96,
               workload: str = "spin", pin: PinSpec = None, emulator_pin: int | str | None = None,
               report_ms: int = DEFAULT_REPORT_MS) -> str:
    """The libvirt XML of one testbed guest (validated arguments, clear errors)."""
    if not name.startswith(GUEST_PREFIX) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise GuestError(f"guest {name!r}: name must start with {GUEST_PREFIX!r} and use only "
                         "letters, digits, '.', '_' and '-' (cleanup finds testbed guests by the prefix)")
    if workload not in WORKLOADS:
        raise GuestError(f"guest {name}: workload={workload!r} must be one of {', '.join(WORKLOADS)}")
    if not 1 <= vcpus <= MAX_VCPUS:
        raise GuestError(f"guest {name}: vcpus={vcpus} must be between 1 and {MAX_VCPUS}")
    if memory_mib < MIN_MEMORY_MIB:
        raise GuestError(f"guest {name}: memory_mib={memory_mib} is below the {MIN_MEMORY_MIB} MiB it needs to boot")
    if report_ms < 50:
        raise GuestError(f"guest {name}: report_ms={report_ms} must be at least 50")

    dom = ET.Element("domain", type="qemu")
    ET.SubElement(dom, "name").text = name
    ET.SubElement(dom, "memory", unit="MiB").text = str(memory_mib)
    ET.SubElement(dom, "vcpu", placement="static").text = str(vcpus)
    pins = _vcpupins(name, vcpus, pin)
    if pins or emulator_pin is not None:
        cputune = ET.SubElement(dom, "cputune")
        for vcpu, cpuset in sorted(pins.items()):
            ET.SubElement(cputune, "vcpupin", vcpu=str(vcpu), cpuset=cpuset)
        if emulator_pin is not None:
            ET.SubElement(cputune, "emulatorpin", cpuset=_cpuset(emulator_pin, name, "emulator_pin"))
    os_el = ET.SubElement(dom, "os")
    ET.SubElement(os_el, "type", arch="x86_64", machine="pc").text = "hvm"
    ET.SubElement(os_el, "kernel").text = str(image.kernel)
    ET.SubElement(os_el, "initrd").text = str(image.initrd)
    # cryptomgr.notests: the kernel's crypto self-tests are slow under TCG and can
    # stall a 2-vCPU guest's boot for a minute on a busy host. no_timer_check: under
    # TCG on a loaded host the IO-APIC timer check can fail and panic the boot.
    ET.SubElement(os_el, "cmdline").text = (
        "console=ttyS0 quiet loglevel=3 panic=-1 cryptomgr.notests no_timer_check "
        f"vmplacer.workload={workload} vmplacer.report_ms={report_ms}")
    features = ET.SubElement(dom, "features")
    ET.SubElement(features, "acpi")
    ET.SubElement(dom, "clock", offset="utc")
    for event in ("on_poweroff", "on_reboot", "on_crash"):
        ET.SubElement(dom, event).text = "destroy"
    devices = ET.SubElement(dom, "devices")
    serial = ET.SubElement(devices, "serial", type="file")
    # append: the migration destination opens the same file and must not truncate it.
    ET.SubElement(serial, "source", path=str(console), append="on")
    ET.SubElement(serial, "target", port="0")
    ET.SubElement(devices, "controller", type="usb", model="none")
    ET.SubElement(devices, "memballoon", model="none")
    return ET.tostring(dom, encoding="unicode")


_images: dict[Path, GuestImage] = {}


def _image_for(dirs: StateDirs) -> GuestImage:
    """The image, checked once per process (the check asks apt, ~0.6 s)."""
    if dirs.root not in _images:
        _images[dirs.root] = build_image(dirs)
    return _images[dirs.root]


def console_path(name: str, dirs: StateDirs | None = None) -> Path:
    return (dirs or StateDirs.default()).consoles_dir / f"{name}.log"


def define_guest(conn: libvirt.virConnect, name: str, *, vcpus: int = 1, memory_mib: int = 96,
                 workload: str = "spin", pin: PinSpec = None, emulator_pin: int | str | None = None,
                 report_ms: int = DEFAULT_REPORT_MS, image: GuestImage | None = None,
                 dirs: StateDirs | None = None) -> GuestHandle:
    """Define (persistently, not started) one testbed guest on `conn`; a stale console file is removed."""
    dirs = dirs or StateDirs.default()
    image = image or _image_for(dirs)
    dirs.consoles_dir.mkdir(parents=True, exist_ok=True)
    dirs.consoles_dir.chmod(0o755)
    console = console_path(name, dirs)
    xml = domain_xml(name, image, console, vcpus=vcpus, memory_mib=memory_mib, workload=workload,
                     pin=pin, emulator_pin=emulator_pin, report_ms=report_ms)
    console.unlink(missing_ok=True)
    try:
        conn.defineXML(xml)
    except libvirt.libvirtError as exc:
        raise GuestError(f"guest {name}: defining it on {conn.getURI()} failed: {exc}") from exc
    return GuestHandle(name, console, vcpus, memory_mib, workload)


def start(conn: libvirt.virConnect, guest: GuestHandle | str) -> libvirt.virDomain:
    name = guest if isinstance(guest, str) else guest.name
    try:
        dom = conn.lookupByName(name)
        dom.create()
    except libvirt.libvirtError as exc:
        raise GuestError(f"guest {name}: starting it on {conn.getURI()} failed: {exc}") from exc
    return dom


def destroy_and_undefine(conn: libvirt.virConnect, name: str) -> bool:
    """Stop and forget one guest; False if it was not there. Safe to call twice."""
    try:
        dom = conn.lookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return False
        raise  # a broken link or a busy daemon: the guest may still be there
    try:
        if dom.isActive():
            dom.destroy()
    except libvirt.libvirtError:
        if dom.isActive():
            raise
    try:
        if dom.isPersistent():
            dom.undefine()
    except libvirt.libvirtError:
        pass  # a transient domain vanishes with destroy
    return True


def cleanup_guests(conn: libvirt.virConnect, prefix: str = GUEST_PREFIX) -> list[str]:
    """Remove every guest whose name starts with `prefix` (running or only defined)."""
    removed = []
    for dom in conn.listAllDomains():
        if dom.name().startswith(prefix) and destroy_and_undefine(conn, dom.name()):
            removed.append(dom.name())
    return removed


def owned_name(label: str, pid: int | None = None) -> str:
    """`vmpt-<pid>-<label>`: the pid of the process that owns the guest, so a
    later run can tell a leftover of a dead run from a guest still in use."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-")[:40] or "guest"
    return f"{GUEST_PREFIX}{pid or os.getpid()}-{slug}"


def owner_pid(name: str) -> int | None:
    match = re.match(rf"{re.escape(GUEST_PREFIX)}(\d+)-", name)
    return int(match.group(1)) if match else None


def in_use_elsewhere(name: str) -> bool:
    """True for a testbed guest owned by another process that still runs."""
    pid = owner_pid(name)
    return pid is not None and pid != os.getpid() and Path(f"/proc/{pid}").exists()


def cleanup_orphans(conn: libvirt.virConnect) -> list[str]:
    """Remove testbed guests that no running process owns (leftovers of dead runs)."""
    removed = []
    for dom in conn.listAllDomains():
        name = dom.name()
        if name.startswith(GUEST_PREFIX) and not in_use_elsewhere(name) and destroy_and_undefine(conn, name):
            removed.append(name)
    return removed


def prune_consoles(dirs: StateDirs | None = None) -> list[Path]:
    """Delete console files of guests whose owning process no longer runs."""
    dirs = dirs or StateDirs.default()
    removed = []
    for console in sorted(dirs.consoles_dir.glob(f"{GUEST_PREFIX}*.log")):
        name = console.name.removesuffix(".log")
        pid = owner_pid(name)
        if pid is not None and pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            console.unlink(missing_ok=True)
            removed.append(console)
    return removed


# --- progress, read from the console file ---------------------------------------

def read_progress(console: Path) -> list[ProgressSample]:
    """The progress samples of the guest's latest boot, in order (empty if none yet)."""
    try:
        text = console.read_text(errors="replace")
    except FileNotFoundError:
        return []
    boot = text.rfind(BOOT_TAG)
    if boot >= 0:
        text = text[boot:]
    # The serial port delivers a line byte by byte: an unfinished last line could
    # parse with a truncated counter, so only lines that have their newline count.
    text = text[:text.rfind("\n") + 1]
    samples = []
    for line in text.splitlines():
        match = _PROGRESS_LINE.search(line)
        if match:
            samples.append(ProgressSample(int(match.group(1)), float(match.group(2)), int(match.group(3))))
    return samples


def wait_for_progress(console: Path, *, samples: int = 1, after_seq: int = -1,
                      timeout_s: float = 30.0, poll_s: float = 0.05) -> list[ProgressSample]:
    """Wait until the console shows `samples` progress lines with seq > `after_seq`."""
    deadline = time.monotonic() + timeout_s
    while True:
        fresh = [s for s in read_progress(console) if s.seq > after_seq]
        if len(fresh) >= samples:
            return fresh
        if time.monotonic() >= deadline:
            tail = console.read_text(errors="replace")[-1500:] if console.exists() else "(no console file)"
            raise GuestError(f"console {console}: {len(fresh)} of {samples} progress lines after "
                             f"{timeout_s:.0f} s; console tail:\n{tail}")
        time.sleep(poll_s)


def rate(first: ProgressSample, last: ProgressSample) -> float:
    """Work units per second of guest uptime between two samples."""
    elapsed = last.uptime_s - first.uptime_s
    if elapsed <= 0:
        raise GuestError(f"no guest time passed between progress samples {first.seq} and {last.seq}")
    return (last.units - first.units) / elapsed


def progress_rate(guest: GuestHandle | Path, seconds: float, *, timeout_s: float = 30.0) -> float:
    """The guest's work rate over the next `seconds`, from its console alone."""
    console = guest if isinstance(guest, Path) else guest.console
    first = wait_for_progress(console, timeout_s=timeout_s)[-1]
    time.sleep(seconds)
    last = wait_for_progress(console, after_seq=first.seq, timeout_s=timeout_s)[-1]
    return rate(first, last)
