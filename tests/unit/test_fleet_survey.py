"""Host choice for one guest (the API's dry run and placement order) over more hosts than it
allocates on: the same answer as a dry run on every host on a mixed fleet, only the
shortlisted hosts dry-run, and every host tried when none of those takes the guest."""

from __future__ import annotations

from dataclasses import replace

from vmplacer.app.place.fleet_placement import FleetPlacement, NothingFits
from vmplacer.app.place.placement_service import PlacementService
from vmplacer.core.placement.allocate import allocate
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import uniform_topology
from vmplacer.ports import DomainInfo

SMALL = uniform_topology(nodes=1, cores_per_node=4, threads_per_core=2, memory_mib_per_node=8192)
BIG = uniform_topology(nodes=2, cores_per_node=8, threads_per_core=2, memory_mib_per_node=32768)


class Host:
    """A host as a dry run reads it: a topology and its domains; counts allocations on it."""

    def __init__(self, name: str, topology, guests: list[Placement]) -> None:  # type: ignore[no-untyped-def]
        self.name, self.uri = name, f"test:///{name}"
        self._topology = replace(topology, name=name)
        self._domains = [DomainInfo(p.guest, f"u-{p.guest}", "running", None, p.vcpus, p.memory_kib, p)
                         for p in guests]

    def topology(self):  # type: ignore[no-untyped-def]
        return self._topology

    def domains(self) -> list[DomainInfo]:
        return list(self._domains)


class NoRecords:
    def occupied(self, host: str) -> list[Placement]:
        return []

    def occupied_and_refusals(self, host: str):  # type: ignore[no-untyped-def]
        return [], {}


def _fleet() -> dict[str, Host]:
    hosts = {}
    for at in range(24):
        shape = BIG if at % 3 else SMALL
        topology = replace(shape, name=f"h{at:02d}")
        guests: list[Placement] = []
        for k in range(at % 4):
            spec = GuestSpec.from_mapping({"name": f"h{at:02d}-e{k}", "vcpus": 1 + (at + k) % 3,
                                           "memory_mib": 1024, "cpu_policy": ("dedicated", "shared")[k % 2]})
            guests.append(allocate(topology, spec, guests))
        hosts[topology.name] = Host(topology.name, shape, guests)
    return hosts


def _placement(hosts: dict[str, Host], hosts_to_score: int) -> tuple[FleetPlacement, list[str]]:
    service = PlacementService(NoRecords(), lambda spec, placement, base: f"<domain><name>{spec.name}</name></domain>")
    calls: list[str] = []
    plan = service.plan

    def counting(host, spec, base_xml=None, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(host.name)
        return plan(host, spec, base_xml, **kwargs)

    service.plan = counting  # type: ignore[method-assign]
    return FleetPlacement(service, hosts.__getitem__, hosts.__getitem__, hosts_to_score=hosts_to_score), calls


def test_the_bounded_survey_chooses_as_the_exhaustive_one_and_dry_runs_fewer_hosts():
    hosts = _fleet()
    names = sorted(hosts)
    for fields in ({"vcpus": 2, "memory_mib": 2048, "cpu_policy": "dedicated"},
                   {"vcpus": 4, "memory_mib": 4096},
                   {"vcpus": 6, "memory_mib": 16384, "cpu_policy": "dedicated", "thread_policy": "isolate"}):
        spec = GuestSpec.from_mapping({"name": "new", **fields})
        bounded, calls = _placement(hosts, 4)
        chosen = bounded.plan(spec, names, None)
        every, all_calls = _placement(hosts, 0)
        reference = every.plan(spec, names, None)
        assert (chosen.host, chosen.result.placement.score) == (reference.host, reference.result.placement.score)
        assert chosen.result.xml == reference.result.xml == "<domain><name>new</name></domain>"
        assert len(all_calls) == len(names) and len(calls) <= 4 + 2, calls  # the shortlist and one per shape


def test_a_guest_no_shortlisted_host_takes_is_tried_everywhere_and_refused_with_every_reason():
    hosts = _fleet()
    names = sorted(hosts)
    bounded, calls = _placement(hosts, 4)
    spec = GuestSpec.from_mapping({"name": "huge", "vcpus": 64, "memory_mib": 1024, "cpu_policy": "dedicated"})
    try:
        bounded.plan(spec, names, None)
    except NothingFits as exc:
        assert sorted(host for host, _ in exc.failures) == names  # each host's own reason
    else:
        raise AssertionError("a guest bigger than every host was placed")
    assert sorted(calls) == names
