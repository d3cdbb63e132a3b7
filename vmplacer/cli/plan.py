"""`vmplacer plan`: where the guests of a request file would go — a dry run, nothing changes.

The candidate hosts are the first configured one (default), those named with
`--host` (repeatable), every configured host not in maintenance (`--all`: the
operator's dry run for the fleet), or capabilities files (`--caps`, repeatable).
The guests are placed as a batch (app/place/fleet_placement.py): hardest first, each
on the host where it scores best, with a bounded search for a better order when
one is left out; each sees the host's existing domains and the guests placed
before it. Prints a placement table (the host per guest; each guest's domain XML
after it with `--xml`, or into files with `--xml-dir DIR`; `-o wide` one line per guest,
`--columns` a choice of its columns), or with `-o json` (`--format json`) the stable
contract (`-o yaml`: the same, in YAML):

    {"host": str | null,        # the only candidate host (null: several)
     "hosts": [str],            # the candidate hosts
     "placements": [{"index", "guest", "host", "nodes", "vcpupin": {"0": [cpus]},
                     "emulatorpin": [cpus], "memory_nodes": [...], "mem_mode",
                     "score", "xml", "why" (with --why),
                     "others": [{"host", "score"} | {"host", "kind", "message", "reasons"}] (with --why)}],
     "errors": [{"index", "guest", "kind", "message", "reasons": [...],
                 "refused": [{"host", "kind", "message", "reasons"}]}],
     "refused_hosts": [{"host", "kind", "message"}],   # maintenance, unreadable
     "repins": [{"host", "guest", "vcpupin", "emulatorpin"}],
     "stale_records": [{"host", "guest", "state"}],   # records whose domain the host no longer has
     "batch": {"passes", "placed_first_pass", "placed", "order": [guest names, as placed]}}

Each placement shows the guest's pins as they end once the whole request is placed
(a shared guest placed before a dedicated one narrows), which is what `place`
reports and records. "repins" lists domains already on a host whose floating
(shared) vCPUs and emulator threads must narrow because planned guests take
pCPUs out of the shared pool. A host in maintenance is refused for every guest
(exit 3), as `place` refuses it, unless --ignore-maintenance. The plan judges the hosts
as `place` does: a guest vmplacer already placed is refused, and every placement on record
counts, also one whose domain the host no longer has (undefined behind vmplacer's back: its
pCPUs stay claimed until `vmplacer reconcile` releases the record); such records are listed
in "stale_records" and said on stderr. A refusal's
kind is maintenance, unreadable, no-fit, exists (a domain of the guest's name is
on the host), xml-policy or invalid-xml.

Exit codes: 0 every guest placed; 3 some guest does not fit (its NoFit reasons
are in "errors", the other guests are still placed); 1 the host failed (with
several hosts: every one); 2 bad input (request file, capabilities file, a base
XML that does not validate or that the host's domain XML policy refuses: kind
"xml-policy", each element, attribute and rule in "reasons").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from vmplacer.cli.common import (
    EXIT_NO_FIT,
    EXIT_OK,
    EXIT_USAGE,
    CliContext,
    OperationalError,
    UsageError,
    add_format_argument,
    emit,
    print_line,
    print_table,
    refuse_options,
    structured,
)
from vmplacer.cli.fleet_hosts import add_host_arguments, stale_warnings
from vmplacer.cli.log_format import say
from vmplacer.core.topology.cpuset import format_cpuset

PLAN_COLUMNS = ("guest", "host", "node(s)", "vcpupin", "emulatorpin", "memory nodes", "mode", "score")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="dry run: place the guests of a request file and show pinning (and domain XML)",
        description="Place the guests of a YAML request file on the best of the candidate hosts and "
        "print the host, placement and domain XML of each; nothing is changed. `--all-hosts` is the fleet's "
        "dry run. Without --host/--all-hosts/--caps: the first configured host (kept for existing scripts); "
        "with --rebalance: every configured host.",
    )
    add_host_arguments(parser, caps=True, verb="plan on",
                       default_note="kept so that existing scripts act where they did; with --rebalance: every configured host")
    parser.add_argument("--request", metavar="FILE", help="YAML request file (guests: [...]); required unless --rebalance")
    parser.add_argument("--rebalance", action="store_true",
                        help="plan live repins/migrations of the running guests instead (dry run, stored as proposed)")
    from vmplacer.cli.rebalance import add_policy_arguments

    add_policy_arguments(parser, host_group=False)
    parser.add_argument("--why", action="store_true",
                        help="show why the other hosts were refused or scored lower, and every candidate "
                        "placement of each guest with its score and the interference model's predicted loss")
    parser.add_argument("--ignore-maintenance", action="store_true",
                        help="plan on hosts in maintenance all the same (as `place --ignore-maintenance`)")
    parser.add_argument("--domain-type", choices=("kvm", "qemu"),
                        help="domain type of guests without base XML (default: the host's domain_type, else kvm)")
    parser.add_argument("--xml", action="store_true",
                        help="print each guest's domain XML after the table (the JSON always has it)")
    parser.add_argument("--xml-dir", metavar="DIR",
                        help="write each guest's domain XML to DIR/GUEST.xml (DIR is created; files replaced)")
    add_format_argument(parser, columns=PLAN_COLUMNS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.adapters.request_file import RequestFileError, load_request_file

    if args.rebalance:
        from vmplacer.cli.rebalance import run_rebalance_plan

        refuse_options(args, ("xml", "xml_dir"), "applies to placement plans (plan --request): a rebalancing "
                       "plan changes pins, not domain XML")
        refuse_options(args, ("columns",), "applies to placement plans (plan --request), not to plan --rebalance")

        if args.host and len(args.host) > 1:
            raise UsageError("--host: once with --rebalance (or --all)")
        if args.host:
            args.host = args.host[0]
        return run_rebalance_plan(args, ctx)
    from vmplacer.cli.rebalance import REBALANCE_PLAN_OPTIONS

    refuse_options(args, REBALANCE_PLAN_OPTIONS,
                   "applies to rebalancing plans (plan --rebalance), not to placement plans (plan --request)")
    if args.caps:
        refuse_options(args, ("ignore_maintenance",), "applies to configured hosts, not to --caps files "
                       "(an offline host is never in maintenance)")
    if structured(args):
        refuse_options(args, ("xml",), f"applies to table and wide output (the {args.format.upper()} has each "
                       "guest's domain XML)")
    if not args.request:
        raise UsageError("--request: required (or --rebalance to plan moves of running guests)")
    try:
        requests = load_request_file(args.request)
    except RequestFileError as exc:
        raise UsageError(f"--request: {exc}") from None
    from vmplacer.cli.fleet_plan import fleet_plan

    data = fleet_plan(args, ctx, requests)
    for line in stale_warnings(data["stale_records"]):
        say("warning", line)
    if args.xml_dir:
        _write_xml(Path(args.xml_dir), data["placements"])
    emit(args, data, lambda shown: _print_table(shown, with_xml=args.xml))
    kinds = {error["kind"] for error in data["errors"]}
    if kinds & {"invalid-xml", "xml-policy"}:
        return EXIT_USAGE
    return EXIT_NO_FIT if kinds else EXIT_OK  # what is left is "no-fit"


# ----- table output -----------------------------------------------------------------------------------
def _write_xml(directory: Path, placements: list[dict[str, Any]]) -> None:
    """Each planned guest's domain XML as DIR/GUEST.xml (guest names are checked names: no path)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for entry in placements:
            (directory / f"{entry['guest']}.xml").write_text(entry["xml"])
    except OSError as exc:
        raise OperationalError(f"--xml-dir {directory}: {exc.strerror or exc}") from None


