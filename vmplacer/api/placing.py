"""Placement requests: pick the host, plan or place, and say why when nothing fits.

Host choice is the application's (app/place/fleet_placement.py); this module maps its
answers and errors to HTTP.

- dry run: every candidate host is planned on its snapshot (see hostcache), the
  best score wins; nothing is written.
- place: candidates are tried best first, live, never over a domain of the same name: the placement service takes
  the host's lock, claims the exclusive pCPUs in the database (a unique key,
  so no pCPU is ever double-booked, whatever other instances do), then defines
  (and starts) the domain. `define=false` stops after the claim: the pCPUs are
  reserved and the caller defines the domain from the returned XML.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, TYPE_CHECKING

from vmplacer.adapters.domain_xml import DomainXmlError, parse_domain
from vmplacer.adapters.libvirt_errors import INVALID, DomainRefused
from vmplacer.api.errors import ApiError, field_problems
from vmplacer.api.times import with_api_times
from vmplacer.app.place.fleet_placement import FleetPlacement, NothingFits
from vmplacer.app.place.placement_service import PlaceResult
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.nofit import NoFit
from vmplacer.ports import HypervisorError

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices

# Hosts leave maintenance at an operator's pace: a client polling faster learns nothing.
NO_HOSTS_RETRY = {"Retry-After": "60"}


def check_base_xml(text: str | None, guest: str) -> str | None:
    """A caller's domain XML, parsed safely (no DTD, no entities); 422 naming the field otherwise.
    What it may ask of a host is each host's domain XML policy (api/xml_policy.py)."""
    if text is None:
        return None
    try:
        parse_domain(text, f"base_xml of guest {guest}")
    except DomainXmlError as exc:
        raise ApiError(422, "invalid-xml", str(exc), field_problems([("base_xml", str(exc))])) from None
    return text


@dataclass
class Outcome:
    result: PlaceResult
    host: str
    dry_run: bool
    candidates: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "guest": self.result.placement.guest,
            "host": self.host,
            "state": self.result.state,
            "dry_run": self.dry_run,
            "placement": self.result.placement.to_dict(),
            "xml": self.result.xml,
            "domain_uuid": self.result.domain_uuid,
            "narrowed": list(self.result.narrowed),
            "narrowed_pins": self.result.narrowed_pins(),
            "isolation_violations": [v.to_dict() for v in self.result.violations],
            "candidates": self.candidates,
        }


