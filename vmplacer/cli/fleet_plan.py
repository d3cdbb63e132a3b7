"""The dry run behind `vmplacer plan --request`: candidate hosts, the batch placed by the
application's fleet planner, then the XML each host would be given (held to its policy)."""

from __future__ import annotations

import argparse
from typing import Any

from vmplacer.cli.common import CliContext, OperationalError
from vmplacer.cli.fleet_hosts import (
    Candidates,
    already_placed,
    caps_candidates,
    configured_candidates,
    fleet_planner,
    observe,
)


def candidates_and_views(args: argparse.Namespace, ctx: CliContext) -> tuple[Candidates, list[Any]]:
    if args.caps:
        return caps_candidates(args.caps, args.domain_type)
    maintenance = "ignore" if getattr(args, "ignore_maintenance", False) else "always"
    candidates = configured_candidates(args, ctx, maintenance=maintenance, alternatives="--caps FILE")
    if args.domain_type:
        candidates.domain_types = {n: args.domain_type for n in candidates.names}
    return candidates, (observe(ctx, candidates) if candidates.names else [])


def xml_vet(candidates: Candidates, requests: list) -> Any:
    """The host's domain XML policy on each guest's base XML and rendered document: a host
    that refuses it is refused for that guest (kind xml-policy or invalid-xml)."""
    from vmplacer.adapters.domain_xml import DomainXmlError, render_domain
    from vmplacer.adapters.domain_xml_policy import DomainXmlPolicy, DomainXmlPolicyError
    from vmplacer.app.place.fleet_planner import Refusal

    base = {r.spec.name: r.base_xml for r in requests}
    checked: dict[tuple[str, str], Refusal | None] = {}  # the base XML, once per guest and host

    def vet(spec: Any, host: Any, placement: Any) -> Refusal | None:
        if placement is None:
            key = (spec.name, host.name)
            if key not in checked:
                checked[key] = _vet(spec, host, None)
            return checked[key]
        return _vet(spec, host, placement)

    def _vet(spec: Any, host: Any, placement: Any) -> Refusal | None:
        policy = candidates.policies.get(host.name) or DomainXmlPolicy(host.name)
        try:
            if placement is None:
                if base[spec.name] is not None:
                    policy.check(base[spec.name], spec.name)
                return None
            xml = render_domain(spec, placement, base_xml=base[spec.name],
                                domain_type=candidates.domain_types.get(host.name, "kvm"))
            policy.check(xml, spec.name, "the rendered domain XML")
        except DomainXmlPolicyError as exc:
            return Refusal(host.name, "xml-policy", str(exc), tuple(v.to_dict() for v in exc.violations))
        except DomainXmlError as exc:
            return Refusal(host.name, "invalid-xml", str(exc))
        return None

    return vet


def fleet_plan(args: argparse.Namespace, ctx: CliContext, requests: list) -> dict[str, Any]:
    """The plan of `requests` on the candidate hosts, judged as `place` judges them: the hosts'
    records count, guests already placed are refused (configured hosts; --caps has no records)."""
    from vmplacer.ports import HypervisorError

    candidates, views = candidates_and_views(args, ctx)
    placed_before, rest = ([], list(requests)) if args.caps else already_placed(ctx, requests)
    if not candidates.names:  # every candidate in maintenance: each guest refused, as `place` would
        data = every_guest_refused(rest, candidates)
    else:
        try:
            data = plan_on(views, rest, candidates, why=args.why, planner=fleet_planner(args))
        except HypervisorError as exc:  # the host's emulators or storage pools could not be read
            raise OperationalError(str(exc)) from None
    return with_records_said(data, placed_before, candidates)


def with_records_said(data: dict[str, Any], placed_before: list[dict[str, Any]],
                      candidates: Candidates) -> dict[str, Any]:
    """`data` (a plan's or a placement's answer) with the guests refused as already placed among
    its errors, and the records naming domains the hosts no longer have ("stale_records")."""
    data["errors"] = sorted([*data["errors"], *placed_before], key=lambda e: e["index"])
    data["stale_records"] = list(candidates.stale)
    return data


def plan_on(views: list[Any], requests: list, candidates: Candidates | None = None, *,
            why: bool = False, planner: Any = None) -> dict[str, Any]:
    """The plan's JSON contract for `requests` on the planning views `views` (`planner`: a
    FleetPlanner; default the product's)."""
    from vmplacer.app.place.fleet_planner import FleetPlanner

    candidates = candidates or Candidates([v.name for v in views], configured=False)
    specs = [r.spec for r in requests]
    vet = xml_vet(candidates, requests)
    planner = planner or FleetPlanner()
    plan = planner.plan(specs, views, closed=candidates.closed, vet=vet, why=why)
    if why:
        planner.explain_others(plan, specs, vet)
    return _contract(plan, candidates, requests, vet, why=why)