def _print_table(data: dict[str, Any], *, with_xml: bool = False) -> None:
    rows = []
    for entry in data["placements"]:
        pins = " ".join(f"{v}→{format_cpuset(c)}" for v, c in entry["vcpupin"].items())
        rows.append((
            entry["guest"], entry["host"], format_cpuset(entry["nodes"]), pins,
            format_cpuset(entry["emulatorpin"]), format_cpuset(entry["memory_nodes"]),
            entry["mem_mode"], f"{entry['score']:.3f}",
        ))
    where = f"host {data['host']}" if data["host"] else "hosts " + ", ".join(data["hosts"])
    print_table(f"placement plan for {where} (dry run)", PLAN_COLUMNS, rows)
    for repin in data["repins"]:
        pins = " ".join(f"{v}→{format_cpuset(c)}" for v, c in repin["vcpupin"].items())
        print_line(f"existing guest {repin['guest']} on host {repin['host']}: floating vCPUs narrow to {pins}")
    for refused in data["refused_hosts"]:
        print_line(f"host {refused['host']} takes no guest: {refused['message']}")
    for entry in data["placements"]:
        if "others" in entry:
            _print_others(entry)
        if "why" in entry:
            from vmplacer.cli.plan_why import print_why

            print_why(entry["guest"], entry["why"])
    for entry in data["placements"] if with_xml else ():
        print(f"\n<!-- domain XML of guest {entry['guest']} -->")
        sys.stdout.write(entry["xml"])
    for error in data["errors"]:
        sys.stderr.write(f"vmplacer: guest #{error['index']} ({error['guest']}): {error['message']}\n")


def _print_others(entry: dict[str, Any]) -> None:
    print()
    print_line(f"guest {entry['guest']} goes to host {entry['host']}; the other hosts:")
    if not entry["others"]:
        print("  (none)")
    for other in entry["others"]:
        if "score" in other:
            print_line(f"  host {other['host']}: fits, but scores {other['score']:.3f}")
        else:
            print_line(f"  host {other['host']}: {other['kind']}: {other['message']}")
