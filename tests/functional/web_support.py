"""A fleet for the web view's tests: the built-in example host (and, on request, a synthetic
host of 512 pCPUs) with placements recorded in the store, no libvirt domain behind them —
one dedicated guest on exclusive pCPUs, one shared guest floating over two cores, and one
whose name and labels are hostile markup."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.unit import sysfs_fixtures
from vmplacer.core.placement.guest_placement import Placement

HOSTILE = "<img src=x onerror=alert(1)>"
DEDICATED, SHARED = "db-1", "web-1"


@dataclass(frozen=True)
class Known:
    """What the tests expect to see: pCPUs -> guest, and the guests' classes."""

    exclusive: dict[int, str]
    floating: dict[int, str]
    emulator: dict[int, str]


def big_host(directory: Path, packages: int = 2, nodes_per_package: int = 2, cores_per_node: int = 64,
             threads: int = 2, name: str = "big") -> Path:
    """Capabilities of a host of packages x nodes x cores x threads pCPUs (512 by default),
    written by the fixture generator's model of libvirt (siblings n and n + cores)."""
    fixtures = sysfs_fixtures.load()
    cores = packages * nodes_per_package * cores_per_node
    node_count = packages * nodes_per_package
    cpus = []
    for thread in range(threads):
        for core in range(cores):
            node = core // cores_per_node
            siblings = tuple(core + t * cores for t in range(threads))
            node_cores = range(node * cores_per_node, (node + 1) * cores_per_node)
            l3 = tuple(sorted(c + t * cores for c in node_cores for t in range(threads)))
            cpus.append(fixtures.CpuSpec(id=core + thread * cores, node=node, package=node // nodes_per_package,
                                         core_id=core % cores_per_node, siblings=siblings, l2=siblings, l3=l3,
                                         l2_id=core, l3_id=node))
    rows = [tuple(10 if a == b else (16 if a // nodes_per_package == b // nodes_per_package else 32)
                  for b in range(node_count)) for a in range(node_count)]
    nodes = [fixtures.NodeSpec(n, 256 * fixtures.GIB, 200 * fixtures.GIB, rows[n]) for n in range(node_count)]
    path = directory / f"{name}.xml"
    path.write_text(fixtures.libvirt_capabilities(fixtures.Machine(name, cpus, nodes)))
    return path


def empty_test_driver(directory: Path) -> str:
    """A libvirt test-driver URI whose node defines no domain (test:///default defines one,
    pinned nowhere, which breaks isolation as soon as any pCPU is exclusive)."""
    path = directory / "empty-node.xml"
    path.write_text("<node>\n</node>\n")
    return f"test://{path}"


@dataclass(frozen=True)
class Mixed:
    """What a 112-pCPU host of mixed guests shows: each dedicated guest's pCPUs in map order,
    the floating guests' pCPUs, the pCPUs several floating guests share, and the one violation."""

    dedicated: dict[str, tuple[int, ...]]
    floating: dict[str, tuple[int, ...]]
    crowded: tuple[int, ...]
    rogue: str
    violated: tuple[int, ...]
    emulator: int  # where every dedicated guest's emulator threads run


def record_mixed(container: Any, host: str, dedicated: int = 6) -> Mixed:
    """On a host of 2 x 28 cores x 2 threads: `dedicated` guests x-web0.. each owning one
    core, side by side from core 1 (their emulators on pCPU 0); a batch guest floating over
    two cores; two guests floating over one core together; and x-rogue, floating over a core
    x-web2 owns as well as a free one: one isolation violation."""
    settings = container.settings.host(host)
    topology = container.hypervisor(host).topology()
    cores = sorted((c for c in topology.cores if c.node == 0), key=lambda c: min(c.cpus))
    store = container.placement_store
    emulator = frozenset({cores[0].cpus[0]})
    owned: dict[str, tuple[int, ...]] = {}
    for i in range(dedicated):
        name, cpus = f"x-web{i}", tuple(sorted(cores[1 + i].cpus))
        placement = Placement(guest=name, host=host, vcpupin={v: frozenset({c}) for v, c in enumerate(cpus)},
                              emulatorpin=emulator, memory_nodes=frozenset({0}), memory_kib=2 << 20,
                              dedicated=True, exclusive_cpus=frozenset(cpus))
        store.record(host, settings.uri, placement, {"name": name, "vcpus": len(cpus), "memory_mib": 2048,
                                                     "cpu_policy": "dedicated"})
        owned[name] = cpus
    at = 2 + dedicated
    batch = tuple(sorted(cores[at].cpus + cores[at + 1].cpus))
    crowded = tuple(sorted(cores[at + 2].cpus))
    free = tuple(sorted(cores[at + 3].cpus))
    floating = {"x-batch": batch, "x-f1": crowded, "x-f2": crowded}
    for name, cpus in floating.items():
        placement = Placement(guest=name, host=host, vcpupin={0: frozenset(cpus), 1: frozenset(cpus)},
                              emulatorpin=frozenset(cpus), memory_nodes=frozenset({0}), memory_kib=1 << 20)
        store.record(host, settings.uri, placement, {"name": name, "vcpus": 2, "memory_mib": 1024})
    victim = owned["x-web2"]
    rogue = Placement(guest="x-rogue", host=host, vcpupin={0: frozenset(victim + free)},
                      emulatorpin=frozenset(free), memory_nodes=frozenset({0}), memory_kib=1 << 20)
    store.record(host, settings.uri, rogue, {"name": "x-rogue", "vcpus": 1, "memory_mib": 1024})
    return Mixed(owned, {"x-batch": batch, "x-rogue": free}, crowded, "x-rogue", victim, min(emulator))


def record_guests(container: Any, host: str) -> Known:
    """Three placements on `host`, recorded as the placement service records them (the
    store's claims included), chosen from the host's own topology."""
    settings = container.settings.host(host)
    topology = container.hypervisor(host).topology()
    cores = [c for c in topology.cores if c.node == topology.nodes_with_cpus()[0]]
    owned = list(cores[1].cpus) + list(cores[2].cpus)
    floating = frozenset(cores[4].cpus) | frozenset(cores[5].cpus)
    store = container.placement_store
    dedicated = Placement(guest=DEDICATED, host=host, vcpupin={i: frozenset({c}) for i, c in enumerate(owned)},
                          emulatorpin=frozenset({cores[0].cpus[0]}), memory_nodes=frozenset({0}),
                          memory_kib=4 << 20, dedicated=True, exclusive_cpus=frozenset(owned))
    store.record(host, settings.uri, dedicated,
                 {"name": DEDICATED, "vcpus": len(owned), "memory_mib": 4096, "cpu_policy": "dedicated",
                  "workload_class": "latency-critical", "labels": {"tier": "database"}})
    shared = Placement(guest=SHARED, host=host, vcpupin={0: floating, 1: floating}, memory_nodes=frozenset({0}),
                       memory_kib=2 << 20)
    store.record(host, settings.uri, shared,
                 {"name": SHARED, "vcpus": 2, "memory_mib": 2048, "workload_class": "batch",
                  "labels": {"team": HOSTILE}})
    hostile = Placement(guest=HOSTILE, host=host, vcpupin={0: frozenset(cores[6].cpus)}, memory_kib=1 << 20)
    store.record(host, settings.uri, hostile,
                 {"name": HOSTILE, "vcpus": 1, "memory_mib": 1024, "workload_class": HOSTILE,
                  "labels": {HOSTILE: HOSTILE}})
    return Known(exclusive={c: DEDICATED for c in owned}, floating={c: SHARED for c in floating},
                 emulator={cores[0].cpus[0]: DEDICATED})


def store_plan(container: Any, host: str) -> int:
    """A proposed plan that repins the shared guest and probes it (a trial kept), its reason
    hostile markup; returns its id."""
    from vmplacer.core.rebalance.plan import Action, Plan

    record = container.placement_store.get(SHARED)
    from vmplacer.core.placement.guest_placement import placement_from_dict

    before = placement_from_dict(record["placement"])
    after = Placement(**{**before.__dict__, "vcpupin": {v: frozenset({min(c)}) for v, c in before.vcpupin.items()}})
    plan = Plan(actions=(Action(0, "repin", host, SHARED, None, before, after, reason=HOSTILE, predicted_gain=0.25,
                                confidence=0.8),
                         Action(1, "probe", host, depends_on=(0,), parameters={"seconds": 5.0}, state="succeeded")),
                hosts=(host,), objective_before=1.5, objective_after=1.75, summary="1 repin", created_at=1795830000.0)
    return int(container.plan_store.save(plan, created_by="tests").id)


def store_profiles(container: Any, host: str, runs: int = 2) -> list[int]:
    """Finished profile runs on `host`, stored and summarised as the profiler stores them: the
    dedicated guest measured next to the shared and the hostile guest (frozen for ζb), the
    shared guest next to the dedicated one, each neighbour at its real distance on the host;
    then `vmplacer model learn`'s learning over them. Returns the run ids."""
    from vmplacer.app.learn.online import learn_from_runs
    from vmplacer.core.model.view import nearest_distance, tenant_of
    from vmplacer.core.placement.guest_placement import placement_from_dict
    from vmplacer.core.model.profile_stats import Distribution, degradation
    from vmplacer.ports import Neighbour, ProfileSample

    topology = container.hypervisor(host).topology()
    tenants = {g: tenant_of(topology, placement_from_dict(container.placement_store.get(g)["placement"]))
               for g in (DEDICATED, SHARED, HOSTILE)}

    def around(guest: str) -> tuple[Neighbour, ...]:
        return tuple(Neighbour(other, nearest_distance(topology, tenants[guest], tenants[other]).value, True)
                     for other in tenants if other != guest and (guest == DEDICATED or other == DEDICATED))

    store = container.profile_store
    ids = []
    for run in range(runs):
        run_id = store.start_run(host, "ipc", {"samples": 4})
        values: dict[str, tuple[list[float], list[float]]] = {}
        samples = []
        for guest, loss in ((DEDICATED, 0.2 + 0.05 * run), (SHARED, 0.1)):
            shared = [1.0 - loss + 0.01 * i for i in range(4)]
            alone = [1.0 + 0.01 * i for i in range(4)]
            values[guest] = (shared, alone)
            at = 1795830000.0 + 3600 * run
            for i in range(4):
                samples.append(ProfileSample(guest, "zeta", "ipc", shared[i], 0.1, 100.0, at + 2 * i, around(guest)))
                samples.append(ProfileSample(guest, "zeta_b", "ipc", alone[i], 0.1, 100.0, at + 2 * i + 1,
                                             around(guest), freeze_ms=12.0))
        store.add_samples(run_id, samples)
        vms = {g: {"zeta": Distribution.of(z).to_dict(), "zeta_b": Distribution.of(zb).to_dict(),
                   "degradation": degradation(z, zb).to_dict()} for g, (z, zb) in values.items()}
        store.finish_run(run_id, {"host": host, "metric": "ipc", "run_id": run_id, "vms": vms})
        ids.append(run_id)
    learn_from_runs(store.finished_run_ids(), store, container.model_repository)
    return ids
