"""The testbed's pure parts: guest XML, progress parsing, config rewriting, image inputs."""

from __future__ import annotations

import lzma
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from lxml import etree

from tests.support import require
from vmplacer.testbed import daemons, guest_init, image, kernel
from vmplacer.testbed.guests import (
    GuestError,
    ProgressSample,
    domain_xml,
    in_use_elsewhere,
    owned_name,
    prune_consoles,
    rate,
    read_progress,
)
from vmplacer.testbed.image import GuestImage
from vmplacer.testbed.paths import ROOT_ENV, StateDirs

DOMAIN_RNG = Path("/usr/share/libvirt/schemas/domain.rng")
IMAGE = GuestImage(Path("/tb/image/vmlinuz"), Path("/tb/image/initrd.img"), "linux-image-x", "h", False, 0.0)
CONSOLE = Path("/tb/consoles/vmpt-1-a.log")


def xml_of(**kwargs) -> etree._Element:
    return etree.fromstring(domain_xml("vmpt-1-a", IMAGE, CONSOLE, **kwargs))


def test_domain_xml_is_a_tcg_guest_with_an_appending_file_console():
    dom = xml_of(vcpus=2, memory_mib=128, workload="mem", report_ms=200)
    assert dom.get("type") == "qemu"
    assert dom.findtext("vcpu") == "2"
    assert dom.find("memory").get("unit") == "MiB" and dom.findtext("memory") == "128"
    assert dom.findtext("os/kernel") == str(IMAGE.kernel)
    assert dom.findtext("os/initrd") == str(IMAGE.initrd)
    cmdline = dom.findtext("os/cmdline").split()
    assert "console=ttyS0" in cmdline
    assert "vmplacer.workload=mem" in cmdline and "vmplacer.report_ms=200" in cmdline
    source = dom.find("devices/serial[@type='file']/source")
    assert source.get("path") == str(CONSOLE) and source.get("append") == "on"
    assert dom.find("devices/disk") is None and dom.find("devices/interface") is None
    assert dom.find("cputune") is None


def test_domain_xml_pins_every_vcpu_or_each_one():
    same = xml_of(vcpus=2, pin=1, emulator_pin="0")
    assert [(p.get("vcpu"), p.get("cpuset")) for p in same.iterfind("cputune/vcpupin")] == [("0", "1"), ("1", "1")]
    assert same.find("cputune/emulatorpin").get("cpuset") == "0"
    each = xml_of(vcpus=2, pin={1: "0-1", 0: 0})
    assert [(p.get("vcpu"), p.get("cpuset")) for p in each.iterfind("cputune/vcpupin")] == [("0", "0"), ("1", "0-1")]


@pytest.mark.parametrize("kwargs", [{}, {"vcpus": 2, "pin": {0: 1, 1: "0"}, "emulator_pin": 0}])
def test_domain_xml_passes_libvirts_schema(kwargs):
    require(DOMAIN_RNG.exists(), f"{DOMAIN_RNG} missing (libvirt-daemon-system not installed)")
    schema = etree.RelaxNG(etree.parse(str(DOMAIN_RNG)))
    dom = xml_of(**kwargs)
    assert schema.validate(dom), schema.error_log


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"workload": "disk"}, "workload='disk'"),
    ({"vcpus": 0}, "vcpus=0"),
    ({"memory_mib": 32}, "memory_mib=32"),
    ({"pin": "one"}, "pin='one'"),
    ({"vcpus": 1, "pin": {1: 0}}, "vCPU 1"),
    ({"emulator_pin": "0-"}, "emulator_pin='0-'"),
    ({"report_ms": 10}, "report_ms=10"),
])
def test_bad_guest_arguments_name_the_guest_and_the_field(kwargs, field):
    with pytest.raises(GuestError) as error:
        domain_xml("vmpt-1-a", IMAGE, CONSOLE, **kwargs)
    assert "vmpt-1-a" in str(error.value) and field in str(error.value)


def test_guest_names_need_the_testbed_prefix():
    with pytest.raises(GuestError, match="must start with 'vmpt-'"):
        domain_xml("web1", IMAGE, CONSOLE)


def test_owned_name_carries_the_owner_pid_and_a_safe_label():
    assert owned_name("test_x[param 1]", pid=42) == "vmpt-42-test_x-param-1"
    assert owned_name("a").startswith(f"vmpt-{os.getpid()}-")


def test_a_guest_is_in_use_elsewhere_only_while_another_live_process_owns_it():
    assert in_use_elsewhere(owned_name("x", pid=1))  # pid 1 always runs
    assert not in_use_elsewhere(owned_name("x"))  # our own
    assert not in_use_elsewhere("vmpt-legacy")  # no owner recorded
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert not in_use_elsewhere(owned_name("x", pid=dead.pid))


def test_read_progress_keeps_the_latest_boot_and_skips_noise(tmp_path):
    console = tmp_path / "c.log"
    console.write_text(
        "VMPLACER-BOOT workload=spin cpus=1 report_ms=250\n"
        "VMPLACER-PROGRESS 0 1.00 0\n"
        "VMPLACER-PROGRESS 1 1.25 900\n"
        "[    2.1] some kernel message\n"
        "VMPLACER-BOOT workload=spin cpus=1 report_ms=250\n"  # the guest was restarted
        "VMPLACER-PROGRESS 0 1.50 0\n"
        "VMPLACER-PROGRESS 1 1.75 1000\n"
        "VMPLACER-PROGRESS 2 2.00 10"  # still being written: its counter is cut short
    )
    assert read_progress(console) == [ProgressSample(0, 1.5, 0), ProgressSample(1, 1.75, 1000)]
    assert read_progress(tmp_path / "missing.log") == []


