"""`vmplacer plan`: place the guests of a request file on a host — a dry run, nothing changes.

Guests are placed in file order, each seeing the ones before it (and, with
--host, the host's existing domains and their pinning) as occupied. Prints a
placement table and each guest's domain XML, or with `--format json` the
stable contract:

    {"host": str,
     "placements": [{"index", "guest", "host", "nodes", "vcpupin": {"0": [cpus]},
                     "emulatorpin": [cpus], "memory_nodes": [...], "mem_mode",
                     "score", "xml", "why" (with --why)}],
     "errors": [{"index", "guest", "kind", "message", "reasons": [...]}],
     "repins": [{"guest", "vcpupin", "emulatorpin"}]}

"repins" lists domains already on the host whose floating (shared) vCPUs must
narrow because planned guests take pCPUs out of the shared pool.

Exit codes: 0 every guest placed; 3 some guest does not fit (its NoFit reasons
are in "errors", later guests are still placed); 1 the host failed; 2 bad input
(request file, capabilities file, a base XML that does not validate or that the
host's domain XML policy refuses: kind "xml-policy", each element, attribute and
rule in "reasons").
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
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
    print_table,
    resolve_host,
)
from vmplacer.core.cpuset import format_cpuset
from vmplacer.core.placement import Placement
from vmplacer.core.policies.admit import AllocationOptions
from vmplacer.core.topology import HostTopology


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="dry run: place the guests of a request file and show pinning and domain XML",
        description="Place the guests of a YAML request file on a host and print the placement "
        "and domain XML of each; nothing is changed. Without --host/--caps: the first configured host.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--host", metavar="NAME", help="a configured host; its domains count as occupied")
    source.add_argument("--caps", metavar="FILE", help="a libvirt capabilities XML file (an idle host)")
    source.add_argument("--all", action="store_true", help="with --rebalance: every configured host")
    parser.add_argument("--request", metavar="FILE", help="YAML request file (guests: [...]); required unless --rebalance")
    parser.add_argument("--rebalance", action="store_true",
                        help="plan live repins/migrations of the running guests instead (dry run, stored as proposed)")
    from vmplacer.cli.rebalance import add_policy_arguments

    add_policy_arguments(parser, host_group=False)
    parser.add_argument("--why", action="store_true",
                        help="show every candidate placement of each guest with its score and the interference "
                        "model's predicted loss (for the guest and for the guests it joins)")
    parser.add_argument("--domain-type", choices=("kvm", "qemu"),
                        help="domain type of guests without base XML (default: the host's domain_type, else kvm)")
    add_format_argument(parser)
    parser.set_defaults(func=run)


@dataclass
class HostState:
    name: str
    topology: HostTopology
    existing: list[Placement] = field(default_factory=list)
    domain_type: str = "kvm"
    options: AllocationOptions = field(default_factory=AllocationOptions)
    policy: Any = None  # its DomainXmlPolicy; None: a host known by name only (no emulator, no storage)
    admission: Any = None  # its ModelAdmission (scorers from the model); None: topology scorers only
    profiles: dict[str, Any] = field(default_factory=dict)  # what admission knows of the guests there


@dataclass
class PlanResult:
    host: str
    placements: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    repins: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "placements": self.placements, "errors": self.errors,
                "repins": self.repins}


def run(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.adapters.request_file import RequestFileError, load_request_file

    if args.rebalance:
        from vmplacer.cli.rebalance import run_rebalance_plan

        return run_rebalance_plan(args, ctx)
    if not args.request:
        raise UsageError("--request: required (or --rebalance to plan moves of running guests)")
    if args.all:
        raise UsageError("--all: only with --rebalance")

    try:
        requests = load_request_file(args.request)
    except RequestFileError as exc:
        raise UsageError(f"--request: {exc}") from None
    from vmplacer.ports import HypervisorError

    state = _host_state(args, ctx)
    if args.domain_type:
        state.domain_type = args.domain_type
    try:
        result = make_plan(state, requests, why=args.why)
    except HypervisorError as exc:  # the host's emulators or storage pools could not be read
        raise OperationalError(str(exc)) from None
    emit(args, result.to_dict(), _print_table)
    kinds = {error["kind"] for error in result.errors}
    if kinds & {"invalid-xml", "xml-policy"}:
        return EXIT_USAGE
    return EXIT_NO_FIT if kinds else EXIT_OK  # what is left is "no-fit"


def make_plan(state: HostState, requests: list, *, why: bool = False) -> PlanResult:
    """Place each request in order; render XML of the final (pool-refreshed) placements.

    Each base XML is held to the host's domain XML policy before it is placed, and each
    rendered document again; a refused guest holds no resources. With `why`, each placement
    lists every candidate the engine built, with its score and predicted loss."""
    from vmplacer.adapters.domain_xml import DomainXmlError, render_domain
    from vmplacer.adapters.domain_xml_policy import DomainXmlPolicy, DomainXmlPolicyError
    from vmplacer.core.allocate import NoFit, allocate, refresh_shared_pins

    policy = state.policy or DomainXmlPolicy(state.name)
    result = PlanResult(state.name)
    occupied: list[Placement] = list(state.existing)
    anti_affinity: dict[str, tuple[str, ...]] = {}
    planned: dict[str, Any] = {}  # guest -> request
    profiles = dict(state.profiles)
    reasons: dict[str, dict[str, Any]] = {}  # guest -> its candidates (--why)
    for request in requests:
        spec = request.spec
        candidates: list[Placement] = []
        try:
            if request.base_xml is not None:
                policy.check(request.base_xml, spec.name)
            scorer = state.admission.scorer(spec, profiles) if state.admission is not None else None
            placement = allocate(state.topology, spec, occupied, scorer=scorer, options=state.options,
                                 anti_affinity_of_others=anti_affinity, candidates=candidates if why else None)
            if why:
                from vmplacer.cli.plan_why import explain

                reasons[spec.name] = explain(state, scorer, placement, candidates, list(occupied))
            # Render now: a base XML that cannot take the placement must not hold resources.
            policy.check(render_domain(spec, placement, base_xml=request.base_xml, domain_type=state.domain_type),
                         spec.name, "the rendered domain XML")
        except DomainXmlPolicyError as exc:
            result.errors.append(_policy_error(request, exc))
            continue
        except NoFit as exc:
            result.errors.append({
                "index": request.index, "guest": spec.name, "kind": "no-fit", "message": str(exc),
                "reasons": [r.to_dict() for r in exc.reasons],
            })
            continue
        except DomainXmlError as exc:
            result.errors.append({
                "index": request.index, "guest": spec.name, "kind": "invalid-xml", "message": str(exc),
                "reasons": [],
            })
            continue
        occupied.append(placement)
        anti_affinity[spec.name] = spec.anti_affinity
        planned[spec.name] = request
        if state.admission is not None:  # the model (and numpy) only where placing uses it
            from vmplacer.core.interference_scorer import profile_of_spec

            profiles[spec.name] = profile_of_spec(spec)

    refreshed = {p.guest: p for p in refresh_shared_pins(state.topology, occupied)}
    for before in state.existing:
        after = refreshed[before.guest]
        if after != before:
            result.repins.append({
                "guest": after.guest,
                "vcpupin": {str(v): sorted(c) for v, c in sorted(after.vcpupin.items())},
                "emulatorpin": sorted(after.emulatorpin),
            })
    for name, request in planned.items():
        placement = refreshed[name]
        xml = render_domain(request.spec, placement, base_xml=request.base_xml, domain_type=state.domain_type)
        try:
            policy.check(xml, name, "the rendered domain XML")
        except DomainXmlPolicyError as exc:
            result.errors.append(_policy_error(request, exc))
            continue
        nodes = sorted({state.topology.cpus[c].node for c in placement.pcpus if c in state.topology.cpus})
        result.placements.append({
            "index": request.index,
            "guest": name,
            "host": placement.host,
            "nodes": nodes,
            "vcpupin": {str(v): sorted(c) for v, c in sorted(placement.vcpupin.items())},
            "emulatorpin": sorted(placement.emulatorpin),
            "memory_nodes": sorted(placement.memory_nodes),
            "mem_mode": placement.mem_mode,
            "hugepage_kib": placement.hugepage_kib,
            "threads_per_core": placement.threads_per_core,
            "score": placement.score,
            "xml": xml,
            **({"why": reasons[name]} if name in reasons else {}),
        })
    return result


def _policy_error(request: Any, exc: Any) -> dict[str, Any]:
    return {"index": request.index, "guest": request.spec.name, "kind": "xml-policy", "message": str(exc),
            "reasons": [v.to_dict() for v in exc.violations]}


# ----- where the host comes from -------------------------------------------------------------------
def _host_state(args: argparse.Namespace, ctx: CliContext) -> HostState:
    if args.caps:
        return _from_caps(Path(args.caps))
    return _from_host(ctx, args.host)


def _from_caps(path: Path) -> HostState:
    from vmplacer.adapters.capabilities import CapabilitiesError, read_capabilities_file

    if not path.is_file():
        raise UsageError(f"--caps {path}: no such file")
    try:
        topology = read_capabilities_file(path)
    except CapabilitiesError as exc:
        raise UsageError(f"--caps: {exc}") from None
    return HostState(topology.name, topology, policy=_caps_policy(topology.name, path))


def _caps_policy(name: str, path: Path) -> Any:
    """A host known from its capabilities: its emulators are listed there; its storage is
    taken to be libvirt's default pool."""
    from vmplacer.adapters.domain_xml_policy import DEFAULT_POOL_PATH, DomainXmlPolicy, HostFacts, emulators_in

    facts = HostFacts(emulators_in(path.read_text(encoding="utf-8")), (DEFAULT_POOL_PATH,))
    return DomainXmlPolicy(name, facts=lambda: facts)


