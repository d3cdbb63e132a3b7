"""What the pages show, read through the application's services (the API's own caches and
stores; never SQL here): one row per configured host for the fleet page, the pCPU map and
the guests of one host for its page. The same dictionaries feed the templates and the JSON
the pages poll."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
import time
from dataclasses import replace
from typing import Any, TYPE_CHECKING

from vmplacer.api.hostcache import TimedValue
from vmplacer.core.topology.cpu_map import KINDS, CpuUse, cpu_layout, cpu_uses, node_free
from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.placement.guest_placement import Placement, placement_from_dict
from vmplacer.ports import HypervisorError
from vmplacer.web import hostmap
from vmplacer.web.disruption import plan_disruption
from vmplacer.web.memory import node_memory

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices

PLANS_TTL_S = 10.0  # the newest plan per host, read at most this often
RECENT_PLANS = 500
RECENT_PLANS_SHOWN = 100  # the plans page lists this many, newest first
MODEL_TTL_S = 30.0
HISTORY_RUNS = 20  # a guest's page shows its newest profile runs, at most this many
GUEST_PLANS = 20  # and the newest plans that touched it
# A host that could not be read is shown unreadable this long before the fleet page reads it
# again: a daemon that does not answer costs a connection timeout, and the page refreshes itself.
UNREADABLE_TTL_S = 30.0


class WebViews:
    """Built once per application; remembers each host's room while its topology and
    recorded placements stay the very same objects (the snapshot cache keeps them so), so a
    fleet of a thousand hosts costs a thousand dictionary reads per refresh, not a thousand
    allocator views."""

    def __init__(self, services: ApiServices, clock: Any = time.monotonic, wall: Any = time.time):
        self.services = services
        self._clock = clock
        self._wall = wall  # epoch seconds: the hour a guest's moves are counted over
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
        """host -> its newest plan that had something to do (id, state, epoch seconds, and the
        predicted gain of the whole plan in guest-equivalents: what the fleet page shows)."""
        newest: dict[str, dict[str, Any]] = {}
        for plan in self.services.container.plan_store.recent(RECENT_PLANS, states=None):
            if plan["state"] == "empty":
                continue
            for host in plan["hosts"] or ():
                newest.setdefault(host, {"id": plan["id"], "state": plan["state"], "at": plan["created_at"],
                                         "gain": plan["predicted_gain"]})
        return newest

    def placed_guests(self) -> list[tuple[str, str]]:
        """(guest, host) of every placement recorded on a configured host, as the fleet page
        reads them (the snapshot cache's records: no hypervisor is asked)."""
        services = self.services
        return [(placement.guest, name) for name in services.host_names
                for placement in services.snapshots.recorded(name)]

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
        data["disruption"] = plan_disruption(plan.settings)
        return data

    # ----- one host ----------------------------------------------------------------------------
    def host(self, name: str) -> dict[str, Any]:
        """The host's pCPU map, its guests (every defined domain, placed here or not) and its
        isolation violations; raises HypervisorError when its topology cannot be read."""
        services = self.services
        topology = services.snapshots.topology(name)
        records = services.container.placement_records(name)
        domains = self._domains(name)
        live = {d.name: d.placement for d in domains or () if d.placement is not None}
        placements = [_with_live_iothreads(placement_from_dict(r["placement"]), live) for r in records]
        recorded = {r["guest"] for r in records}
        outsiders = [d for d in domains or () if d.name not in recorded]
        drawn = placements + [d.placement for d in outsiders if d.placement is not None]
        uses = cpu_uses(topology, drawn)
        order = hostmap.colour_order(uses, [p.guest for p in drawn] + [d.name for d in outsiders])
        colour_of, short = hostmap.colours(order), hostmap.short_names(order)
        index = {g: i for i, g in enumerate(order)}
        found = self._violations(name, topology, records, domains)
        violated = hostmap.violated_cpus(found or ())
        throttles = {t.guest: t for t in services.container.throttle_ledger.current(name)}
        maintenance = services.dry_run_maintenance.get()
        guests = [_guest_row(record, placement, throttles.get(record["guest"]))
                  for record, placement in zip(records, placements)]
        guests += [_outsider_row(d) for d in outsiders]
        for row in guests:
            row.update(colour=colour_of.get(row["name"], ""), short=short.get(row["name"], ""),
                       ix=index.get(row["name"], -1))
        guests.sort(key=lambda row: row["ix"])
        violations = len(found) if found is not None else services.isolation.get(name)
        cells = {str(cpu): hostmap.cpu_cell(use, colour_of, short, index, violated.get(cpu, ()))
                 for cpu, use in uses.items()}
        return {
            "name": name,
            "state": "maintenance" if name in maintenance else "ok",
            "maintenance": maintenance[name].reason if name in maintenance else "",
            "violations": violations,
            "violation_list": hostmap.violation_rows(found or ()),
            "checked": found is not None or name in services.isolation,
            "compact": len(topology.cpus) > hostmap.COMPACT_CPUS,
            "summary": {"cpus": len(topology.cpus), "packages": len(topology.packages),
                        "nodes": len(topology.nodes), "smt": topology.smt,
                        "reserved": format_cpuset(topology.reserved) or "none"},
            "node_summary": _node_summary(topology, uses, violated),
            "memory": node_memory(topology, services.snapshots.recorded(name),
                                  services.container.allocation_options(name)),
            "layout": [{"package": p.package,
                        "nodes": [{"node": n.node,
                                   "caches": [{"llc": c.llc, "cores": [list(core) for core in c.cores]}
                                              for c in n.caches]} for n in p.nodes]}
                       for p in cpu_layout(topology)],
            "cpus": cells,
            "legend": hostmap.legend(cells.values()),
            "guests": guests,
        }

    def _domains(self, name: str) -> list[Any] | None:
        """The host's defined domains now; None when they cannot be read."""
        try:
            return list(self.services.snapshots.domains(name))
        except HypervisorError:
            return None

    def _violations(self, name: str, topology: Any, records: list[dict[str, Any]],
                    domains: list[Any] | None) -> list[Any] | None:
        """The isolation invariant on the host as it runs, judged as `serve`'s periodic check
        judges it (live pins of every domain, and reservations not yet defined); None when the
        domains cannot be read."""
        if domains is None:
            return None
        from vmplacer.core.placement.isolation import isolation_violations

        defined = {d.name for d in domains}
        layout = [d.placement for d in domains if d.placement is not None]
        layout += [placement_from_dict(r["placement"]) for r in records
                   if r["guest"] not in defined and r["state"] == "planned"]
        emulator_cpus = self.services.container.allocation_options(name).emulator_cpus
        return isolation_violations(topology, layout, emulator_cpus=emulator_cpus)

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
        row = _guest_row(record, placement, throttles.get(name))
        row["colour"] = next((g["colour"] for g in self.host(host)["guests"] if g["name"] == name), "")
        return {
            "host": host,
            "row": row,
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
            "moves": self._moves_this_hour(name),
        }

    def _moves_this_hour(self, name: str) -> dict[str, Any]:
        """The guest's moves in the last hour, counted as the planner and the executor count them
        (every process's stored plans; an undone move twice), against the configured
        `max_moves_per_guest_hour` (0: no limit). One grouped query over the hour's moves."""
        from vmplacer.app.apply.move_budget import SETTING, WINDOW_S

        since = self._wall() - WINDOW_S
        moves = self.services.container.plan_store.moves_since([name], since).get(name, 0)
        limit = self.services.container.settings.rebalance.max_moves_per_guest_hour
        return {"count": moves, "limit": limit, "setting": SETTING, "since": since,
                "at_limit": 0 < limit <= moves}

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


def _node_summary(topology: Any, uses: dict[int, CpuUse], violated: dict[int, list[str]]) -> list[dict[str, Any]]:
    """Per NUMA node: how many of its pCPUs are of each kind, and how many carry a violation
    (what a large map's reader wants before the boxes)."""
    nodes: dict[int, dict[str, Any]] = {}
    for cpu, use in uses.items():
        row = nodes.setdefault(use.node, {"node": use.node, "cpus": 0, "violated": 0, "guests": set(),
                                          **{kind: 0 for kind in KINDS}})
        row["cpus"] += 1
        row[use.kind] += 1
        row["violated"] += cpu in violated
        row["guests"].update(use.guests)
    return [{**row, "guests": len(row["guests"])} for _, row in sorted(nodes.items())]


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
        "colour": "",
        "placed": True,
    }


def _outsider_row(domain: Any) -> dict[str, Any]:
    """A defined domain that no placement record names: shown so "free" does not mislead."""
    placement = domain.placement
    return {
        "name": domain.name,
        "state": f"{domain.state}, not placed by vmplacer",
        "class": "",
        "labels": [],
        "kind": "unmanaged",
        "vcpupin": " ".join(f"{v}→{format_cpuset(c) or 'any'}" for v, c in sorted(placement.vcpupin.items()))
        if placement is not None else "",
        "emulatorpin": (format_cpuset(placement.emulatorpin) or "any") if placement is not None else "",
        "iothreadpin": " ".join(f"{i}→{format_cpuset(c)}" for i, c in sorted(placement.iothreadpin.items()))
        if placement is not None else "",
        "memory_nodes": format_cpuset(placement.memory_nodes) if placement is not None else "",
        "throttle": "",
        "colour": "",
        "placed": False,
    }


def _throttle_text(throttle: Any) -> str:
    if throttle is None:
        return ""
    bandwidth = throttle.bandwidth
    return (f"{bandwidth.vcpu_quota_us}/{bandwidth.vcpu_period_us} µs per vCPU "
            f"(protects {throttle.protects})")
