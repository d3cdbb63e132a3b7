"""Where the testbed keeps its state.

Everything lives under one directory OUTSIDE the libvirt directories: host 2
bind-mounts private copies over /run/libvirt, /var/lib/libvirt, /etc/libvirt,
/var/log/libvirt and /var/cache/libvirt in its mount namespace, so a file under
those would look different to each host. Images and guest consoles kept here
are the same file for both hosts' QEMU processes and for the tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path("/var/lib/vmplacer-testbed")
ROOT_ENV = "VMPLACER_TESTBED_DIR"

# Directories host 2 replaces with private copies (see module docstring).
HOST2_PRIVATE_DIRS: dict[str, Path] = {
    "run": Path("/run/libvirt"),
    "lib": Path("/var/lib/libvirt"),
    "etc": Path("/etc/libvirt"),
    "log": Path("/var/log/libvirt"),
    "cache": Path("/var/cache/libvirt"),
}


@dataclass(frozen=True)
class StateDirs:
    root: Path

    @classmethod
    def default(cls) -> StateDirs:
        root = Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT).resolve()
        for hidden in HOST2_PRIVATE_DIRS.values():
            if root == hidden or hidden in root.parents:
                raise ValueError(
                    f"testbed directory {root} ({ROOT_ENV}) must not be inside {hidden}: "
                    "host 2 mounts a private copy over it, so the hosts would see different files"
                )
        return cls(root)

    @property
    def image_dir(self) -> Path:
        return self.root / "image"

    @property
    def consoles_dir(self) -> Path:
        return self.root / "consoles"

    @property
    def host1_dir(self) -> Path:
        return self.root / "host1"

    @property
    def host2_dir(self) -> Path:
        return self.root / "host2"

    @property
    def started_file(self) -> Path:
        """Daemons this testbed started (only these are ever stopped)."""
        return self.root / "started.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"
