"""`vmplacer topology`: show a host's NUMA nodes, packages, dies, clusters, cores, threads and caches.

Reads a configured host through its hypervisor, a saved capabilities file, or
a sysfs tree, so an operator can check what the placer will see before it
places anything. `--format json` is the stable contract (`HostTopology.to_dict`,
docs/placement.md). What the reader could not read, and what it assumed
instead, is printed as warnings on stderr (and listed in the JSON).
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

from vmplacer.cli.common import (
    CliContext,
    OperationalError,
    UsageError,
    add_format_argument,
    add_host_selection,
    emit,
    resolve_host,
)
from vmplacer.core.cpuset import format_cpuset
from vmplacer.core.text import plural
from vmplacer.core.topology import Core, HostTopology


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "topology",
        help="show a host's NUMA nodes, cores, threads and caches",
        description="Show a host's topology as the placer sees it. Without an option: the first "
        "configured host.",
    )
    source = add_host_selection(parser, default="first", verb="read", repeatable=False,
                                all_hosts=False, default_note="through libvirt; --caps or --sysfs read a file instead")
    source.add_argument("--caps", metavar="FILE", help="a libvirt capabilities XML file")
    source.add_argument("--sysfs", metavar="ROOT", help="a directory holding sys/devices/system ('/' here)")
    add_format_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    topology = load_topology(args, ctx)
    emit(args, topology.to_dict(), lambda _data: render_tree(topology))
    for warning in topology.warnings:
        sys.stderr.write(f"vmplacer: warning: {warning}\n")
    return 0


def load_topology(args: argparse.Namespace, ctx: CliContext) -> HostTopology:
    if args.caps:
        return _from_caps(Path(args.caps))
    if args.sysfs:
        return _from_sysfs(Path(args.sysfs))
    return _from_host(ctx, args.host)


def _from_caps(path: Path) -> HostTopology:
    from vmplacer.adapters.capabilities import CapabilitiesError, read_capabilities_file

    if not path.is_file():
        raise UsageError(f"--caps {path}: no such file")
    try:
        return read_capabilities_file(path)
    except CapabilitiesError as exc:
        raise UsageError(f"--caps: {exc}") from None


def _from_sysfs(root: Path) -> HostTopology:
    from vmplacer.adapters.sysfs import SysfsError, read_sysfs

    if not root.is_dir():
        raise UsageError(f"--sysfs {root}: no such directory")
    name = platform.node() if root.resolve() == Path("/") else root.resolve().name
    try:
        return read_sysfs(root, name=name or "localhost")
    except SysfsError as exc:
        raise UsageError(f"--sysfs: {exc}") from None


def _from_host(ctx: CliContext, name: str | None) -> HostTopology:
    from vmplacer.adapters.capabilities import CapabilitiesError
    from vmplacer.ports import HypervisorError

    name = resolve_host(ctx, name, "--caps FILE or --sysfs ROOT")
    try:
        return ctx.container.hypervisor(name).topology()
    except HypervisorError as exc:
        raise OperationalError(str(exc)) from None
    except CapabilitiesError as exc:  # the host answered with capabilities we cannot use
        raise OperationalError(f"host {name}: {exc}") from None


# ----- the table form: a tree per node --------------------------------------------------

def render_tree(topology: HostTopology) -> None:
    from vmplacer.cli.common import console

    console().print(build_tree(topology))


def build_tree(topology: HostTopology):  # -> rich.tree.Tree
    """Host -> NUMA node -> (memory, hugepages) and LLC group -> core -> threads."""
    from rich.tree import Tree

    cpus = topology.cpus
    online = topology.online_cpus
    levels = [plural(len(topology.packages), "package")]
    if len(topology.dies) > len(topology.packages):
        levels.append(plural(len(topology.dies), "die"))
    if topology.clusters:
        levels.append(plural(len(topology.clusters), "cluster"))
    memory_only = topology.memory_only_nodes
    nodes = plural(len(topology.nodes), "NUMA node") + (f" ({len(memory_only)} memory only)" if memory_only else "")
    summary = (
        f"host {topology.name}: {', '.join(levels)}, {nodes}, "
        f"{plural(sum(1 for c in topology.cores if set(c.cpus) & online), 'core')}, {plural(len(cpus), 'pCPU')} "
        f"({len(online)} online), SMT-{topology.smt}"
    )
    tree = Tree(summary)
    for node in sorted(topology.nodes.values(), key=lambda n: n.id):
        distances = " ".join(f"{k}:{v}" for k, v in sorted(node.distances.items())) or "not reported"
        branch = tree.add(
            f"node {node.id}: memory {_size(node.memory_kib)}, free {_size(node.free_kib)}; "
            f"distances {distances}"
        )
        if node.hugepages:
            pools = ", ".join(
                f"{_size(p.size_kib)} x {p.total} ({p.free} free)" for p in node.hugepages
            )
            branch.add(f"hugepages: {pools}")
        cores = topology.cores_in_node(node.id)
        if not cores:
            branch.add("no CPUs (memory only): guest memory goes here only when a placement names the node")
            continue
        by_llc: dict[int | None, list[Core]] = {}
        for core in cores:
            by_llc.setdefault(cpus[core.cpus[0]].llc, []).append(core)
        for llc, members in sorted(by_llc.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            if llc is None:
                label = "no cache information (offline CPUs)"
            else:
                label = f"LLC {llc}: pCPUs {format_cpuset(topology.llc_groups[llc])}"
            llc_branch = branch.add(f"{label} — {plural(len(members), 'core')}")
            for core in members:
                llc_branch.add(_core_line(topology, core))
    return tree


def _core_line(topology: HostTopology, core: Core) -> str:
    first = topology.cpus[core.cpus[0]]
    threads = []
    for cpu_id in core.cpus:
        cpu = topology.cpus[cpu_id]
        marks = [
            mark
            for mark, present in (
                ("offline", not cpu.online),
                ("isolated", cpu_id in topology.isolated),
                ("reserved", cpu_id in topology.reserved),
            )
            if present
        ]
        threads.append(f"{cpu_id}" + (f" ({', '.join(marks)})" if marks else ""))
    parts = [f"core {core.id} (package {core.package}"]
    if len(topology.dies) > len(topology.packages):
        parts.append(f", die {core.die}")
    if core.cluster is not None:
        parts.append(f", cluster {core.cluster}")
    if first.kind:
        parts.append(f", {first.kind}")
    if first.l2 is not None:
        sharing = [c for c in topology.cores if topology.cpus[c.cpus[0]].l2 == first.l2]
        if len(sharing) > 1:
            others = [str(c.id) for c in sharing if c.id != core.id]
            parts.append(f", L2 {first.l2} shared with {'core' if len(others) == 1 else 'cores'} " + ",".join(others))
    parts.append("): " + ", ".join(threads))
    return "".join(parts)


def _size(kib: int) -> str:
    for unit, factor in (("TiB", 1024**3), ("GiB", 1024**2), ("MiB", 1024)):
        if kib >= factor:
            value = kib / factor
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{kib} KiB"
