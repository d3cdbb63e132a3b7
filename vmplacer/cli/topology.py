"""`vmplacer topology`: show a host's NUMA nodes, packages, dies, clusters, cores, threads and caches.

The default is compact, one line per NUMA node (pCPUs, cores x threads, last-level caches and
their sizes, memory, hugepages) with the node distances below, as `numactl -H` and
`lstopo-no-graphics --no-io` give it; `--cores` prints the tree down to every core and thread.
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
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from vmplacer.cli.common import (
    CliContext,
    OperationalError,
    UsageError,
    add_format_argument,
    add_host_selection,
    emit,
    resolve_host,
    structured,
)
from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.text import plural
from vmplacer.core.topology.host import Core, HostTopology

if TYPE_CHECKING:
    from rich.tree import Tree


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "topology",
        help="show a host's NUMA nodes, cores, threads and caches",
        description="Show a host's topology as the placer sees it: one line per NUMA node (pCPUs, "
        "cores x threads, last-level caches and sizes, memory, hugepages), or with --cores every core "
        "and thread. Without an option: the first configured host.",
    )
    source = add_host_selection(parser, default="first", verb="read", repeatable=False,
                                all_hosts=False, default_note="through libvirt; --caps or --sysfs read a file instead")
    source.add_argument("--caps", metavar="FILE", help="a libvirt capabilities XML file")
    source.add_argument("--sysfs", metavar="ROOT", help="a directory holding sys/devices/system ('/' here)")
    parser.add_argument("--cores", action="store_true",
                        help="show every core and its threads, grouped by node and last-level cache "
                             "(table format only; the JSON always lists them)")
    add_format_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.cores and structured(args):
        raise UsageError(f"--cores: applies to the table format; the {args.format.upper()} always lists every core")
    topology = load_topology(args, ctx)
    emit(args, topology.to_dict(), lambda _data: render_tree(topology) if args.cores else render_nodes(topology))
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


# ----- the compact form: one line per node ---------------------------------------------

NODE_COLUMNS = ("node", "pCPUs", "cores", "LLC", "memory", "free", "hugepages")


def render_nodes(topology: HostTopology) -> None:
    """The summary, a table of nodes, caches, distances: on a terminal as wide as it is; in a
    pipe or file plain aligned text without box drawing, $COLUMNS wide or else 80. Lines wrap;
    a table too wide for the width wraps in its columns or becomes one block per node."""
    from rich import box
    from rich.table import Table

    from vmplacer.cli.common import console, render_table

    out = console()
    rows = node_rows(topology)
    summary = summary_line(topology)
    width = out.width if out.is_terminal else plain_width()
    natural = sum(max(len(text) for text in column) for column in zip(NODE_COLUMNS, *rows))
    if out.is_terminal and natural + 2 * len(NODE_COLUMNS) <= width:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1))
        for column, justify in zip(NODE_COLUMNS, ("right", "left", "right", "left", "right", "right", "left")):
            table.add_column(column, justify=justify, overflow="fold")
        for row in rows:
            table.add_row(*row)
        out.print(summary)
        out.print(table)
        for line in footer_lines(topology, width):
            out.print(line)
        return
    lines = [*_wrapped(summary, width),
             *render_table(None, NODE_COLUMNS, rows, width=width, boxed=False).splitlines()]
    for line in footer_lines(topology, width):
        lines.extend(_wrapped(line, width))
    sys.stdout.write("".join(line.rstrip() + "\n" for line in lines))


PLAIN_WIDTH = 80  # written to a pipe or file without $COLUMNS: what a log, a mail or a ticket shows
MIN_PLAIN_WIDTH = 20  # a narrower $COLUMNS is taken as this: nothing would read below it


def plain_width() -> int:
    """The width of the plain form: $COLUMNS when set (`COLUMNS=120 vmplacer topology | less`),
    else PLAIN_WIDTH; never below MIN_PLAIN_WIDTH, where nothing would read."""
    from vmplacer.cli.common import fit_width

    return max(fit_width() or PLAIN_WIDTH, MIN_PLAIN_WIDTH)


def _wrapped(line: str, width: int) -> list[str]:
    return textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False) or [""]


def summary_line(topology: HostTopology) -> str:
    """'host NAME: 2 packages, 2 nodes, 56 cores, 112 pCPUs, SMT-2' (offline pCPUs counted when any)."""
    online = topology.online_cpus
    levels = [plural(len(topology.packages), "package")]
    if len(topology.dies) > len(topology.packages):
        levels.append(plural(len(topology.dies), "die"))
    if topology.clusters:
        levels.append(plural(len(topology.clusters), "cluster"))
    memory_only = topology.memory_only_nodes
    nodes = plural(len(topology.nodes), "node") + (f" ({len(memory_only)} memory only)" if memory_only else "")
    cores = sum(1 for c in topology.cores if set(c.cpus) & online)
    offline = len(topology.cpus) - len(online)
    return (f"host {topology.name}: {', '.join(levels)}, {nodes}, {plural(cores, 'core')}, "
            f"{plural(len(topology.cpus), 'pCPU')}{f' ({offline} offline)' if offline else ''}, "
            f"SMT-{topology.smt}")


def node_rows(topology: HostTopology) -> list[tuple[str, ...]]:
    """One row per node: id, pCPUs, cores x threads, LLCs, memory, free memory, hugepages."""
    rows = []
    for node in sorted(topology.nodes.values(), key=lambda n: n.id):
        cpus = topology.cpus_in_node(node.id)
        cores = [c for c in topology.cores_in_node(node.id) if set(c.cpus) & topology.online_cpus]
        rows.append((
            str(node.id),
            format_cpuset(cpus) if cpus else "-",
            _cores_by_threads(topology, cores) if cores else "-",
            _node_llcs(topology, cpus) if cores else "-",
            _size(node.memory_kib),
            _size(node.free_kib),
            _hugepages(node.hugepages),
        ))
    return rows


def _cores_by_threads(topology: HostTopology, cores: list[Core]) -> str:
    """'28x2' (28 cores of 2 online threads); hybrid hosts: '8x2+8x1'."""
    online = topology.online_cpus
    counts: dict[int, int] = {}
    for core in cores:
        threads = len(set(core.cpus) & online)
        counts[threads] = counts.get(threads, 0) + 1
    return "+".join(f"{n}x{threads}" for threads, n in sorted(counts.items(), reverse=True))


def _node_llcs(topology: HostTopology, cpus: frozenset[int]) -> str:
    """The node's last-level caches: 'L3 38.5 MiB', '4x L3 32 MiB'; '?' marks a size not reported."""
    groups = sorted({topology.cpus[c].llc for c in cpus if topology.cpus[c].llc is not None})
    if not groups:
        return "-"
    level = f"L{topology.llc_level}" if topology.llc_level else "LLC"
    sizes = [topology.llc_kib.get(g) for g in groups]
    parts = []
    for size in dict.fromkeys(sizes):
        n = sizes.count(size)
        parts.append(f"{f'{n}x ' if n > 1 else ''}{level} {_cache_size(size) if size is not None else '?'}")
    return ", ".join(parts)


