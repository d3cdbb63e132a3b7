"""`vmplacer serve` on libvirt's test driver with room for guests (run by benchmarks/api.py).

    python benchmarks/api_server.py CONFIG [serve arguments...]

The test driver's state lives in the process that opened it, and its built-in
guest ("test") holds all of its NUMA memory, so every placement there would be
a NoFit. This takes that guest off in the serving process itself, then runs
exactly what `vmplacer serve` runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEST_URI = "test:///default"


def free_test_driver() -> None:
    import libvirt

    conn = libvirt.open(TEST_URI)  # the process's one test:///default state, shared by every connection
    try:
        builtin = conn.lookupByName("test")
        if builtin.isActive():
            builtin.destroy()
        builtin.undefine()
    except libvirt.libvirtError:
        pass  # taken off already
    # keep `conn` open: the driver's state lives while a connection does
    globals()["_keep"] = conn


def main(argv: list[str]) -> int:
    from vmplacer.cli.main import main as vmplacer

    free_test_driver()
    return vmplacer(["--config", argv[0], "serve", *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
