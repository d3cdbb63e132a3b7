"""`vmplacer place`: define (and optionally start) guests on a host, recording their placement.

Unlike `vmplacer plan` this changes the host. Placements on one host are
serialized, and exclusive pCPUs are claimed in the database before libvirt
sees the domain, so concurrent `place` calls never double-book a pCPU.
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
    emit,
    print_table,
    resolve_host,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "place",
        help="place, define (and optionally start) the guests of a request file on a host",
        description="Place each guest of a YAML request file on a configured host, define its domain "
        "and record the placement. The others are still placed when one cannot be: exit 3 if a guest "
        "does not fit, 1 if libvirt or the database failed for one, 2 if the domain XML policy refused one.",
    )
    parser.add_argument("--host", metavar="NAME", help="a configured host (default: the first)")
    parser.add_argument("--request", metavar="FILE", required=True, help="YAML request file (guests: [...])")
    parser.add_argument("--start", action="store_true", help="start each domain after defining it")
    parser.add_argument("--ignore-maintenance", action="store_true",
                        help="place on the host even though it is in maintenance (e.g. a test guest after "
                             "the work, before `vmplacer hosts enable`)")
    add_format_argument(parser)
    parser.set_defaults(func=run)

    listing = subparsers.add_parser("placements", help="list the placements vmplacer recorded")
    listing.add_argument("--host", metavar="NAME", help="only this host")
    add_format_argument(listing)
    listing.set_defaults(func=run_list)


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.adapters.domain_xml import DomainXmlError
    from vmplacer.adapters.domain_xml_policy import DomainXmlPolicyError
    from vmplacer.adapters.request_file import RequestFileError, load_request_file
    from vmplacer.config import ConfigError
    from vmplacer.core.nofit import NoFit
    from vmplacer.ports import ClaimConflict, HypervisorError

    try:
        requests = load_request_file(args.request)
    except RequestFileError as exc:
        raise UsageError(f"--request: {exc}") from None
    container = ctx.container
    host_name = resolve_host(ctx, args.host)
    try:
        host = container.hypervisor(host_name)
    except ConfigError as exc:
        raise UsageError(f"--host: {exc}") from None
    _hold_to_policy(container, host_name, args.request, requests)
    container.upgrade_database()
    maintenance = container.maintenance.get(host_name)
    if maintenance is not None and not args.ignore_maintenance:
        raise OperationalError(f"{maintenance.describe()}: it takes no new guest "
                               "(--ignore-maintenance places there all the same)")
    service = container.placement_service()
    placed: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for request in requests:
        spec = request.spec
        try:
            result = service.place(host, spec, request.base_xml, start=args.start,
                                   actor_detail={"via": "cli"})
            placed.append(result.to_dict())
        except NoFit as exc:
            errors.append({"index": request.index, "guest": spec.name, "kind": "no-fit",
                           "message": str(exc), "reasons": [r.to_dict() for r in exc.reasons]})
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
    data = {"host": host_name, "placements": placed, "errors": errors}

    def table(d: dict[str, Any]) -> None:
        print_table(f"placed on host {d['host']}", ("guest", "state", "pinning", "uuid"),
                    [(p["guest"], p["state"], _pins(p), p["domain_uuid"]) for p in d["placements"]])
        for e in d["errors"]:
            sys.stderr.write(f"vmplacer: guest #{e['index']} ({e['guest']}): {e['message']}\n")

    emit(args, data, table)
    kinds = {e["kind"] for e in errors}
    if "xml-policy" in kinds:
        return EXIT_USAGE
    if kinds - {"no-fit"}:
        return EXIT_OPERATIONAL
    return EXIT_NO_FIT if kinds else EXIT_OK


def _hold_to_policy(container: Any, host_name: str, request_file: str, requests: list) -> None:
    """Every base XML of the request file against the host's domain XML policy, before any
    guest is placed: one refusal and nothing changes (exit 2, each element, attribute and rule named)."""
    from vmplacer.ports import HypervisorError

    policy = container.xml_policy(host_name)
    problems = []
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
    from vmplacer.core.placement import placement_from_dict

    return placement_from_dict(entry).describe_pinning()


def run_list(args: argparse.Namespace, ctx: CliContext) -> int:
    from sqlalchemy import select

    from vmplacer.adapters.db.models import HostRow, PlacementRow

    container = ctx.container
    container.upgrade_database()
    with container.sessions() as session:
        query = select(PlacementRow, HostRow.name).join(HostRow).order_by(PlacementRow.id)
        if args.host:
            query = query.where(HostRow.name == args.host)
        rows = [
            {"guest": row.guest, "host": host, "state": row.state, "domain_uuid": row.domain_uuid,
             "placement": row.placement, "claims": sorted(c.cpu for c in row.claims)}
            for row, host in session.execute(query)
        ]
    emit(args, rows, lambda d: print_table(
        "placements", ("guest", "host", "state", "pinning", "exclusive pCPUs"),
        [(r["guest"], r["host"], r["state"], _pins(r["placement"]),
          ",".join(map(str, r["claims"]))) for r in d]))
    return 0