def _from_host(ctx: CliContext, name: str | None) -> HostState:
    from vmplacer.adapters.domain_xml import DomainXmlError
    from vmplacer.ports import HypervisorError

    name = resolve_host(ctx, name, "--caps FILE")
    settings = ctx.settings.host(name)
    try:
        hypervisor = ctx.container.hypervisor(name)
        topology = hypervisor.topology()
        domains = hypervisor.domains()
    except HypervisorError as exc:
        raise OperationalError(str(exc)) from None
    except DomainXmlError as exc:
        raise OperationalError(f"host {name}: a domain's XML cannot be read: {exc}") from None
    from vmplacer.app.admission import profiles_of

    existing = [_occupied(d, name) for d in domains]
    return HostState(name, topology, existing, settings.domain_type, settings.allocation,
                     ctx.container.xml_policy(name), ctx.container.admission, profiles_of(domains))


def _occupied(domain: Any, host: str) -> Placement:
    """A domain's placement; one read without pinning floats anywhere with its vCPUs and memory."""
    if domain.placement is not None:
        return domain.placement
    return Placement(
        guest=domain.name, host=host, vcpupin={v: frozenset() for v in range(domain.vcpus)},
        memory_kib=domain.memory_kib,
    )


# ----- table output -----------------------------------------------------------------------------------
def _print_table(data: dict[str, Any]) -> None:
    rows = []
    for entry in data["placements"]:
        pins = " ".join(f"{v}→{format_cpuset(c)}" for v, c in entry["vcpupin"].items())
        rows.append((
            entry["guest"], entry["host"], format_cpuset(entry["nodes"]), pins,
            format_cpuset(entry["emulatorpin"]), format_cpuset(entry["memory_nodes"]),
            entry["mem_mode"], f"{entry['score']:.3f}",
        ))
    print_table(f"placement plan for host {data['host']} (dry run)",
                ("guest", "host", "node(s)", "vcpupin", "emulatorpin", "memory nodes", "mode", "score"), rows)
    for repin in data["repins"]:
        pins = " ".join(f"{v}→{format_cpuset(c)}" for v, c in repin["vcpupin"].items())
        print(f"existing guest {repin['guest']}: floating vCPUs narrow to {pins}")
    for entry in data["placements"]:
        if "why" in entry:
            from vmplacer.cli.plan_why import print_why

            print_why(entry["guest"], entry["why"])
    for entry in data["placements"]:
        print(f"\n<!-- domain XML of guest {entry['guest']} -->")
        sys.stdout.write(entry["xml"])
    for error in data["errors"]:
        sys.stderr.write(f"vmplacer: guest #{error['index']} ({error['guest']}): {error['message']}\n")