def _hugepages(pools) -> str:
    """'8192x2M, 32x1G' (empty pools left out); free pages follow in brackets where some are taken."""
    shown = [p for p in pools if p.total]
    if not shown:
        return "-"
    return ", ".join(f"{p.total}x{_short_size(p.size_kib)}" + (f" ({p.free} free)" if p.free != p.total else "")
                     for p in shown)


def footer_lines(topology: HostTopology, width: int | None = None) -> list[str]:
    """Cache sizes, the pCPUs that are offline, isolated or reserved, and the node distances."""
    lines = [_cache_line(topology)]
    for what, cpus in (("offline", set(topology.cpus) - topology.online_cpus),
                       ("isolated", topology.isolated), ("reserved", topology.reserved)):
        if cpus:
            lines.append(f"{what} pCPUs: {format_cpuset(cpus)}")
    if topology.memory_only_nodes:
        lines.append("memory-only nodes get guest memory only when a placement names them")
    if len(topology.nodes) > 1:
        lines.extend(distance_lines(topology, width))
    return lines


def _cache_line(topology: HostTopology) -> str:
    """'caches: L3 38.5 MiB per 28 cores; L2 per core (size not reported)'."""
    if topology.llc_level is None:
        return "caches: not reported; one last-level cache per die and one L2 per core assumed"
    parts = []
    for level, groups, sizes in ((topology.llc_level, topology.llc_groups, topology.llc_kib),
                                 (2, topology.l2_groups, topology.l2_kib)):
        if level == 2 and topology.llc_level == 2:
            continue
        described = dict.fromkeys((sizes.get(group), len({topology.cpus[c].core for c in members}))
                                  for group, members in groups.items())
        for size, cores in described:
            said = f"L{level}" + (f" {_cache_size(size)}" if size is not None else "")
            said += " per core" if cores == 1 else f" per {cores} cores"
            parts.append(said + ("" if size is not None else " (size not reported)"))
    return "caches: " + "; ".join(parts)


