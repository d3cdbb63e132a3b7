"""Host snapshots for dry runs: shared within their TTL, dropped by writes, never stalling a burst."""

from __future__ import annotations

import threading

from vmplacer.api.hostcache import HostSnapshots, SnapshotStore


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
    and moves `changes`; an unchanged host moves nothing."""
    import threading
    import time as wall

    listing = {"h1": ["a"], "h2": ["x"]}
    reads = {"h1": 0, "h2": 0}

    class Host:
        def __init__(self, name: str) -> None:
            self.name = name

        def topology(self) -> str:
            return f"topology-{self.name}"

        def domains(self) -> list[str]:
            reads[self.name] += 1
            return list(listing[self.name])

    snapshots = HostSnapshots(Host, lambda _name: ([], {}), domains_ttl_s=0.05)
    stop = threading.Event()
    refresher = threading.Thread(target=snapshots.keep_fresh, args=(lambda: ["h1", "h2"], stop), daemon=True)
    refresher.start()
    try:
        deadline = wall.monotonic() + 60
        while min(reads.values()) < 3 and wall.monotonic() < deadline:
            wall.sleep(0.01)
        assert min(reads.values()) >= 3, reads  # refreshed over and over without a request
        settled = snapshots.changes
        seen = dict(reads)
        while min(reads[h] - seen[h] for h in reads) < 2 and wall.monotonic() < deadline:
            wall.sleep(0.01)
        assert snapshots.changes == settled  # refreshes that read nothing new change nothing
        listing["h2"] = ["x", "y"]
        while snapshots.domains("h2") != ["x", "y"] and wall.monotonic() < deadline:
            wall.sleep(0.01)
        assert snapshots.domains("h2") == ["x", "y"] and snapshots.changes > settled
    finally:
        stop.set()
        refresher.join(timeout=30)
    assert not refresher.is_alive()
