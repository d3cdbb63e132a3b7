"""Per-host allocation knobs from the configuration reach every place that allocates:
the placement service (CLI `place`, the API), `vmplacer plan --host`, and the rebalancer."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vmplacer.adapters.capabilities import read_capabilities_file
from vmplacer.adapters.db import migrate
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlanStore
from vmplacer.adapters.request_file import parse_request_text
from vmplacer.lab.simulator import SimCluster
from vmplacer.app.place.placement_service import PlacementService
from vmplacer.app.rebalance.rebalancer import RebalancePorts, Rebalancer
from vmplacer.app.place.fleet_planner import FleetHost
from vmplacer.cli.fleet_plan import plan_on
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.nofit import NoFit
from vmplacer.core.placement.admit import AllocationOptions
from vmplacer.core.topology.host import uniform_topology

XEON_E3 = Path(__file__).resolve().parents[2] / "examples" / "hosts" / "xeon-e3-4c8t.xml"


class _Host:
    name = "e3"
    uri = "test:///e3"

    def __init__(self):
        self._topology = read_capabilities_file(XEON_E3)

    def topology(self):
        return self._topology

    def domains(self):
        return []


class _EmptyStore:
    def occupied(self, host):
        return []

    def occupied_and_refusals(self, host):
        return [], {}


def _spec(**fields) -> GuestSpec:
    return GuestSpec.from_mapping({"name": "web", "vcpus": 2, "memory_mib": 2048, **fields})


def test_placement_service_keeps_the_configured_memory_reserve():
    host = _Host()
    node_mib = host.topology().nodes[0].memory_kib // 1024
    options = {"e3": AllocationOptions(reserved_memory_mib_per_node=node_mib - 1024)}
    service = PlacementService(_EmptyStore(), lambda spec, placement, base: "<domain/>", options.__getitem__)

    with pytest.raises(NoFit) as excinfo:
        service.plan(host, _spec())
    assert "memory" in str(excinfo.value)
    assert PlacementService(_EmptyStore(), lambda *a: "<domain/>").plan(host, _spec()).placement.vcpupin


def test_plan_command_state_applies_the_cpu_allocation_ratio():
    topology = read_capabilities_file(XEON_E3)
    usable = len(topology.usable_cpus)
    requests = parse_request_text(yaml.safe_dump({"guests": [
        {"name": f"g{i}", "vcpus": usable, "memory_mib": 256} for i in range(3)]}), "request.yaml")
    loose = plan_on([FleetHost("e3", topology)], requests)
    strict = plan_on([FleetHost("e3", topology, options=AllocationOptions(cpu_allocation_ratio=2.0))], requests)
    assert [e["guest"] for e in loose["errors"]] == []
    assert [e["guest"] for e in strict["errors"]] == ["g2"]
    assert "ratio 2" in strict["errors"][0]["message"]


def test_rebalancer_never_migrates_onto_a_host_whose_memory_is_reserved(sqlite_url):
    migrate.upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    sessions = make_session_factory(engine)

    def cluster() -> SimCluster:
        sim = SimCluster(seed=1, noise=0.0)
        sim.add_host("h1", uniform_topology(nodes=1, cores_per_node=1, name="h1"))
        sim.add_host("h2", uniform_topology(nodes=1, cores_per_node=2, name="h2"))
        for name in ("a", "b", "c"):
            sim.hosts["h1"].define_domain(name, workload="spin", vcpupin=[0], memory_kib=256 * 1024)
        return sim

    def observed_destinations(allocation) -> set[str]:
        sim = cluster()
        rebalancer = Rebalancer(
            RebalancePorts(hosts=dict(sim.hosts), plans=SqlPlanStore(sessions), leases=SqlLeaseStore(sessions),
                           clock=sim.clock, allocation=allocation),
        )
        plan = rebalancer.make_plan(["h1", "h2"])
        return {a.target_host for a in plan.actions if a.kind == "migrate"}

    try:
        assert observed_destinations(None) == {"h2"}
        reserved = {"h1": AllocationOptions(), "h2": AllocationOptions(reserved_memory_mib_per_node=1 << 20)}
        assert observed_destinations(reserved.__getitem__) == set()
    finally:
        engine.dispose()
