"""Build (once) the tiny guest the testbed boots: a Debian kernel + a busybox initramfs.

The kernel comes from the Debian package that `linux-image-amd64` depends on
(`apt-get download`, then `/boot/vmlinuz-*` out of its data tarball); the
initramfs is busybox-static plus the /init of `guest_init`, packed with
`cpio -o -H newc` (uncompressed: decompressing under TCG costs boot time).

The bzImage is then decompressed once into an ELF vmlinux that QEMU boots
through its PVH entry (see `kernel`): guests start twice as fast under TCG.

The result is cached in the image directory with a manifest holding a hash of
the inputs (init script, kernel package, busybox binary, layout version); it is
rebuilt only when that hash changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vmplacer.testbed.guest_init import INIT_SCRIPT
from vmplacer.testbed.kernel import pvh_vmlinux
from vmplacer.testbed.paths import StateDirs

KERNEL_META_PACKAGE = "linux-image-amd64"
BUSYBOX = Path("/bin/busybox")
# Bump when the initramfs layout changes in a way the other inputs do not show.
LAYOUT_VERSION = "2"
MANIFEST = "manifest.json"
BZIMAGE_FILE = "vmlinuz"  # the kernel as Debian ships it
PVH_KERNEL_FILE = "vmlinux"  # the same, decompressed: what guests boot when it has a PVH entry
INITRD_FILE = "initrd.img"


class ImageError(RuntimeError):
    """The guest image could not be built; the message says which step and why."""


@dataclass(frozen=True)
class GuestImage:
    kernel: Path
    initrd: Path
    kernel_package: str
    inputs_hash: str
    built: bool  # False when the cached image was reused
    seconds: float


def _run(cmd: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True, **kwargs)
    except FileNotFoundError as exc:
        raise ImageError(f"{what}: {cmd[0]} is not installed") from exc
    except subprocess.CalledProcessError as exc:
        raise ImageError(f"{what}: `{' '.join(cmd)}` failed: {exc.stderr.strip()[-2000:]}") from exc


def kernel_package_name() -> str:
    """The versioned kernel package the meta package currently depends on."""
    out = _run(["apt-cache", "depends", KERNEL_META_PACKAGE], "finding the guest kernel").stdout
    match = re.search(r"Depends:\s*(linux-image-\d\S*-amd64)\b", out)
    if not match:
        raise ImageError(
            f"finding the guest kernel: `apt-cache depends {KERNEL_META_PACKAGE}` names no "
            f"linux-image-*-amd64 package (run `apt-get update` first?); output: {out.strip()[:500]}"
        )
    return match.group(1)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def inputs_hash(kernel_package: str) -> str:
    if not BUSYBOX.exists():
        raise ImageError(f"building the initramfs: {BUSYBOX} is missing (install busybox-static)")
    digest = hashlib.sha256()
    for part in (LAYOUT_VERSION, kernel_package, _sha256_file(BUSYBOX), INIT_SCRIPT):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """One builder at a time (two test sessions may ask for the image together)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_manifest(image_dir: Path) -> dict:
    try:
        return json.loads((image_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def _extract_kernel(kernel_package: str, dest: Path, workdir: Path) -> None:
    _run(["apt-get", "download", kernel_package], f"downloading {kernel_package}", cwd=workdir)
    debs = sorted(workdir.glob(f"{kernel_package}_*.deb"))
    if not debs:
        raise ImageError(f"downloading {kernel_package}: apt-get download produced no .deb in {workdir}")
    # Reading stops at the kernel; dpkg-deb then dies of a broken pipe, which is fine.
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(debs[-1])], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    found = False
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
            for member in archive:
                if member.isfile() and re.fullmatch(r"\./boot/vmlinuz-.*", member.name):
                    source = archive.extractfile(member)
                    assert source is not None
                    with dest.open("wb") as out:
                        shutil.copyfileobj(source, out)
                    found = True
                    break
    finally:
        proc.stdout.close()  # type: ignore[union-attr]
        proc.wait()
    if not found:
        raise ImageError(f"extracting the kernel: {debs[-1].name} has no ./boot/vmlinuz-*")


def _build_initramfs(dest: Path, workdir: Path) -> None:
    tree = workdir / "initramfs"
    bindir = tree / "bin"
    bindir.mkdir(parents=True)
    for name in ("proc", "sys", "dev", "tmp"):
        (tree / name).mkdir()
    shutil.copyfile(BUSYBOX, bindir / "busybox")
    (bindir / "busybox").chmod(0o755)
    applets = _run([str(BUSYBOX), "--list"], "listing busybox applets").stdout.split()
    for applet in applets:
        if applet != "busybox":
            (bindir / applet).symlink_to("busybox")
    (tree / "init").write_text(INIT_SCRIPT)
    (tree / "init").chmod(0o755)
    names = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
    listing = "".join(f"./{name}\n" for name in names)
    with dest.open("wb") as out:
        try:
            subprocess.run(["cpio", "-o", "-H", "newc", "-R", "0:0", "--quiet"], input=listing.encode(),
                           stdout=out, stderr=subprocess.PIPE, cwd=tree, check=True)
        except FileNotFoundError as exc:
            raise ImageError("building the initramfs: cpio is not installed") from exc
        except subprocess.CalledProcessError as exc:
            raise ImageError(f"building the initramfs: cpio failed: {exc.stderr.decode().strip()}") from exc


def _cached(image_dir: Path, manifest: dict, wanted: str) -> tuple[Path, Path] | None:
    if manifest.get("inputs_hash") != wanted:
        return None
    kernel, initrd = image_dir / manifest.get("kernel", BZIMAGE_FILE), image_dir / INITRD_FILE
    return (kernel, initrd) if kernel.exists() and initrd.exists() else None


def build_image(dirs: StateDirs | None = None, *, force: bool = False) -> GuestImage:
    """Return the guest image, building it only when its inputs changed (or `force`)."""
    dirs = dirs or StateDirs.default()
    image_dir = dirs.image_dir
    started = time.monotonic()
    with _locked(image_dir / ".build.lock"):
        manifest = _read_manifest(image_dir)
        bzimage_path = image_dir / BZIMAGE_FILE
        try:
            package = kernel_package_name()
        except ImageError:
            # No apt lists (offline, cleaned cache): a cached image is still good.
            if not force and manifest.get("kernel_package"):
                package = manifest["kernel_package"]
            else:
                raise
        wanted = inputs_hash(package)
        cached = None if force else _cached(image_dir, manifest, wanted)
        if cached:
            return GuestImage(*cached, package, wanted, False, time.monotonic() - started)

        image_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=image_dir, prefix=".build-") as tmp:
            workdir = Path(tmp)
            os.chmod(workdir, 0o755)  # apt-get download may drop to the _apt user
            new_bzimage, new_initrd = workdir / BZIMAGE_FILE, workdir / INITRD_FILE
            if manifest.get("kernel_package") == package and bzimage_path.exists() and not force:
                # copyfile, not copy2: the old file may carry libvirt's ownership
                # bookkeeping (trusted.libvirt.security.* xattrs) of running guests.
                shutil.copyfile(bzimage_path, new_bzimage)
            else:
                _extract_kernel(package, new_bzimage, workdir)
            vmlinux = pvh_vmlinux(new_bzimage.read_bytes())
            kernel_name = BZIMAGE_FILE
            if vmlinux is not None:
                kernel_name = PVH_KERNEL_FILE
                (workdir / PVH_KERNEL_FILE).write_bytes(vmlinux)
            _build_initramfs(new_initrd, workdir)
            for name in {BZIMAGE_FILE, kernel_name, INITRD_FILE}:
                (workdir / name).chmod(0o644)  # QEMU runs as an unprivileged user
                os.replace(workdir / name, image_dir / name)
        image_dir.chmod(0o755)
        dirs.root.chmod(0o755)
        (image_dir / MANIFEST).write_text(json.dumps(
            {"inputs_hash": wanted, "kernel_package": package, "kernel": kernel_name,
             "built_at": time.time()}, indent=2))
        return GuestImage(image_dir / kernel_name, image_dir / INITRD_FILE, package, wanted, True,
                          time.monotonic() - started)
