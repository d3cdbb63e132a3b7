"""The fleet index (core/placement/fleet_index.py) never drops a host that can take a guest, and the batch
planner that uses it finds a host for a guest whenever allocating on every host would."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.allocation_fixtures import TOPOLOGIES
from vmplacer.app.place.fleet_planner import FleetHost, FleetPlanner, host_classes
from vmplacer.core.placement.allocate import NoFit, allocate
from vmplacer.core.placement.fleet_index import Demand, may_fit, rank, room_of, shortlist
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.occupancy import Occupancy
from vmplacer.core.placement.admit import AllocationOptions, node_views, page_options
from vmplacer.core.placement.scoring import node_utilisation
from vmplacer.core.topology.host import uniform_topology

GUESTS = st.fixed_dictionaries({
    "vcpus": st.integers(1, 12),
    "memory_mib": st.sampled_from([256, 2048, 16384, 65536]),
    "cpu_policy": st.sampled_from(["shared", "dedicated", "mixed"]),
    "thread_policy": st.sampled_from(["prefer", "isolate", "require"]),
    "mem_page_size": st.sampled_from(["small", "any", "large", "2MB"]),
})


def _spec(name: str, fields: dict) -> GuestSpec:
    fields = dict(fields)
    if fields["cpu_policy"] == "mixed":
        if fields["vcpus"] < 2:
            fields["cpu_policy"] = "dedicated"
        else:
            fields["dedicated_vcpus"] = f"1-{fields['vcpus'] - 1}"
    return GuestSpec.from_mapping({"name": name, **fields})


def _room(topology, placements):  # type: ignore[no-untyped-def]
    usage = Occupancy(placements).usage(topology)
    views = node_views(topology, usage, AllocationOptions(), "performance")
    return room_of(views, {n: node_utilisation(usage, n) for n in views if views[n].has_cpus},
                   {n: info.memory_kib for n, info in topology.nodes.items()})


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(TOPOLOGIES)), placed=st.lists(GUESTS, max_size=6), guest=GUESTS,
       released=st.integers(0, 5))
def test_a_host_the_filter_drops_never_takes_the_guest(name, placed, guest, released):
    """Claims, then a release, then a guest: if allocation takes it, the filter kept the host."""
    topology = TOPOLOGIES[name]()
    on_host = []
    for index, fields in enumerate(placed):
        try:
            on_host.append(allocate(topology, _spec(f"p{index}", fields), on_host))
        except (NoFit, ValueError):
            continue
    if on_host:
        on_host.pop(released % len(on_host))
    try:
        spec = _spec("new", guest)
    except ValueError:
        return
    try:
        allocate(topology, spec, on_host)
    except NoFit:
        return
    assert may_fit(Demand.of(spec, page_options(spec, topology)), _room(topology, on_host))


def test_the_shortlist_keeps_the_most_promising_host_of_every_shape_in_host_order():
    small = uniform_topology(nodes=1, cores_per_node=4, threads_per_core=2, memory_mib_per_node=8192)
    big = uniform_topology(nodes=2, cores_per_node=8, threads_per_core=2, memory_mib_per_node=65536)
    hosts = [(0, small), (1, big), (0, small), (1, big)]

    def ranked(spec):  # type: ignore[no-untyped-def]
        found = [(rank(Demand.of(spec, (4,)), _room(topology, [])), at, shape) for at, (shape, topology) in
                 enumerate(hosts)]
        return [entry for entry in found if entry[0] is not None]

    spec = GuestSpec.from_mapping({"name": "g", "vcpus": 2, "memory_mib": 1024, "cpu_policy": "dedicated"})
    assert shortlist(ranked(spec), 1) == [0, 1]  # one per shape even over the limit, in host order
    assert shortlist(ranked(spec), 3) == [0, 1, 2]  # then the most promising others (ties: host order)
    huge = GuestSpec.from_mapping({"name": "h", "vcpus": 2, "memory_mib": 32768, "cpu_policy": "dedicated"})
    assert shortlist(ranked(huge), 4) == [1, 3]  # the small hosts cannot hold its memory


def test_identical_empty_hosts_are_one_class_and_busy_hosts_their_own():
    base = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2, name="a")
    other = uniform_topology(nodes=1, cores_per_node=4, threads_per_core=2, name="b")
    busy = allocate(replace(base, name="h2"), GuestSpec.from_mapping({"name": "x", "vcpus": 1, "memory_mib": 64}))
    hosts = [FleetHost("h0", replace(base, name="h0")), FleetHost("h1", replace(base, name="h1")),
             FleetHost("h2", replace(base, name="h2"), [busy], frozenset({"x"})), FleetHost("h3", other)]
    assert host_classes(hosts) == [0, 0, 2, 3]
    assert host_classes(hosts, shape_only=True) == [0, 0, 0, 3]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), guests=st.lists(GUESTS, min_size=1, max_size=12))
def test_bounded_host_choice_finds_a_host_whenever_one_fits(seed, guests):
    """On random fleets bigger than the shortlist, each guest in its turn is refused only when no
    host takes it, as allocating on every host would say."""
    rng = random.Random(seed)
    shapes = [TOPOLOGIES[name]() for name in sorted(TOPOLOGIES)]
    hosts = []
    for at in range(12):
        topology = replace(rng.choice(shapes), name=f"h{at}")
        existing = []
        for k in range(rng.randint(0, 3)):
            try:
                existing.append(allocate(topology, _spec(f"h{at}-e{k}", {
                    "vcpus": rng.randint(1, 6), "memory_mib": 2048, "cpu_policy": "dedicated",
                    "thread_policy": "prefer", "mem_page_size": "small"}), existing))
            except NoFit:
                break
        hosts.append(FleetHost(topology.name, topology, existing, frozenset(p.guest for p in existing)))
    try:
        specs = [_spec(f"g{i}", fields) for i, fields in enumerate(guests)]
    except ValueError:
        return
    plan = FleetPlanner(hosts_to_score=2, max_passes=1).plan(specs, hosts)
    held: dict[str, list] = {h.name: list(h.existing) for h in hosts}
    for index in plan.placed_in_order + [g.index for g in plan.guests if g.host is None]:
        guest = plan.guests[index]
        if guest.host is not None:
            held[guest.host].append(guest.placement)
            continue
        for host in hosts:  # refused: truly no host takes it next to what the plan put there
            try:
                allocate(host.topology, guest.spec, held[host.name])
            except NoFit:
                continue
            raise AssertionError(f"{guest.spec.name} fits on {host.name} but was refused")
