"""A real two-host libvirt testbed on one machine, for integration tests, benchmarks and the demo.

- `daemons`: host1 = the machine's libvirtd (qemu:///system); host2 = a second
  libvirtd in its own mount namespace (qemu+tcp://127.0.0.1:16510/system).
- `image`: a tiny TCG guest (Debian kernel + busybox initramfs), built once and cached.
- `guests`: define/start/remove guests and read their progress counters from
  the serial console, independently of vmplacer.

Run `python -m vmplacer.testbed up|down|image|status|clean`.
"""

from vmplacer.testbed.daemons import HOST1_URI, HOST2_URI, MIGRATE_URI, TestbedError, down, status, up
from vmplacer.testbed.guests import (
    GUEST_PREFIX,
    GuestError,
    GuestHandle,
    ProgressSample,
    cleanup_guests,
    define_guest,
    destroy_and_undefine,
    progress_rate,
    read_progress,
    start,
    wait_for_progress,
)
from vmplacer.testbed.image import GuestImage, ImageError, build_image
from vmplacer.testbed.paths import StateDirs

__all__ = [
    "GUEST_PREFIX", "HOST1_URI", "HOST2_URI", "MIGRATE_URI", "GuestError", "GuestHandle", "GuestImage",
    "ImageError", "ProgressSample", "StateDirs", "TestbedError", "build_image", "cleanup_guests",
    "define_guest", "destroy_and_undefine", "down", "progress_rate", "read_progress", "start", "status",
    "up", "wait_for_progress",
]