def _contract(plan: Any, candidates: Candidates, requests: list, vet: Any, *, why: bool) -> dict[str, Any]:
    from vmplacer.adapters.domain_xml import render_domain
    from vmplacer.core.placement.allocate import refresh_shared_pins

    names = [h.name for h in plan.hosts]
    data: dict[str, Any] = {
        "host": names[0] if len(names) == 1 and not candidates.closed else None,
        "hosts": candidates.all_names, "placements": [], "errors": [], "repins": [],
        "refused_hosts": [r.to_dict() for r in candidates.closed],
        "batch": {"passes": plan.passes, "placed_first_pass": plan.greedy_placed,
                  "placed": len(plan.placed_in_order),
                  "order": [requests[i].spec.name for i in plan.placed_in_order]},
    }
    entries: dict[int, dict[str, Any]] = {}
    for host in plan.hosts:
        on_host = plan.on_host(host.name)
        refreshed = {p.guest: p for p in refresh_shared_pins(host.topology,
                                                              host.existing + [g.placement for g in on_host])}
        for before in host.existing:
            after = refreshed[before.guest]
            if after != before:
                data["repins"].append({
                    "host": host.name, "guest": after.guest,
                    "vcpupin": {str(v): sorted(c) for v, c in sorted(after.vcpupin.items())},
                    "emulatorpin": sorted(after.emulatorpin),
                })
        for guest in on_host:
            placement = refreshed[guest.spec.name]
            refusal = vet(guest.spec, host, placement)
            if refusal is not None:
                data["errors"].append(_error(requests[guest.index], [refusal]))
                continue
            xml = render_domain(guest.spec, placement, base_xml=requests[guest.index].base_xml,
                                domain_type=candidates.domain_types.get(host.name, "kvm"))
            entries[guest.index] = _entry(requests[guest.index], host, placement, xml, guest, why)
    data["placements"] = [entries[i] for i in sorted(entries)]
    for guest in plan.guests:
        if guest.host is None:
            data["errors"].append(_error(requests[guest.index], guest.refusals))
    data["errors"].sort(key=lambda e: e["index"])
    return data


def _entry(request: Any, host: Any, placement: Any, xml: str, guest: Any, why: bool) -> dict[str, Any]:
    entry = {
        "index": request.index,
        "guest": request.spec.name,
        "host": placement.host,
        "nodes": sorted({host.topology.cpus[c].node for c in placement.pcpus if c in host.topology.cpus}),
        "vcpupin": {str(v): sorted(c) for v, c in sorted(placement.vcpupin.items())},
        "emulatorpin": sorted(placement.emulatorpin),
        "memory_nodes": sorted(placement.memory_nodes),
        "mem_mode": placement.mem_mode,
        "hugepage_kib": placement.hugepage_kib,
        "threads_per_core": placement.threads_per_core,
        "score": placement.score,
        "xml": xml,
    }
    if why:
        from vmplacer.cli.plan_why import explain

        entry["why"] = explain(host, guest.scorer, guest.placement, guest.candidates, guest.occupied)
        entry["others"] = ([{"host": h, "score": s} for h, s in guest.ranking if h != guest.host]
                           + [r.to_dict() for r in guest.refusals if r.host != guest.host])
    return entry


def every_guest_refused(requests: list, candidates: Candidates) -> dict[str, Any]:
    """The plan's (and place's) answer when no candidate host takes a guest at all (maintenance):
    every guest refused with each host's reason, nothing planned."""
    names = candidates.all_names
    return {"host": names[0] if len(names) == 1 else None, "hosts": names, "placements": [],
            "errors": [_error(r, list(candidates.closed)) for r in requests], "repins": [],
            "refused_hosts": [r.to_dict() for r in candidates.closed],
            "batch": {"passes": 0, "placed_first_pass": 0, "placed": 0, "order": []}}


def _error(request: Any, refusals: list) -> dict[str, Any]:
    """A guest no candidate host took: one host's answer as it is; several, each named."""
    spec = request.spec
    xml = [r for r in refusals if r.kind in ("xml-policy", "invalid-xml")]
    kind = xml[0].kind if xml else "no-fit"
    reasons = [reason for r in refusals for reason in r.reasons]
    if len(refusals) == 1:
        only = refusals[0]
        message = (f"guest {spec.name} does not fit on host {only.host}:\n  " + only.message.replace("; ", "\n  ")
                   if only.kind in ("no-fit", "exists") else only.message)
    else:
        message = f"guest {spec.name} fits on no candidate host:\n" + "\n".join(
            f"  host {r.host}: {r.kind}: {r.message}" for r in refusals)
    return {"index": request.index, "guest": spec.name, "kind": kind, "message": message,
            "reasons": reasons, "refused": [r.to_dict() for r in refusals]}