def distance_lines(topology: HostTopology, width: int | None = None) -> list[str]:
    """The node distance matrix, as `numactl -H` prints it; wider than `width`, in blocks of
    as many columns as fit, each with its own header row."""
    ids = sorted(topology.nodes)
    cell = max(3, *(len(str(i)) for i in ids))
    label = max(3, *(len(str(i)) for i in ids))
    per_block = len(ids) if width is None else max(1, (width - label - 2) // (cell + 1))
    lines = ["node distances:"]
    for start in range(0, len(ids), per_block):
        shown = ids[start:start + per_block]
        lines.append("node".ljust(label + 1) + " " + " ".join(f"{i:>{cell}}" for i in shown))
        for a in ids:
            lines.append(f"{a:>{label}}: " + " ".join(f"{topology.distance(a, b):>{cell}}" for b in shown))
    return lines


def _short_size(kib: int) -> str:
    """'2M', '1G', '64K': the hugepage sizes as the kernel names their pools."""
    for unit, factor in (("G", 1024**2), ("M", 1024)):
        if kib >= factor and kib % factor == 0:
            return f"{kib // factor}{unit}"
    return f"{kib}K"


# ----- the --cores form: a tree per node --------------------------------------------------

def render_tree(topology: HostTopology) -> None:
    from vmplacer.cli.common import console

    out = console()
    if out.is_terminal:
        out.print(build_tree(topology))
        return
    sys.stdout.write(plain_tree(build_tree(topology), width=plain_width()))


def plain_tree(tree: Tree, depth: int = 0, *, width: int = PLAIN_WIDTH) -> str:
    """A pipe or a file gets the tree as indented ASCII lines (two spaces a level, no guide
    lines, wrapped at `width` as the compact form): what grep, awk and a log read. A level
    too deep for the width is indented no further, so every line keeps room for its words."""
    indent = "  " * min(depth, max((width - MIN_PLAIN_WIDTH) // 2, 0))
    text = "".join(f"{line}\n" for line in textwrap.wrap(str(tree.label), width, initial_indent=indent,
                                                          subsequent_indent=indent + "    ",
                                                          break_on_hyphens=False))
    return text + "".join(plain_tree(child, depth + 1, width=width) for child in tree.children)


def build_tree(topology: HostTopology) -> Tree:
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
            llc_branch = branch.add(f"{label}, {plural(len(members), 'core')}")
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


def _cache_size(kib: int) -> str:
    """'38.5 MiB', '1280 KiB': a cache size said exactly (1.25 MiB is not '1.2 MiB')."""
    for unit, factor in (("GiB", 1024**2), ("MiB", 1024)):
        if kib >= factor and (kib * 10) % factor == 0:
            return f"{kib / factor:g} {unit}"
    return f"{kib} KiB"
