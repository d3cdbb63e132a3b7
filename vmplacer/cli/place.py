"""`vmplacer place`: define (and optionally start) guests on the best candidate hosts,
recording their placement.

Unlike `vmplacer plan` this changes the hosts. The candidates are the first
configured host (default), those named with `--host` (repeatable) or every
configured host not in maintenance (`--all`). The request is planned as a batch
(hardest first, app/place/fleet_planner.py), then each guest is placed on its planned
host, or the next one that takes it, through the placement service (claim,
define, undo on failure), never over a domain of the same name. Placements on one
host are serialized, and exclusive pCPUs are claimed in the database before
libvirt sees the domain, so concurrent `place` calls never double-book a pCPU.

It judges the hosts as `vmplacer plan` does (cli/fleet_hosts.py): a guest already on record
is refused before the batch is planned, and every record counts, also one whose domain the
host no longer has ("stale_records", said on stderr until `vmplacer reconcile` releases it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vmplacer.cli.common import (
    EXIT_NO_FIT,
    EXIT_OK,
    EXIT_OPERATIONAL,
    EXIT_USAGE,
    CliContext,
    OperationalError,
    UsageError,
    add_format_argument,
    add_host_selection,
    emit,
    print_line,
    print_table,
)
from vmplacer.cli.fleet_hosts import add_host_arguments, stale_warnings
from vmplacer.cli.log_format import say

PLACED_COLUMNS = ("guest", "host", "state", "pinning", "uuid")
PLACEMENTS_COLUMNS = ("guest", "host", "state", "pinning", "exclusive pCPUs")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "place",
        help="place, define (and optionally start) a request file's guests on the best hosts",
        description="Place each guest of a YAML request file on the best candidate host, define its "
        "domain and record the placement. The others are still placed when one cannot be: exit 3 if a "
        "guest does not fit, 1 if libvirt or the database failed for one, 2 if the domain XML policy "
        "refused one. Without --host/--all-hosts: the first configured host (kept for existing scripts).",
    )
    add_host_arguments(parser, caps=False, verb="place on", default_note="kept so that existing scripts act where they did")
    parser.add_argument("--request", metavar="FILE", required=True, help="YAML request file (guests: [...])")
    parser.add_argument("--start", action="store_true", help="start each domain after defining it")
    parser.add_argument("--ignore-maintenance", action="store_true",
                        help="place on hosts in maintenance all the same (e.g. a test guest after "
                             "the work, before `vmplacer hosts enable`)")
    add_format_argument(parser, columns=PLACED_COLUMNS)
    parser.set_defaults(func=run)

    listing = subparsers.add_parser("placements", help="list the placements vmplacer recorded")
    add_host_selection(listing, default="all", verb="list the placements on", repeatable=False)
    add_format_argument(listing, columns=PLACEMENTS_COLUMNS)
    listing.set_defaults(func=run_list)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.adapters.request_file import RequestFileError, load_request_file
    from vmplacer.config import ConfigError

    try:
        requests = load_request_file(args.request)
    except RequestFileError as exc:
        raise UsageError(f"--request: {exc}") from None
    container = ctx.container
    from vmplacer.cli.fleet_hosts import configured_candidates

    try:
        candidates = configured_candidates(args, ctx, maintenance="ignore")
        for name in candidates.names:
            container.hypervisor(name)
    except ConfigError as exc:
        raise UsageError(f"--host: {exc}") from None
    for name in candidates.names:
        _hold_to_policy(container, name, args.request, requests)
    if not args.ignore_maintenance:
        candidates = configured_candidates(args, ctx, maintenance="always")
    container.upgrade_database()
    from vmplacer.cli.fleet_hosts import already_placed
    from vmplacer.cli.fleet_plan import every_guest_refused, with_records_said

    placed_before, rest = already_placed(ctx, requests)  # left out of the batch, as the dry run leaves them
    if candidates.names:
        placed, errors = _place_all(args, ctx, candidates, rest)
    else:  # every candidate in maintenance: each guest refused, as the dry run says
        placed, errors = [], every_guest_refused(rest, candidates)["errors"]
    data = with_records_said(
        {"host": candidates.all_names[0] if len(candidates.all_names) == 1 else None,
         "hosts": candidates.all_names, "placements": placed, "errors": errors,
         "refused_hosts": [r.to_dict() for r in candidates.closed]}, placed_before, candidates)
    errors = data["errors"]
    for line in stale_warnings(candidates.stale):
        say("warning", line)

    def table(d: dict[str, Any]) -> None:
        where = f"host {d['host']}" if d["host"] else "hosts " + ", ".join(d["hosts"])
        print_table(f"placed on {where}", PLACED_COLUMNS,
                    [(p["guest"], p["host"], p["state"], _pins(p), p["domain_uuid"]) for p in d["placements"]])
        for refused in d["refused_hosts"]:
            print_line(f"host {refused['host']} takes no guest: {refused['message']}")
        for e in d["errors"]:
            sys.stderr.write(f"vmplacer: guest #{e['index']} ({e['guest']}): {e['message']}\n")
        for problem in _isolation_problems(d["placements"]):
            sys.stderr.write(f"vmplacer: warning: {problem}\n")

    emit(args, data, table)
    kinds = {e["kind"] for e in errors}
    if "xml-policy" in kinds:
        return EXIT_USAGE
    if kinds - {"no-fit"}:
        return EXIT_OPERATIONAL
    return EXIT_NO_FIT if kinds else EXIT_OK


def _place_all(args: argparse.Namespace, ctx: CliContext, candidates: Any,
               requests: list) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The batch planned on the hosts as they are, then each guest placed in the planned order,
    on its planned host first."""
    from vmplacer.adapters.domain_xml import DomainXmlError
    from vmplacer.adapters.domain_xml_policy import DomainXmlPolicyError
    from vmplacer.app.place.fleet_placement import NothingFits
    from vmplacer.bootstrap.fleet import cli_fleet_placement
    from vmplacer.cli.fleet_hosts import fleet_planner, observe
    from vmplacer.ports import ClaimConflict, HypervisorError

    container = ctx.container
    views = observe(ctx, candidates)
    names = candidates.names
    plan = fleet_planner(args).plan([r.spec for r in requests], views)
    fleet, service = cli_fleet_placement(container)
    placed: dict[int, dict[str, Any]] = {}
    errors: list[dict[str, Any]] = []
    left_out = [g.index for g in plan.guests if g.host is None]
    for index in plan.placed_in_order + left_out:
        request, planned = requests[index], plan.guests[index].host
        spec = request.spec
        order = [planned] + [n for n in names if n != planned] if planned else list(names)
        if container.placement_store.get(spec.name) is not None:
            errors.append(_already_placed(request, order[0]))
            continue
        try:
            choice = fleet.place(spec, names, request.base_xml, service=service, start=args.start,
                                 actor={"via": "cli"}, order=order)
            placed[index] = {"index": request.index, **choice.result.to_dict(), "host": choice.host}
            _follow_narrowing(placed.values(), choice.result.narrowed_pins())
        except NothingFits as exc:
            errors.append(_nothing_fits(request, exc))
        except DomainXmlPolicyError as exc:  # the rendered XML, refused before libvirt saw it (claim undone)
            errors.append({"index": request.index, "guest": spec.name, "kind": "xml-policy",
                           "message": str(exc), "reasons": [v.to_dict() for v in exc.violations]})
        except DomainXmlError as exc:
            errors.append({"index": request.index, "guest": spec.name, "kind": "invalid-xml",
                           "message": str(exc), "reasons": []})
        except ClaimConflict as exc:
            errors.append({"index": request.index, "guest": spec.name, "kind": "conflict",
                           "message": str(exc), "reasons": []})
        except HypervisorError as exc:
            if not placed and not errors and exc.retriable and not exc.domain:
                raise OperationalError(str(exc)) from None
            errors.append({"index": request.index, "guest": spec.name, "kind": "libvirt",
                           "message": str(exc), "reasons": []})
    errors.sort(key=lambda e: e["index"])
    return [placed[i] for i in sorted(placed)], errors


