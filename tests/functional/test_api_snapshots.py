"""Host snapshots for dry runs: shared within their TTL, dropped by writes, never stalling a burst."""

from __future__ import annotations

import threading

from vmplacer.api.hostcache import HostSnapshots, SnapshotStore
from vmplacer.core.placement.guest_placement import Placement


class _Host:
    """Counts reads; `gate` can hold a domains() call to look at concurrent readers."""

    name = "h1"
    uri = "test:///default"

    def __init__(self) -> None:
        self.reads = {"topology": 0, "domains": 0}
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def topology(self):  # type: ignore[no-untyped-def]
        self.reads["topology"] += 1
        return f"topology-{self.reads['topology']}"

    def domains(self):  # type: ignore[no-untyped-def]
        self.reads["domains"] += 1
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(5)
        return [f"domains-{self.reads['domains']}"]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _snapshots(host: _Host, clock: _Clock, recorded: list[int]) -> HostSnapshots:
    def read_recorded(_name: str) -> tuple:
        recorded[0] += 1
        return [f"recorded-{recorded[0]}"], {}

    return HostSnapshots(lambda _name: host, read_recorded, topology_ttl_s=60, domains_ttl_s=2,
                         recorded_ttl_s=1, clock=clock)


def test_reads_are_shared_within_their_ttl_and_writes_drop_them():
    host, clock, recorded = _Host(), _Clock(), [0]
    snapshots = _snapshots(host, clock, recorded)
    view = snapshots.view("h1")
    for _ in range(5):
        view.topology(), view.domains(), snapshots.recorded("h1")
    assert host.reads == {"topology": 1, "domains": 1} and recorded[0] == 1
    clock.now = 1.5  # recorded placements expire first
    assert snapshots.recorded("h1") == ["recorded-2"] and view.domains() == ["domains-1"]
    clock.now = 2.5
    assert view.domains() == ["domains-2"] and view.topology() == "topology-1"
    snapshots.invalidate("h1")  # a placement through this instance
    assert view.domains() == ["domains-3"] and snapshots.recorded("h1") == ["recorded-3"]
    assert view.topology() == "topology-1"  # the topology does not change with placements


def test_a_refresh_does_not_stall_the_others_and_a_write_wins_over_it():
    host, clock, recorded = _Host(), _Clock(), [0]
    snapshots = _snapshots(host, clock, recorded)
    assert snapshots.domains("h1") == ["domains-1"]
    clock.now = 3.0  # due: the next reader refreshes, the others keep the previous list
    host.gate, host.entered = threading.Event(), threading.Event()
    slow = threading.Thread(target=snapshots.domains, args=("h1",))
    slow.start()
    assert host.entered.wait(5)
    assert snapshots.domains("h1") == ["domains-1"]  # served at once, not behind the refresh
    snapshots.invalidate("h1")  # a write while the refresh reads the old state
    host.gate.set()
    slow.join(5)
    host.gate = None
    assert snapshots.domains("h1") == ["domains-3"]  # the refresh begun before the write was not kept


def test_placements_and_refusals_come_from_one_read_of_the_store():
    """A dry run needs both; the store answers them in one query (one version check), and the
    snapshot keeps them together so they never come from two different moments."""
    host, clock, reads = _Host(), _Clock(), []

    def records(name: str) -> tuple:
        reads.append(name)
        return [f"placement-{len(reads)}"], {"a": ("b",)}

    snapshots = HostSnapshots(lambda _name: host, records, recorded_ttl_s=1, clock=clock)
    store = SnapshotStore(snapshots)
    assert store.occupied_and_refusals("h1") == (["placement-1"], {"a": ("b",)})
    assert snapshots.recorded("h1") == ["placement-1"] and snapshots.anti_affinity("h1") == {"a": ("b",)}
    assert reads == ["h1"]
    snapshots.invalidate("h1")
    assert store.occupied_and_refusals("h1")[0] == ["placement-2"] and reads == ["h1", "h1"]


