"""One observe: every planning path reads a host through `take_snapshot`, and a snapshot
costs one topology read and one domain read (the API's cache serving repeats)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from vmplacer.api.hostcache import HostSnapshots, SnapshotStore
from vmplacer.app.observe import host_snapshot
from vmplacer.app.place import fleet_placement, placement_service
from vmplacer.app.rebalance import rebalancer as rebalance
from vmplacer.app.place.fleet_placement import FleetPlacement, observe_host
from vmplacer.app.observe.host_snapshot import HostSnapshot, take_snapshot
from vmplacer.app.place.placement_service import PlacementService
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.admit import AllocationOptions
from vmplacer.core.topology.host import uniform_topology
from vmplacer.ports import DomainGone, DomainInfo


class _CountingHost:
    """A host with one pinned running guest and one floating (unpinned) guest, counting reads."""

    def __init__(self, name: str = "h1") -> None:
        self.name, self.uri = name, f"test:///{name}"
        self.reads = {"topology": 0, "domains": 0}
        self._topology = uniform_topology(nodes=1, cores_per_node=8, threads_per_core=1,
                                          memory_mib_per_node=16384, name=name)
        pinned = Placement(guest="pinned", host=name, vcpupin={0: frozenset({0})}, memory_kib=1024 * 1024,
                           dedicated=True, exclusive_cpus=frozenset({0}))
        self._domains = [
            DomainInfo("pinned", "u-1", "running", None, 1, 1024 * 1024, pinned, {"workload_class": "noisy"}),
            DomainInfo("floater", "u-2", "shutoff", None, 2, 512 * 1024, None, {}),
        ]
        self.defined: dict[str, str] = {}

    def topology(self):  # type: ignore[no-untyped-def]
        self.reads["topology"] += 1
        return self._topology

    def domains(self) -> list[DomainInfo]:
        self.reads["domains"] += 1
        return list(self._domains)

    def domain_state(self, name: str) -> tuple[str, str | None]:
        if name not in self.defined:
            raise DomainGone(name)
        return "shutoff", None

    def define(self, xml: str, name: str = "") -> str:
        self.defined[name] = xml
        return f"uuid-{name}"


class _Store:
    def __init__(self, recorded: list[Placement] | None = None) -> None:
        self.recorded = list(recorded or [])
        self.reads = 0

    def occupied(self, host: str) -> list[Placement]:
        self.reads += 1
        return [p for p in self.recorded if p.host == host]

    def occupied_and_refusals(self, host: str) -> tuple[list[Placement], dict[str, tuple[str, ...]]]:
        return self.occupied(host), {}

    def every_host_occupied_and_refusals(self) -> dict[str, tuple[list[Placement], dict[str, tuple[str, ...]]]]:
        self.reads += 1
        return {host: ([p for p in self.recorded if p.host == host], {}) for host in {p.host for p in self.recorded}}

    def records(self, host: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(guest=p.guest, state="planned") for p in self.recorded if p.host == host]

    def record(self, host: str, uri: str, placement: Placement, spec: dict) -> None:
        self.recorded.append(placement)

    def set_state(self, *args: Any, **kwargs: Any) -> None:
        pass

    def forget(self, guest: str) -> None:
        self.recorded = [p for p in self.recorded if p.guest != guest]

    def update_pins(self, placements: list[Placement]) -> list[str]:
        now = {p.guest: p for p in placements}
        self.recorded = [now.get(p.guest, p) for p in self.recorded]
        return sorted(now.keys() & {p.guest for p in self.recorded})

    def get(self, guest: str) -> Placement | None:
        return next((p for p in self.recorded if p.guest == guest), None)

    def audit(self, **entry: Any) -> None:
        pass


def _never() -> dict:
    raise AssertionError("placements without domain states read where the listing is needed")


def _reserved(guest: str = "claimed", cpu: int = 1) -> Placement:
    return Placement(guest=guest, host="h1", vcpupin={0: frozenset({cpu})}, memory_kib=1024 * 1024,
                     dedicated=True, exclusive_cpus=frozenset({cpu}))


def _spec(name: str = "new") -> GuestSpec:
    return GuestSpec.from_mapping({"name": name, "vcpus": 2, "memory_mib": 1024, "cpu_policy": "dedicated"})


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[HostSnapshot]:
    """Every snapshot any path takes, through the one function each module imported."""
    seen: list[HostSnapshot] = []

    def spy(*args: Any, **kwargs: Any) -> HostSnapshot:
        snapshot = take_snapshot(*args, **kwargs)
        seen.append(snapshot)
        return snapshot

    for module in (placement_service, fleet_placement, rebalance, host_snapshot):  # the CLI imports it when it runs
        monkeypatch.setattr(module, "take_snapshot", spy)
    return seen


def test_a_snapshot_reads_topology_and_domains_once_and_adds_what_is_only_recorded():
    host = _CountingHost()
    store = _Store([_reserved(), _reserved("pinned", 3), _reserved("claimed", 6)])
    snapshot = take_snapshot(host, store, listing=True)
    assert host.reads == {"topology": 1, "domains": 1} and store.reads == 1
    assert [p.guest for p in snapshot.placements] == ["pinned", "floater", "claimed"]
    assert snapshot.live["pinned"].vcpupin == {0: frozenset({0})}  # libvirt's view wins over a record
    assert snapshot.live["floater"].vcpupin == {0: frozenset(), 1: frozenset()}  # floats anywhere
    assert snapshot.recorded == (_reserved(),)  # the first record of a guest wins
    assert snapshot.names == {"pinned", "floater", "claimed"}
    assert snapshot.profiles["pinned"].workload_class == "noisy"
    assert [d.name for d in snapshot.domains or ()] == ["pinned", "floater"]


def test_a_host_offering_the_cheaper_read_is_read_so_unless_the_listing_is_asked_for():
    host = _CountingHost()
    read = {"pinned": (host._domains[0].placement, {"workload_class": "noisy"})}
    host.labelled_placements = lambda: read  # type: ignore[attr-defined]
    cheap = take_snapshot(host)
    assert host.reads == {"topology": 1, "domains": 0}
    assert list(cheap.live) == ["pinned"] and cheap.domains is None
    assert cheap.profiles["pinned"].workload_class == "noisy"
    listed = take_snapshot(host, listing=True)
    assert host.reads == {"topology": 2, "domains": 1} and len(listed.domains or ()) == 2


def test_placing_and_dry_runs_take_one_snapshot_each(taken: list[HostSnapshot]):
    host, store = _CountingHost(), _Store([_reserved()])
    service = PlacementService(store, lambda spec, placement, base: f"<domain>{spec.name}</domain>")
    planned = service.plan(host, _spec())
    assert len(taken) == 1 and host.reads == {"topology": 1, "domains": 1}
    assert not set().union(*planned.placement.vcpupin.values()) & {0, 1}  # the domain and the record count
    service.place(host, _spec("placed"))
    assert len(taken) == 2 and host.reads == {"topology": 2, "domains": 2}
    assert "placed" in host.defined


def test_fleet_choice_and_the_batch_view_take_one_snapshot_per_host(taken: list[HostSnapshot]):
    hosts = {name: _CountingHost(name) for name in ("h1", "h2")}
    service = PlacementService(_Store(), lambda spec, placement, base: "<domain/>")
    fleet = FleetPlacement(service, hosts.__getitem__, hosts.__getitem__)
    fleet.plan(_spec(), ["h1", "h2"], None)
    assert len(taken) == 2 and all(h.reads == {"topology": 1, "domains": 1} for h in hosts.values())

    view = observe_host(hosts["h1"], AllocationOptions(), store=_Store([_reserved()]))
    assert len(taken) == 3 and hosts["h1"].reads == {"topology": 2, "domains": 2}
    assert view.domains == {"pinned", "floater", "claimed"} and len(view.existing) == 3


def test_the_cli_observes_candidates_through_the_same_snapshot(taken: list[HostSnapshot]):
    from vmplacer.cli.fleet_hosts import Candidates, observe

    hosts = {name: _CountingHost(name) for name in ("h1", "h2")}
    store = _Store([_reserved()])
    container = SimpleNamespace(hypervisor=hosts.__getitem__, placement_store=store,
                                allocation_options=lambda _name: AllocationOptions(), admission=None,
                                database_has=lambda _table: True)
    settings = SimpleNamespace(rebalance=RebalanceSettings())
    candidates = Candidates(["h1", "h2"])
    views = observe(SimpleNamespace(container=container, settings=settings), candidates)
    assert store.reads == 1, "every host's records come from one grouped read"
    assert candidates.stale == [], "a reservation being defined is not a stale record"
    assert len(taken) == 2 and [v.name for v in views] == ["h1", "h2"]
    assert all(h.reads == {"topology": 1, "domains": 1} for h in hosts.values())
    assert "claimed" in views[0].domains and "claimed" not in views[1].domains


def test_the_rebalancer_observes_each_host_through_one_snapshot(taken: list[HostSnapshot]):
    hosts = {name: _CountingHost(name) for name in ("h1", "h2")}
    for host in hosts.values():  # the cheaper read has no domain states: the rebalancer needs them
        host.labelled_placements = _never  # type: ignore[attr-defined]
    run = Rebalancer(RebalancePorts(hosts=hosts, plans=None, leases=None, clock=None))  # type: ignore[arg-type]
    observed = run.observe(["h1", "h2"])
    assert len(taken) == 2 and all(h.reads == {"topology": 1, "domains": 1} for h in hosts.values())
    assert set(observed.state.hosts) == {"h1", "h2"}
    # running guests are described on top of the snapshots; the stopped floater is none of them,
    # and a guest running on both hosts is seen on both
    assert set(observed.state.guests) == {"pinned"}
    assert any("running on both h1 and h2" in note for note in observed.notes)


def test_the_api_cache_serves_repeated_snapshots_from_one_read(taken: list[HostSnapshot]):
    host, store = _CountingHost(), _Store([_reserved()])
    snapshots = HostSnapshots(lambda _name: host, lambda name: (store.occupied(name), {}))
    dry_runs = PlacementService(SnapshotStore(snapshots), lambda spec, placement, base: "<domain/>")
    fleet = FleetPlacement(dry_runs, snapshots.view, lambda _name: host, invalidate=snapshots.invalidate)
    for _ in range(3):
        fleet.plan(_spec(), ["h1"], None)
    assert len(taken) == 3  # a snapshot per dry run ...
    assert host.reads == {"topology": 1, "domains": 1} and store.reads == 1  # ... from one read of each part
    snapshots.invalidate("h1")  # a placement touched the host: its domains and records are read anew
    fleet.plan(_spec(), ["h1"], None)
    assert host.reads == {"topology": 1, "domains": 2} and store.reads == 2


def test_a_remembered_room_follows_the_read_its_snapshot_is_made_of():
    """A cached host offering the placements' read is read so for dry runs too (as a placement
    reads it): the room host choice remembers is keyed by that read, never by the full
    listing (three libvirt calls a domain), so a new domain the refresher found changes it."""
    host, store = _CountingHost(), _Store()
    live = {"pinned": (host._domains[0].placement, {"workload_class": "noisy"})}
    placings: list[int] = []

    def labelled_placements() -> dict[str, tuple[Placement, dict[str, str]]]:
        placings.append(1)
        return dict(live)

    host.labelled_placements = labelled_placements  # type: ignore[attr-defined]
    clock = [0.0]
    snapshots = HostSnapshots(lambda _name: host, lambda name: (store.occupied(name), {}), clock=lambda: clock[0])
    dry_runs = PlacementService(SnapshotStore(snapshots), lambda spec, placement, base: "<domain/>")
    view, room = dry_runs.room(snapshots.view("h1"))
    assert dry_runs.room(snapshots.view("h1")) == (view, room) and len(placings) == 1
    assert set(view.live) == {"pinned"} and host.reads["domains"] == 0
    live["newcomer"] = (Placement(guest="newcomer", host="h1", vcpupin={0: frozenset({5})}, memory_kib=1024,
                                  dedicated=True, exclusive_cpus=frozenset({5})), {})
    clock[0] += 10.0  # the host's placements are due again (the refresher's next read)
    after, smaller = dry_runs.room(snapshots.view("h1"))
    assert len(placings) == 2 and set(after.live) == {"pinned", "newcomer"} and smaller != room
    assert host.reads["domains"] == 0


def test_a_snapshot_binds_the_refusals_domains_declare_and_those_on_record_together():
    """A domain's declared anti-affinity counts with no record of it (a restored database, a
    second deployment); with a record too, both rules bind, each peer once."""
    from vmplacer.app.observe.host_snapshot import joined_refusals

    host = _CountingHost()
    pinned = host._domains[0]
    host._domains[0] = DomainInfo(pinned.name, pinned.uuid, pinned.state, None, 1, pinned.memory_kib,
                                  replace(pinned.placement, anti_affinity=("db2", "web")), pinned.labels)
    alone = take_snapshot(host, listing=True)
    assert alone.anti_affinity == {"pinned": ("db2", "web")}

    class _Refusing(_Store):
        def occupied_and_refusals(self, host: str):  # type: ignore[no-untyped-def]
            return self.occupied(host), {"pinned": ("web", "cache"), "claimed": ("pinned",)}

    both = take_snapshot(host, _Refusing([_reserved()]), listing=True)
    assert both.anti_affinity == {"pinned": ("db2", "web", "cache"), "claimed": ("pinned",)}
    read = {"pinned": (host._domains[0].placement, {})}
    host.labelled_placements = lambda: read  # type: ignore[attr-defined]
    assert take_snapshot(host).anti_affinity == {"pinned": ("db2", "web")}  # the cheaper read too
    assert joined_refusals({"a": ()}, None, {"b": ("a", "a")}) == {"b": ("a",)}
