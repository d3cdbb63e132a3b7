"""The candidate hosts of `plan` and `place`: named (`--host`, repeatable), every configured
one (`--all-hosts`, or `--all`), the first configured one (neither), or capabilities files (`--caps`, repeatable, an offline fleet).

A host in maintenance takes no new guest and one that cannot be read takes none either:
both are reported as refused, next to the guests' own reasons.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmplacer.cli.common import (
    CliContext,
    OperationalError,
    UsageError,
    add_host_selection,
    count,
    resolve_host,
    resolve_hosts,
)


def add_host_arguments(parser: argparse.ArgumentParser, *, caps: bool, verb: str, default_note: str) -> None:
    """The shared host selection (each guest goes to the best of the hosts, those in maintenance
    refused), `--hosts-to-score`, and with `caps` the offline `--caps` files instead of hosts."""
    source = add_host_selection(parser, default="first", verb=verb, default_note=default_note,
                                host_note=": each guest goes to the best of them, hosts in maintenance refused")
    parser.add_argument("--hosts-to-score", type=count(0, 100_000, zero="every host"), default=None, metavar="N",
                        help="with more candidate hosts than N, allocate each guest on the N whose free room "
                        "promises most (and the best of each host shape), not on every host (default 8; "
                        "0: every host)")
    if caps:
        source.add_argument("--caps", metavar="[NAME=]FILE", action="append",
                            help="a libvirt capabilities XML file, an idle host (repeatable: an offline "
                            "fleet; named from the file, or NAME=FILE)")


def fleet_planner(args: argparse.Namespace) -> Any:
    """The batch planner with the operator's --hosts-to-score (plan and place decide alike)."""
    from vmplacer.app.place.fleet_planner import FleetPlanner

    chosen = getattr(args, "hosts_to_score", None)
    return FleetPlanner() if chosen is None else FleetPlanner(hosts_to_score=chosen)


@dataclass
class Candidates:
    """The hosts a request may land on, and those refused outright (maintenance, unreadable)."""

    names: list[str]
    closed: list[Any] = field(default_factory=list)  # Refusal per host taking no guest
    configured: bool = True  # False: capabilities files
    policies: dict[str, Any] = field(default_factory=dict)
    domain_types: dict[str, str] = field(default_factory=dict)
    stale: list[dict[str, str]] = field(default_factory=list)  # records naming a domain the host lacks

    @property
    def all_names(self) -> list[str]:
        return self.names + [r.host for r in self.closed]


def configured_candidates(args: argparse.Namespace, ctx: CliContext, *, maintenance: str = "fleet",
                          alternatives: str = "") -> Candidates:
    """The configured hosts named (or all of them, or the first), minus those in maintenance.

    `maintenance`: "always" reads it (one host too: a dry run answers as the placement would),
    "fleet" only when there are several candidates, "ignore" never. A host in maintenance is
    refused like a host that has no room: listed in `closed`, and when it was the only one (or
    every one), `names` is empty and each guest of the request is refused (exit 3)."""
    from vmplacer.app.place.fleet_planner import Refusal

    if args.all:
        names = resolve_hosts(ctx, None)
    elif args.host:
        names = resolve_hosts(ctx, args.host)
    else:
        names = [resolve_host(ctx, None, alternatives)]
    several = args.all or len(names) > 1
    closed: list[Refusal] = []
    if maintenance == "always" or (maintenance == "fleet" and several):
        ctx.container.upgrade_database()
        down = ctx.container.maintenance.current()
        closed = [Refusal(n, "maintenance", down[n].describe() + ": it takes no new guest "
                          "(--ignore-maintenance places there all the same)") for n in names if n in down]
        names = [n for n in names if n not in down]
    return Candidates(names, closed, True,
                      {n: ctx.container.xml_policy(n) for n in names},
                      {n: ctx.settings.host(n).domain_type for n in names})


def observe(ctx: CliContext, candidates: Candidates) -> list[Any]:
    """Each configured candidate's planning view: its live topology and domains, plus the
    placements recorded there that libvirt does not show (a reservation being defined, or a
    record whose domain went away without vmplacer), and the anti-affinity its guests on record
    carry. `plan` and `place` both read this view, so the dry run decides what the placement
    does: a record keeps its pCPUs claimed in the database, so the placement counts it, and so
    must the plan. Records naming a domain the host no longer has are listed in
    `candidates.stale` for the operator (`vmplacer reconcile` forgets them). A host that cannot
    be read is refused, unless it was the only one (then it is an operational error)."""
    from vmplacer.adapters.domain_xml import DomainXmlError
    from vmplacer.app.host_fanout import for_each_host
    from vmplacer.app.observe.host_snapshot import take_snapshot
    from vmplacer.app.place.fleet_placement import fleet_host
    from vmplacer.app.place.fleet_planner import Refusal
    from vmplacer.ports import HypervisorError

    store = ctx.container.placement_store
    # a dry run on a machine never set up has no records (and creates no database to say so)
    has_records = ctx.container.database_has("placements")
    records = _GroupedRecords(store.every_host_occupied_and_refusals() if has_records else {})

    def read(name: str) -> tuple[Any, list[dict[str, str]]]:
        host = ctx.container.hypervisor(name)
        snapshot = take_snapshot(host, records, listing=True)
        view = fleet_host(snapshot, ctx.container.allocation_options(name), ctx.container.admission)
        return view, stale_records(store, name, snapshot) if has_records else []

    views = []
    names = list(candidates.names)
    # hosts answer at once (remote daemons take milliseconds per call); views in the hosts' order
    for outcome in for_each_host(names, read, limit=ctx.settings.rebalance.parallel_hosts):
        name, exc = outcome.host, outcome.error
        if exc is None:
            assert outcome.result is not None  # a host read without an error gave its view
            view, stale = outcome.result
            views.append(view)
            candidates.stale.extend(stale)
            continue
        if not isinstance(exc, (HypervisorError, DomainXmlError)):
            raise exc
        text = (str(exc) if isinstance(exc, HypervisorError)
                else f"host {name}: a domain's XML cannot be read: {exc}")
        if len(candidates.names) == 1:
            raise OperationalError(text) from None
        candidates.names.remove(name)
        candidates.closed.append(Refusal(name, "unreadable", text))
    if not views:
        raise OperationalError("no candidate host could be read: "
                               + "; ".join(r.message for r in candidates.closed))
    return views