def _isolation_problems(placements: list[dict[str, Any]]) -> list[str]:
    """The isolation problems left after the last placement on each host (each placement reports
    the host as it left it, so the last one is current)."""
    last: dict[str, list[str]] = {}
    for entry in placements:
        last[entry["host"]] = [v["message"] for v in entry.get("isolation_violations", [])]
    return [message for messages in last.values() for message in messages]


def _follow_narrowing(entries: Any, narrowed: list[dict[str, Any]]) -> None:
    """Guests of this request that a later placement narrowed are reported with their pins
    now, as libvirt and the records have them (their `xml` stays the document defined)."""
    pins = {(n["guest"], n["host"]): n for n in narrowed}
    for entry in entries:
        now = pins.get((entry["guest"], entry["host"]))
        if now is not None:
            entry["vcpupin"], entry["emulatorpin"] = now["vcpupin"], now["emulatorpin"]


def _already_placed(request: Any, host: str) -> dict[str, Any]:
    """A guest vmplacer placed before, on whichever host: the same answer the placement service gives."""
    from vmplacer.core.placement.nofit import NoFit, NoFitReason

    spec = request.spec
    exc = NoFit(spec.name, host, [NoFitReason("name", "fleet", "a guest name not yet placed",
                                              f"guest {spec.name} is already placed")])
    return {"index": request.index, "guest": spec.name, "kind": "no-fit", "message": str(exc),
            "reasons": [r.to_dict() for r in exc.reasons]}