class Placer:
    def __init__(self, services: ApiServices, service: Any = None):
        """`service`: the placement service to place through (one auditing as the caller);
        default the shared one."""
        self.services = services
        self.service = service if service is not None else services.placement
        self.metrics = services.metrics

    def configured(self, host: str | None) -> str:
        """The configured host a request names (422 otherwise), or the first one."""
        names = self.services.host_names
        if host is None:
            if not names:
                raise ApiError(503, "no-hosts", "no hosts are configured", None, NO_HOSTS_RETRY)
            return names[0]
        if host not in names:
            reason = f"host {host!r} is not configured (configured: {', '.join(names)})"
            raise ApiError(422, "validation", reason, field_problems([("host", reason)], "not_configured"))
        return host

    def candidates(self, host: str | None, *, dry_run: bool = False, batched: bool = False) -> list[str]:
        """The hosts a new guest may land on: the one the request names, else every
        configured host that is not in maintenance (a host in maintenance takes no new guest).
        A dry run reads maintenance from a short cache (see hostcache), and so does a definition
        (`batched`: its batch reads it live once before claiming, `admit_host`); a
        reservation reads it live."""
        names = self.services.host_names
        if host is not None:
            self.configured(host)
        closed = (self.services.dry_run_maintenance.get() if dry_run or batched
                  else self.services.container.maintenance.current())
        if host is not None:
            if host in closed:
                raise in_maintenance(host, closed[host])
            return [host]
        if not names:
            raise ApiError(503, "no-hosts", "no hosts are configured", None, NO_HOSTS_RETRY)
        usable = [name for name in names if name not in closed]
        if not usable:
            raise ApiError(503, "no-hosts", "every configured host is in maintenance: "
                           + "; ".join(closed[n].describe() for n in names),
                           {"hosts": {n: _maintenance(closed[n]) for n in names}}, NO_HOSTS_RETRY)
        return usable

    def _fleet(self) -> FleetPlacement:
        """Dry runs on the API's short-lived host snapshots, placements live; every placement
        drops its host's snapshot, and libvirt errors are counted."""
        services = self.services
        return FleetPlacement(services.dry_runs, services.snapshots.view, services.container.hypervisor,
                              on_libvirt_error=services.metrics.libvirt_error,
                              invalidate=services.snapshots.invalidate, refusals=(DomainRefused,),
                              memo=services.survey_memo, changes=services.snapshots.changes)

    # ----- dry run ---------------------------------------------------------------------------------
    def plan(self, spec: GuestSpec, hosts: list[str], base_xml: str | None) -> Outcome:
        """A dry run answers as the placement itself would, a name already placed included (read,
        like the rest of a dry run, from the hosts' short-lived snapshots: api/hostcache.py)."""
        started = time.perf_counter()
        self._refuse_placed(spec, hosts, "dry_run")
        try:
            choice = self._fleet().plan(spec, hosts, base_xml)
        except NothingFits as exc:
            self._count(hosts, "dry_run", exc.failures)
            raise self._nothing_fits(spec, exc.failures, exc.report) from None
        finally:
            self.metrics.placement_latency.labels("dry_run").observe(time.perf_counter() - started)
        self.metrics.placements.labels(choice.host, "dry_run", "planned").inc()
        return Outcome(choice.result, choice.host, True, choice.report)

    def _refuse_placed(self, spec: GuestSpec, hosts: list[str], mode: str) -> None:
        """From the hosts' snapshots (no query): a name placed through another instance in the last
        second gets past this, and the placement service's own check in the database refuses it."""
        snapshots = self.services.snapshots
        if any(p.guest == spec.name for host in self.services.host_names for p in snapshots.recorded(host)):
            self._exists(spec, hosts, mode)

    def _exists(self, spec: GuestSpec, hosts: list[str], mode: str) -> None:
        self.metrics.placements.labels(hosts[0] if len(hosts) == 1 else "any", mode, "exists").inc()
        raise ApiError(409, "exists", f"guest {spec.name} is already placed "
                       f"(DELETE /v1/placements/{spec.name} first)", {"guest": spec.name})

    # ----- placing -----------------------------------------------------------------------------------
    def place(self, spec: GuestSpec, hosts: list[str], base_xml: str | None, *, define: bool, start: bool,
              actor: dict[str, Any]) -> Outcome:
        mode = "define" if define else "reserve"
        started = time.perf_counter()
        if not define and self.service.is_placed(spec.name):  # one indexed read: the snapshots lag behind writes
            self._exists(spec, hosts, mode)
        # a definition asks the store once per batch of placements that arrived together (the
        # placement service's group commit): a name already placed is refused there, by every host

        def record(host: str, outcome: str) -> None:
            self.metrics.placements.labels(host, mode, outcome).inc()

        try:
            choice = self._fleet().place(spec, hosts, base_xml, service=self.service, define=define,
                                         start=start, actor=actor, record=record)
        except DomainRefused as exc:
            raise _blame(exc, base_xml) from None
        except NothingFits as exc:
            if exc.failures and all(isinstance(e, NoFit) and e.reasons and all(r.constraint == "name"
                                    for r in e.reasons) for _, e in exc.failures) and (
                    all(r.where == "fleet" for _, e in exc.failures for r in e.reasons)  # type: ignore[attr-defined]
                    or self.service.is_placed(spec.name)):
                self._exists(spec, hosts, mode)  # on record (its domain too, maybe): placed already
            self._count(hosts, mode, exc.failures)
            raise self._nothing_fits(spec, exc.failures, exc.report) from None
        finally:
            self.metrics.placement_latency.labels(mode).observe(time.perf_counter() - started)
        return Outcome(choice.result, choice.host, False, choice.report)

    def _count(self, hosts: list[str], mode: str, failures: list[tuple[str, Exception]]) -> None:
        for name, exc in failures:
            self.metrics.placements.labels(name, mode, "no_fit" if isinstance(exc, NoFit) else "error").inc()

    def _nothing_fits(self, spec: GuestSpec, failures: list[tuple[str, Exception]],
                      report: list[dict[str, Any]]) -> Exception:
        unreachable = [(h, e) for h, e in failures if isinstance(e, HypervisorError)]
        if len(failures) == 1:
            return failures[0][1]  # the handlers answer 409 (NoFit) or 502/503 (libvirt), naming the host
        if failures and len(unreachable) == len(failures):
            names = ", ".join(h for h, _ in unreachable)
            return ApiError(503, "host-unavailable", f"guest {spec.name}: no host answered ({names})",
                            {"hosts": [{"host": h, "error": str(e)} for h, e in unreachable]},
                            {"Retry-After": "5"})
        lines = [f"guest {spec.name} fits on no configured host:"]
        for name, exc in failures:
            lines.append(f"  host {name}: " + ("; ".join(str(r) for r in exc.reasons)
                                               if isinstance(exc, NoFit) else str(exc)))
        return ApiError(409, "no-fit", "\n".join(lines), {
            "guest": spec.name, "host": None, "reasons": [],
            "candidates": [{"host": h, "reasons": [r.to_dict() for r in e.reasons]} if isinstance(e, NoFit)
                           else {"host": h, "error": str(e)} for h, e in failures]})


def in_maintenance(host: str, record: Any) -> ApiError:
    return ApiError(409, "host-in-maintenance", record.describe() + ": it takes no new guest",
                    {"host": host, "maintenance": _maintenance(record)})


def _maintenance(record: Any) -> dict[str, Any]:
    return with_api_times(record.to_dict(), "since")


def admit_host(services: ApiServices) -> Callable[[str], None]:
    """The live maintenance check a batch of placements makes once, on its host, before it
    claims anything (409 host-in-maintenance for every guest of the batch)."""

    def admit(host: str) -> None:
        record = services.container.maintenance.current().get(host)
        if record is not None:
            services.dry_run_maintenance.invalidate()  # the cache lags: host choice reads anew
            raise in_maintenance(host, record)

    return admit


def _blame(exc: DomainRefused, base_xml: str | None) -> HypervisorError:
    """A refusal of the caller's XML stays the caller's (4xx); of vmplacer's own skeleton,
    it is the host's (e.g. a domain type it does not offer): 502."""
    if exc.reason == INVALID and base_xml is None:
        return HypervisorError(str(exc), host=exc.host, domain=exc.domain, retriable=False)
    return exc
