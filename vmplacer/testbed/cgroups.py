"""A cgroup subtree of its own for host 2.

libvirt names a guest's cgroup `/machine/qemu-<id>-<name>.libvirt-qemu`, and
each daemon counts domain ids from 1. Two daemons sharing one cgroup tree can
therefore put the source and the destination of a migration in the same
cgroup (same name, same id), mixing their CPU accounting and pinning. Host 2
gets `vmplacer-host2/` in every cgroup v1 hierarchy, bind-mounted over the
hierarchy's root inside its mount namespace, so its guests live under
`<hierarchy>/vmplacer-host2/machine/...` as on a separate machine.

Only cgroup v1 hierarchies are split. On a machine with the unified (v2)
hierarchy alone both hosts share the tree: it works, with the overlap above.
Known limit: a host 2 libvirtd restarted while its guests run cannot find
their cgroups again (it reads their global path); the testbed removes its
guests before stopping a daemon.
"""

from __future__ import annotations

import shlex
from pathlib import Path

SUBTREE = "vmplacer-host2"


def v1_hierarchies() -> list[Path]:
    """Mount points of the cgroup v1 hierarchies that carry controllers."""
    try:
        subsystems = {line.split()[0] for line in Path("/proc/cgroups").read_text().splitlines()
                      if line and not line.startswith("#")}
    except OSError:
        return []
    mounts = []
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup" and subsystems & set(fields[3].split(",")):
            mounts.append(Path(fields[1]))
    return mounts


def prepare() -> list[Path]:
    """Create host 2's subtree in each v1 hierarchy; return the hierarchies."""
    hierarchies = v1_hierarchies()
    for hierarchy in hierarchies:
        subtree = hierarchy / SUBTREE
        subtree.mkdir(exist_ok=True)
        # A v1 cpuset group accepts no task until it has CPUs and memory nodes.
        for knob in ("cpuset.cpus", "cpuset.mems"):
            parent_knob, own_knob = hierarchy / knob, subtree / knob
            if parent_knob.exists() and not own_knob.read_text().strip():
                own_knob.write_text(parent_knob.read_text())
    return hierarchies


def mount_commands(hierarchies: list[Path]) -> list[str]:
    """Shell lines, run inside host 2's mount namespace, that make the subtree its root."""
    return [f"mount --bind {shlex.quote(str(h / SUBTREE))} {shlex.quote(str(h))}" for h in hierarchies]


def remove() -> list[Path]:
    """Remove host 2's (empty) subtrees after it stopped; return those still busy."""
    busy = []
    for hierarchy in v1_hierarchies():
        subtree = hierarchy / SUBTREE
        if not subtree.is_dir():
            continue
        for directory in sorted((p for p in subtree.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                directory.rmdir()
            except OSError:
                pass
        try:
            subtree.rmdir()
        except OSError:
            busy.append(subtree)
    return busy