def test_rate_is_units_per_guest_second():
    assert rate(ProgressSample(3, 2.0, 1000), ProgressSample(7, 3.0, 5000)) == 4000
    with pytest.raises(GuestError, match="no guest time passed"):
        rate(ProgressSample(3, 2.0, 1000), ProgressSample(3, 2.0, 1000))


def test_init_script_is_valid_shell_and_reports_the_documented_line():
    checked = subprocess.run(["sh", "-n"], input=guest_init.INIT_SCRIPT, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    assert f'echo "{guest_init.PROGRESS_TAG} $seq $up $total"' in guest_init.INIT_SCRIPT


def test_override_conf_replaces_settings_and_keeps_the_rest(tmp_path):
    source = tmp_path / "in.conf"
    source.write_text('# listen_tcp = 1\nlisten_tcp = 0\nmax_clients = 5000\ntcp_port = "16509"\n')
    target = tmp_path / "out.conf"
    daemons._override_conf(source, target, {"listen_tcp": "1", "tcp_port": '"16510"'})
    lines = target.read_text().splitlines()
    assert "# listen_tcp = 1" in lines and "max_clients = 5000" in lines
    assert "listen_tcp = 0" not in lines and 'tcp_port = "16509"' not in lines
    assert lines[-2:] == ["listen_tcp = 1", 'tcp_port = "16510"']


def test_process_alive_checks_the_program_name():
    own = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    assert daemons.process_alive(os.getpid(), own)
    assert not daemons.process_alive(os.getpid(), own + "-other")
    assert not daemons.process_alive(None, own)


def test_state_dir_must_stay_outside_host2s_private_dirs(monkeypatch):
    monkeypatch.setenv(ROOT_ENV, "/var/lib/libvirt/testbed")
    with pytest.raises(ValueError, match="must not be inside /var/lib/libvirt"):
        StateDirs.default()
    monkeypatch.setenv(ROOT_ENV, "/srv/tb")
    assert StateDirs.default().consoles_dir == Path("/srv/tb/consoles")


def test_image_inputs_hash_follows_the_kernel_and_the_init_script(monkeypatch):
    require(image.BUSYBOX.exists(), "busybox-static is not installed")
    first = image.inputs_hash("linux-image-6.1.0-1-amd64")
    assert image.inputs_hash("linux-image-6.1.0-1-amd64") == first
    assert image.inputs_hash("linux-image-6.1.0-2-amd64") != first
    monkeypatch.setattr(image, "INIT_SCRIPT", guest_init.INIT_SCRIPT + "\n# changed\n")
    assert image.inputs_hash("linux-image-6.1.0-1-amd64") != first


def test_initramfs_holds_busybox_its_applets_and_the_init(tmp_path):
    require(image.BUSYBOX.exists() and shutil.which("cpio") is not None, "busybox-static and cpio are needed")
    archive = tmp_path / "initrd.img"
    image._build_initramfs(archive, tmp_path)
    listing = subprocess.run(["cpio", "-it", "--quiet"], stdin=archive.open("rb"), capture_output=True,
                             text=True, check=True).stdout.split()
    for entry in ("init", "bin/busybox", "bin/sh", "bin/awk", "bin/dd", "proc", "dev", "tmp"):
        assert entry in listing


def _elf_with_note(name: bytes, note_type: int) -> bytes:
    """A minimal ELF64 image with one PT_NOTE segment holding one note."""
    padded = name + b"\0" * (-len(name) % 4)
    note = struct.pack("<III", len(name), 4, note_type) + padded + b"\0\0\0\0"
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x20, 64)  # program headers right after the ELF header
    struct.pack_into("<HH", header, 0x36, 56, 1)
    phdr = struct.pack("<IIQQQQQQ", 4, 0, 64 + 56, 0, 0, len(note), len(note), 4)
    return bytes(header) + phdr + note


def test_pvh_entry_is_found_in_the_kernels_notes():
    assert kernel.has_pvh_entry(_elf_with_note(b"Xen\0", 18))
    assert not kernel.has_pvh_entry(_elf_with_note(b"Xen\0", 5))
    assert not kernel.has_pvh_entry(_elf_with_note(b"GNU\0", 18))
    assert not kernel.has_pvh_entry(b"MZ not an elf" * 8)


def test_pvh_vmlinux_unpacks_an_xz_payload_and_refuses_others():
    elf = _elf_with_note(b"Xen\0", 18)
    bzimage = b"\x00setup code\x00" * 10 + lzma.compress(elf, format=lzma.FORMAT_XZ) + b"\x12\x34\x56\x78"
    assert kernel.pvh_vmlinux(bzimage) == elf
    without_pvh = b"setup" + lzma.compress(_elf_with_note(b"Xen\0", 5), format=lzma.FORMAT_XZ)
    assert kernel.pvh_vmlinux(without_pvh) is None
    assert kernel.pvh_vmlinux(b"no payload here") is None


def test_prune_consoles_deletes_only_files_of_exited_owners(tmp_path):
    dirs = StateDirs(tmp_path)
    dirs.consoles_dir.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone, ours, others, legacy = (dirs.consoles_dir / f"{name}.log" for name in (
        owned_name("x", pid=dead.pid), owned_name("y"), owned_name("z", pid=1), "vmpt-legacy"))
    for path in (gone, ours, others, legacy):
        path.write_text("VMPLACER-BOOT\n")
    assert prune_consoles(dirs) == [gone]
    assert not gone.exists() and ours.exists() and others.exists() and legacy.exists()