def _nothing_fits(request: Any, exc: Any) -> dict[str, Any]:
    """A guest no candidate host took: one host's answer as it is; several, each named."""
    from vmplacer.app.place.fleet_planner import no_fit_refusal
    from vmplacer.core.placement.nofit import NoFit

    spec = request.spec
    no_fits = [(h, e) for h, e in exc.failures if isinstance(e, NoFit)]
    if len(exc.failures) == 1:
        message = str(exc.failures[0][1])
    else:
        message = f"guest {spec.name} fits on no candidate host:\n" + "\n".join(
            f"  host {h}: " + ("; ".join(str(r) for r in e.reasons) if isinstance(e, NoFit) else str(e))
            for h, e in exc.failures)
    return {"index": request.index, "guest": spec.name, "kind": "no-fit" if no_fits else "libvirt",
            "message": message, "reasons": [r.to_dict() for _, e in no_fits for r in e.reasons],
            "refused": [no_fit_refusal(e, h).to_dict() if isinstance(e, NoFit)
                        else {"host": h, "kind": "unreadable", "message": str(e), "reasons": []}
                        for h, e in exc.failures]}


def _hold_to_policy(container: Any, host_name: str, request_file: str, requests: list) -> None:
    """Every base XML of the request file against the host's domain XML policy, before any
    guest is placed: one refusal and nothing changes (exit 2, each element, attribute and rule named)."""
    from vmplacer.ports import HypervisorError

    policy = container.xml_policy(host_name)
    problems: list[str] = []
    for request in requests:
        if request.base_xml is None:
            continue
        try:
            found = policy.violations(request.base_xml)
        except HypervisorError as exc:
            raise OperationalError(str(exc)) from None
        problems.extend(f"{request_file}: guest #{request.index} ({request.spec.name}): field base_xml "
                        f"({request.base_xml_path}): {violation}" for violation in found)
    if problems:
        raise UsageError(f"--request: refused by the domain XML policy of host {host_name}:\n" + "\n".join(problems))


def _pins(entry: dict[str, Any]) -> str:
    from vmplacer.core.placement.guest_placement import placement_from_dict

    return placement_from_dict(entry).describe_pinning()


def run_list(args: argparse.Namespace, ctx: CliContext) -> int:
    container = ctx.container
    container.upgrade_database()
    rows = container.placement_store.listing(args.host)
    emit(args, rows, lambda d: print_table(
        "placements", PLACEMENTS_COLUMNS,
        [(r["guest"], r["host"], r["state"], _pins(r["placement"]),
          ",".join(map(str, r["claims"]))) for r in d]))
    return 0
