"""What the pages show, read through the application's services (the API's own caches and
stores; never SQL here): one row per configured host for the fleet page, the pCPU map and
the guests of one host for its page. The same dictionaries feed the templates and the JSON
the pages poll."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
import time
import zlib
from dataclasses import replace
from typing import Any, TYPE_CHECKING

from vmplacer.api.hostcache import TimedValue
from vmplacer.core.topology.cpu_map import CpuUse, cpu_layout, cpu_uses, node_free
from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.placement.guest_placement import Placement, placement_from_dict
from vmplacer.ports import HypervisorError

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices

COLOURS = 12  # guest colour classes g0..g11 in the stylesheet
PLANS_TTL_S = 10.0  # the newest plan per host, read at most this often
RECENT_PLANS = 500
RECENT_PLANS_SHOWN = 100  # the plans page lists this many, newest first
MODEL_TTL_S = 30.0
HISTORY_RUNS = 20  # a guest's page shows its newest profile runs, at most this many
GUEST_PLANS = 20  # and the newest plans that touched it
# A host that could not be read is shown unreadable this long before the fleet page reads it
# again: a daemon that does not answer costs a connection timeout, and the page refreshes itself.
UNREADABLE_TTL_S = 30.0


def colour(guest: str) -> str:
    """A stable colour class per guest name (the same on every refresh and every page)."""
    return f"g{zlib.crc32(guest.encode()) % COLOURS}"


class WebViews:
    """Built once per application; remembers each host's room while its topology and
    recorded placements stay the very same objects (the snapshot cache keeps them so), so a
    fleet of a thousand hosts costs a thousand dictionary reads per refresh, not a thousand
    allocator views."""

    def __init__(self, services: ApiServices, clock: Any = time.monotonic):
        self.services = services
        self._clock = clock
        self._unreadable: dict[str, tuple[float, str]] = {}  # host -> (when, why) of its last failed read
        self._rooms: dict[str, tuple[Any, Any, dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.newest_plans = TimedValue(self._newest_plans, PLANS_TTL_S)
        self._model = TimedValue(self._stored_model, MODEL_TTL_S)

    def _stored_model(self) -> Any:
        return self.services.container.load_model()

    # ----- the fleet ---------------------------------------------------------------------------
    def fleet_rows(self) -> list[dict[str, Any]]:
        services = self.services
        maintenance = services.dry_run_maintenance.get()
        plans = self.newest_plans.get()
        rows = []
        for name in services.host_names:
            row: dict[str, Any] = {"name": name, "state": "ok", "error": "", "nodes": [], "guests": None,
                                   "free_cores": None, "free_memory": None,
                                   "violations": services.isolation.get(name),
                                   "checked": name in services.isolation,
                                   "maintenance": maintenance[name].reason if name in maintenance else "",
                                   "last_plan": plans.get(name)}
            failed = self._unreadable.get(name)
            if failed is not None and self._clock() - failed[0] < UNREADABLE_TTL_S:
                row["state"], row["error"] = "unreadable", failed[1]
                rows.append(row)
                continue
            try:
                row.update(self._room(name))
            except HypervisorError as exc:
                row["state"], row["error"] = "unreadable", str(exc)
                self._unreadable[name] = (self._clock(), str(exc))
            else:
                self._unreadable.pop(name, None)
                if name in maintenance:
                    row["state"] = "maintenance"
            rows.append(row)
        return rows

    def _room(self, name: str) -> dict[str, Any]:
        snapshots = self.services.snapshots
        topology = snapshots.topology(name)
        placements = snapshots.recorded(name)
        cached = self._rooms.get(name)
        if cached is not None and cached[0] is topology and cached[1] is placements:
            return cached[2]
        nodes = node_free(topology, placements, self.services.container.allocation_options(name))
        room = {"nodes": [{"node": n.node, "whole_cores": n.whole_cores, "cores": n.cores,
                           "free_mib": n.free_kib // 1024, "memory_mib": n.memory_kib // 1024}
                          for n in nodes if n.cores or n.memory_kib],
                "guests": len(placements),
                "free_cores": sum(n.whole_cores for n in nodes),
                "free_memory": sum(n.free_kib for n in nodes) // 1024}
        with self._lock:
            self._rooms[name] = (topology, placements, room)
        return room

    def _newest_plans(self) -> dict[str, dict[str, Any]]:
        """host -> its newest plan that had something to do (id, state, epoch seconds)."""
        newest: dict[str, dict[str, Any]] = {}
        for plan in self.services.container.plan_store.recent(RECENT_PLANS, states=None):
            if plan["state"] == "empty":
                continue
            for host in plan["hosts"] or ():
                newest.setdefault(host, {"id": plan["id"], "state": plan["state"], "at": plan["created_at"]})
        return newest

    # ----- plans ---------------------------------------------------------------------------------
    def plans(self, limit: int = RECENT_PLANS_SHOWN) -> list[dict[str, Any]]:
        """The newest stored plans, as the API lists them."""
        return self.services.container.plan_store.recent(limit, states=None)

    def plan(self, plan_id: int) -> dict[str, Any] | None:
        """One plan as the API shows it (actions, reasons, predicted gain, outcome), each trial
        probe's outcome named: kept when it succeeded, rolled back when it was undone."""
        from vmplacer.api.routes.plans import plan_view

        plan = self.services.container.plan_store.get(plan_id)
        if plan is None:
            return None
        data = plan_view(plan)
        for action in data["actions"]:
            action["trial"] = ({"succeeded": "kept", "rolled_back": "rolled back"}.get(action["state"], "")
                               if action["kind"] == "probe" else "")
            action["pins"] = _pins_change(action)
        return data

    # ----- one host ----------------------------------------------------------------------------
    def host(self, name: str) -> dict[str, Any]:
        """The host's pCPU map and guests; raises HypervisorError when its topology cannot be read."""
        services = self.services
        topology = services.snapshots.topology(name)
        records = services.container.placement_records(name)
        placements = [_with_live_iothreads(placement_from_dict(r["placement"]), self._live_pins(name))
                      for r in records]
        uses = cpu_uses(topology, placements)
        throttles = {t.guest: t for t in services.container.throttle_ledger.current(name)}
        maintenance = services.dry_run_maintenance.get()
        guests = [_guest_row(record, placement, throttles.get(record["guest"]))
                  for record, placement in zip(records, placements)]
        return {
            "name": name,
            "state": "maintenance" if name in maintenance else "ok",
            "maintenance": maintenance[name].reason if name in maintenance else "",
            "violations": services.isolation.get(name),
            "checked": name in services.isolation,
            "summary": {"cpus": len(topology.cpus), "packages": len(topology.packages),
                        "nodes": len(topology.nodes), "smt": topology.smt,
                        "reserved": format_cpuset(topology.reserved) or "none"},
            "layout": [{"package": p.package,
                        "nodes": [{"node": n.node,
                                   "caches": [{"llc": c.llc, "cores": [list(core) for core in c.cores]}
                                              for c in n.caches]} for n in p.nodes]}
                       for p in cpu_layout(topology)],
            "cpus": {str(cpu): _cpu_cell(use) for cpu, use in uses.items()},
            "guests": guests,
        }

    # ----- one guest -----------------------------------------------------------------------------
    def guest(self, host: str, name: str) -> dict[str, Any] | None:
        """One recorded guest of `host`: its placement, its ζ/ζb history, the loss the model
        predicts from each neighbour, and the plans that touched it; None when `host` records no
        such guest. Raises HypervisorError when the host's topology cannot be read."""
        from vmplacer.core.model.view import neighbour_losses, tenant_of

        container = self.services.container
        record = container.placement_store.get(name)
        if record is None or record["host"] != host:
            return None
        topology = self.services.snapshots.topology(host)
        live = self._live_pins(host)
        records = container.placement_records(host)
        placements = {r["guest"]: _with_live_iothreads(placement_from_dict(r["placement"]), live) for r in records}
        placement = placements.get(name) or _with_live_iothreads(placement_from_dict(record["placement"]), live)
        throttles = {t.guest: t for t in container.throttle_ledger.current(host)}
        classes = {r["guest"]: (r.get("spec") or {}).get("workload_class") or "" for r in records}
        mine = tenant_of(topology, placement, classes.get(name, ""))
        others = [t for g, p in sorted(placements.items()) if g != name
                  for t in [tenant_of(topology, p, classes.get(g, ""))] if t is not None]
        model = self.model()
        predicted = neighbour_losses(model, topology, mine, others) if mine is not None else None
        return {
            "host": host,
            "row": _guest_row(record, placement, throttles.get(name)),
            "placement": {
                "vcpus": [{"vcpu": v, "cpus": format_cpuset(c)} for v, c in sorted(placement.vcpupin.items())],
                "emulatorpin": format_cpuset(placement.emulatorpin) or "floats (not pinned)",
                "iothreads": [{"iothread": i, "cpus": format_cpuset(c)} for i, c in sorted(placement.iothreadpin.items())],
                "memory_nodes": format_cpuset(placement.memory_nodes) or "any",
                "mem_mode": placement.mem_mode,
                "memory_mib": placement.memory_kib // 1024,
                "hugepage_kib": placement.hugepage_kib,
                "cells": [{"id": c.id, "vcpus": format_cpuset(c.vcpus), "memory_mib": c.memory_kib // 1024,
                           "host_node": c.host_node, "memory_node": c.memory_node} for c in placement.cells],
                "exclusive": format_cpuset(placement.exclusive_cpus),
            },
            "history": [_history_row(h) for h in container.profile_store.guest_history(name, HISTORY_RUNS)],
            "predicted": predicted,
            "model_observations": model.observations,
            "plans": container.plan_store.touching(name, GUEST_PLANS),
        }

    # ----- the model -----------------------------------------------------------------------------
    def model(self) -> Any:
        """The learned interference model, read at most every MODEL_TTL_S (it changes when
        `vmplacer model learn` runs, not per page view)."""
        return self._model.get()

    def model_tables(self) -> dict[str, Any]:
        from vmplacer.core.model.view import coefficient_tables

        info = self.services.container.model_repository.info() or {"name": "default", "observations": 0,
                                                                  "last_run_id": None, "updated_at": None}
        updated = info.get("updated_at")
        if isinstance(updated, str):  # the repository's ISO text (naive from SQLite: it stores UTC)
            moment = datetime.fromisoformat(updated)
            info = {**info, "updated_at": (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()}
        return {"info": info, **coefficient_tables(self.model())}

    def _live_pins(self, name: str) -> dict[str, Placement]:
        """Each defined domain's live placement (IOThread pins are never recorded); nothing when
        the domain list cannot be read now."""
        try:
            domains = self.services.snapshots.domains(name)
        except HypervisorError:
            return {}
        return {d.name: d.placement for d in domains if d.placement is not None}


def _with_live_iothreads(placement: Placement, live: dict[str, Placement]) -> Placement:
    found = live.get(placement.guest)
    if found is None or not found.iothreadpin:
        return placement
    return replace(placement, iothreadpin=found.iothreadpin)


def _pins_change(action: dict[str, Any]) -> str:
    """"0→2 1→3 ⇒ 0→4 1→5": an action's vCPU pins before and after, when it moves any."""
    def pins(placement: dict[str, Any] | None) -> str:
        if not placement:
            return ""
        return " ".join(f"{v}→{format_cpuset(c)}" for v, c in sorted(placement["vcpupin"].items(), key=lambda kv: int(kv[0])))

    before, after = pins(action.get("before")), pins(action.get("after"))
    return f"{before} ⇒ {after}" if before != after else before


def _history_row(entry: dict[str, Any]) -> dict[str, Any]:
    """One profile run's ζ/ζb summary of a guest: medians, degradation (1 − ζ/ζb) and its 95 %
    interval, the sample counts; None where the run reported no value."""
    summary = entry.get("summary") or {}
    zeta, zeta_b, loss = summary.get("zeta") or {}, summary.get("zeta_b") or {}, summary.get("degradation") or {}
    return {"run_id": entry["run_id"], "host": entry["host"], "metric": entry["metric"],
            "finished_at": entry["finished_at"],
            "zeta": zeta.get("p50"), "zeta_n": zeta.get("n", 0), "zeta_b": zeta_b.get("p50"),
            "zeta_b_n": zeta_b.get("n", 0), "degradation": loss.get("estimate"),
            "ci_low": loss.get("ci95_low"), "ci_high": loss.get("ci95_high")}


def _cpu_cell(use: CpuUse) -> dict[str, Any]:
    marks = []
    if use.emulator:
        marks.append("emu")
    if use.iothreads:
        marks.append("io")
    if use.reserved:
        marks.append("host")
    owner = use.exclusive or (use.floating[0] if len(use.floating) == 1 else None)
    return {"kind": use.kind, "guests": list(use.guests), "title": use.describe(), "marks": " ".join(marks),
            "colour": colour(owner) if owner else ""}


def _guest_row(record: dict[str, Any], placement: Placement, throttle: Any) -> dict[str, Any]:
    spec = record.get("spec") or {}
    labels = spec.get("labels") or {}
    return {
        "name": record["guest"],
        "state": record["state"],
        "class": spec.get("workload_class") or "",
        "labels": [f"{k}={v}" for k, v in sorted(labels.items())],
        "kind": "dedicated" if placement.dedicated or placement.exclusive_cpus else "shared",
        "vcpupin": " ".join(f"{v}→{format_cpuset(c)}" for v, c in sorted(placement.vcpupin.items())),
        "emulatorpin": format_cpuset(placement.emulatorpin),
        "iothreadpin": " ".join(f"{i}→{format_cpuset(c)}" for i, c in sorted(placement.iothreadpin.items())),
        "memory_nodes": format_cpuset(placement.memory_nodes),
        "throttle": _throttle_text(throttle),
        "colour": colour(record["guest"]),
    }


def _throttle_text(throttle: Any) -> str:
    if throttle is None:
        return ""
    bandwidth = throttle.bandwidth
    return (f"{bandwidth.vcpu_quota_us}/{bandwidth.vcpu_period_us} µs per vCPU "
            f"(protects {throttle.protects})")