class _GroupedRecords:
    """Every host's records from one grouped read, as a snapshot asks for one host's."""

    def __init__(self, by_host: dict[str, tuple[list[Any], dict[str, tuple[str, ...]]]]):
        self._by_host = by_host

    def occupied(self, host: str) -> list[Any]:
        return self.occupied_and_refusals(host)[0]

    def occupied_and_refusals(self, host: str) -> tuple[list[Any], dict[str, tuple[str, ...]]]:
        return self._by_host.get(host, ([], {}))


def stale_records(store: Any, host: str, snapshot: Any) -> list[dict[str, str]]:
    """The records of `host` whose guest was defined (or running) but has no domain there now:
    undefined behind vmplacer's back, or a host whose driver keeps nothing (test:///default).
    A `planned` record is a reservation whose domain is still to come, not stale. The store is
    asked only when the snapshot holds records libvirt does not show (usually never)."""
    missing = {placement.guest for placement in snapshot.recorded}
    if not missing:
        return []
    return [{"host": host, "guest": record.guest, "state": record.state}
            for record in store.records(host) if record.guest in missing and record.state != "planned"]


def stale_warnings(stale: list[dict[str, str]]) -> list[str]:
    """One line per host for the operator: what `plan` and `place` count although libvirt no
    longer has it, and what to run."""
    by_host: dict[str, list[str]] = {}
    for record in stale:
        by_host.setdefault(record["host"], []).append(record["guest"])
    lines = []
    for host, guests in by_host.items():
        one = len(guests) == 1
        lines.append(f"host {host}: {len(guests)} placement record{'' if one else 's'} "
                     f"name{'s' if one else ''} {'a domain' if one else 'domains'} the host no longer has "
                     f"({', '.join(guests)}): plan and place count {'its' if one else 'their'} pCPUs and "
                     f"name{'' if one else 's'} as taken until `vmplacer reconcile` releases "
                     f"{'it' if one else 'them'} (a record unchanged for --settle, 60 s by default)")
    return lines


def already_placed(ctx: CliContext, requests: list) -> tuple[list[dict[str, Any]], list]:
    """The guests of `requests` vmplacer already recorded (on any host), each refused as the
    placement service refuses it, and the others: `plan` and `place` leave the same guests out
    of the batch, so the others are planned alike."""
    from vmplacer.app.place.fleet_planner import no_fit_refusal
    from vmplacer.app.place.placement_batch import already_placed as refusal

    if not ctx.container.database_has("placements"):
        return [], list(requests)
    store = ctx.container.placement_store
    refused, rest = [], []
    for request in requests:
        record = store.get(request.spec.name)
        if record is None:
            rest.append(request)
            continue
        exc = refusal(request.spec, record["host"])
        refused.append({"index": request.index, "guest": request.spec.name, "kind": "no-fit",
                        "message": str(exc), "reasons": [r.to_dict() for r in exc.reasons],
                        "refused": [no_fit_refusal(exc, record["host"]).to_dict()]})
    return refused, rest


def caps_candidates(entries: list[str], domain_type: str | None) -> tuple[Candidates, list[Any]]:
    """Capabilities files as idle hosts: named from the file, or NAME=FILE."""
    from vmplacer.adapters.capabilities import CapabilitiesError, read_capabilities_file
    from vmplacer.app.place.fleet_planner import FleetHost

    hosts: list[FleetHost] = []
    candidates = Candidates([], configured=False)
    for entry in entries:
        name, _, path_text = entry.rpartition("=") if "=" in entry and not Path(entry).is_file() else ("", "", entry)
        path = Path(path_text)
        if not path.is_file():
            raise UsageError(f"--caps {path}: no such file")
        try:
            topology = read_capabilities_file(path)
        except CapabilitiesError as exc:
            raise UsageError(f"--caps: {exc}") from None
        if name:
            topology = _renamed(topology, name)
        if topology.name in candidates.names:
            raise UsageError(f"--caps {entry}: host {topology.name!r} is given twice (name them: NAME=FILE)")
        candidates.names.append(topology.name)
        candidates.policies[topology.name] = _caps_policy(topology.name, path)
        candidates.domain_types[topology.name] = domain_type or "kvm"
        hosts.append(FleetHost(topology.name, topology))
    return candidates, hosts


def _renamed(topology: Any, name: str) -> Any:
    import dataclasses

    return dataclasses.replace(topology, name=name)


def _caps_policy(name: str, path: Path) -> Any:
    """A host known from its capabilities: its emulators are listed there; its storage is
    taken to be libvirt's default pool."""
    from vmplacer.adapters.domain_xml_policy import DEFAULT_POOL_PATH, DomainXmlPolicy, HostFacts, emulators_in

    facts = HostFacts(emulators_in(path.read_text(encoding="utf-8")), (DEFAULT_POOL_PATH,))
    return DomainXmlPolicy(name, facts=lambda: facts)