def test_a_refreshed_value_equal_to_the_cached_one_is_the_same_object():
    """What is computed from a host's cached domains (its room in the fleet index) is found again
    after a refresh that read nothing new."""
    clock = _Clock()
    listing = [["a"]]
    snapshots = HostSnapshots(lambda _name: type("H", (), {"domains": lambda self: list(listing[0])})(),
                              lambda _name: ([], {}), domains_ttl_s=2, clock=clock)
    first = snapshots.domains("h1")
    clock.now = 3.0
    assert snapshots.domains("h1") is first  # re-read, unchanged
    listing[0] = ["a", "b"]
    clock.now = 6.0
    assert snapshots.domains("h1") == ["a", "b"]


def test_a_refresher_keeps_every_host_fresh_and_counts_what_changed():
    """With `keep_fresh` running, a host's new domain is read by the refresher (not by a request)
    and moves `changes()`; an unchanged host moves nothing. The refresher reads what placing reads
    (`labelled_placements`: one listing, the changed domains' XML), never the full listing
    with each domain's state and sizes (three libvirt calls a domain)."""
    import threading
    import time as wall

    listing = {"h1": ["a"], "h2": ["x"]}
    reads = {"h1": 0, "h2": 0}
    full_listings: list[str] = []

    class Host:
        uri = "test:///default"

        def __init__(self, name: str) -> None:
            self.name = name

        def topology(self) -> str:
            return f"topology-{self.name}"

        def labelled_placements(self) -> dict[str, tuple[Placement, dict[str, str]]]:
            reads[self.name] += 1
            return {g: (Placement(guest=g, host=self.name, vcpupin={0: frozenset({0})}, memory_kib=1024), {})
                    for g in listing[self.name]}

        def domains(self) -> list[str]:
            full_listings.append(self.name)
            return []

    snapshots = HostSnapshots(Host, lambda _name: ([], {}), domains_ttl_s=0.05)
    stop = threading.Event()
    refresher = threading.Thread(target=snapshots.keep_fresh, args=(lambda: ["h1", "h2"], stop), daemon=True)
    refresher.start()
    try:
        deadline = wall.monotonic() + 60
        while min(reads.values()) < 3 and wall.monotonic() < deadline:
            wall.sleep(0.01)
        assert min(reads.values()) >= 3, reads  # refreshed over and over without a request
        settled = snapshots.changes()
        seen = dict(reads)
        while min(reads[h] - seen[h] for h in reads) < 2 and wall.monotonic() < deadline:
            wall.sleep(0.01)
        assert snapshots.changes() == settled  # refreshes that read nothing new change nothing
        listing["h2"] = ["x", "y"]
        while set(snapshots.labelled_placements("h2")) != {"x", "y"} and wall.monotonic() < deadline:
            wall.sleep(0.01)
        assert set(snapshots.view("h2").labelled_placements()) == {"x", "y"} and snapshots.changes() > settled
    finally:
        stop.set()
        refresher.join(timeout=30)
    assert not refresher.is_alive()
    assert full_listings == []


def test_a_dry_run_snapshot_is_the_one_a_placement_reads():
    """Served from the cache, a host's snapshot equals the one a placement takes of the host
    itself (dry run = real run), and a host without the cheaper read is read from its listing."""
    from vmplacer.app.observe.host_snapshot import take_snapshot
    from vmplacer.ports import DomainInfo

    pinned = Placement(guest="a", host="h1", vcpupin={0: frozenset({1})}, memory_kib=2048)
    domains = [DomainInfo("a", "u-a", "running", None, 1, 2048, pinned, {"workload_class": "noisy"}),
               DomainInfo("b", "u-b", "shutoff", None, 2, 4096, None, {})]

    class Listed:
        name, uri = "h1", "test:///default"

        def topology(self) -> str:
            return "topology"

        def domains(self) -> list[DomainInfo]:
            return list(domains)

    class Placing(Listed):
        def labelled_placements(self) -> dict[str, tuple[Placement, dict[str, str]]]:
            live = take_snapshot(Listed(), listing=True)
            return {d.name: (live.live[d.name], dict(d.labels)) for d in domains}

    for host in (Listed(), Placing()):
        cached = take_snapshot(HostSnapshots(lambda _name, h=host: h, lambda _name: ([], {})).view("h1"))
        direct = take_snapshot(Placing())
        assert (cached.live, cached.profiles, cached.anti_affinity) == (direct.live, direct.profiles,
                                                                        direct.anti_affinity)
        assert cached.live["b"].vcpupin == {0: frozenset(), 1: frozenset()}  # unpinned: floats anywhere
