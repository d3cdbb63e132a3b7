"""A dedicated guest repinned by a plan, then live-migrated and pinned on arrival, on the real
testbed: after each step libvirt (read with virsh, an independent client) and vmplacer's records
agree on its vCPU pins, its emulator pins and the pCPUs it owns (its vmplacer metadata, live and
persistent), and no other guest's thread is left on them."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import replace

import pytest

from tests.integration.test_place_live import _cleanup, _virsh_vcpupin
from vmplacer.adapters.db import migrate as db_migrate
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.adapters.db.plans import SqlPlacementUpdates
from vmplacer.adapters.domain_xml import render_domain
from vmplacer.adapters.domain_xml_fields import NAMESPACE
from vmplacer.adapters.libvirt_host import LibvirtHost
from vmplacer.app.apply.executor import Executor
from vmplacer.app.place.placement_service import PlacementService
from vmplacer.config import HostSettings
from vmplacer.core.topology.cpuset import parse_cpuset
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.isolation import isolation_violations
from vmplacer.core.placement.guest_placement import placement_from_dict
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.ports import SystemClock

pytestmark = pytest.mark.integration


def _virsh(uri: str, *args: str) -> str:
    return subprocess.run(["virsh", "-c", uri, *args], capture_output=True, text=True, check=True).stdout


def _owned(uri: str, name: str, *flags: str) -> frozenset[int]:
    """The pCPUs the domain's vmplacer metadata says it owns, as virsh prints it."""
    text = _virsh(uri, "metadata", name, NAMESPACE, *flags)
    found = re.search(r"<(?:\w+:)?exclusive_cpus>([^<]*)</(?:\w+:)?exclusive_cpus>", text)
    assert found, text
    return parse_cpuset(found.group(1))


def _emulator(uri: str, name: str, *flags: str) -> frozenset[int]:
    line = next(line for line in _virsh(uri, "emulatorpin", name, *flags).splitlines() if ":" in line and "*" in line)
    return parse_cpuset(line.split(":", 1)[1].strip())


def _agree(uri: str, name: str, cpu: int, store: SqlPlacementStore, host: str) -> None:
    for flags in ((), ("--config",)):
        assert _virsh_vcpupin(uri, name, *flags) == {0: frozenset({cpu})}, flags
        assert _emulator(uri, name, *flags) == frozenset({cpu}), flags
        assert _owned(uri, name, *(("--config",) if flags else ("--live",))) == frozenset({cpu}), flags
    recorded = store.get(name)
    assert recorded is not None and recorded["host"] == host
    placement = placement_from_dict(recorded["placement"])
    assert (placement.vcpupin, placement.emulatorpin, placement.exclusive_cpus) == (
        {0: frozenset({cpu})}, frozenset({cpu}), frozenset({cpu}))


def test_a_dedicated_guest_repinned_then_migrated_owns_where_it_runs(testbed, host1_conn, host2_conn, tmp_path):
    url = f"sqlite:///{tmp_path / 'vmplacer.db'}"
    db_migrate.upgrade(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    store = SqlPlacementStore(sessions)
    hosts = {"h1": LibvirtHost(HostSettings("h1", testbed.host1_uri, domain_type="qemu")),
             "h2": LibvirtHost(HostSettings("h2", testbed.host2_uri, domain_type="qemu"))}
    service = PlacementService(store, lambda spec, placement, base: render_domain(
        spec, placement, base_xml=base, domain_type="qemu"))
    executor = Executor(hosts, clock=SystemClock(), audit=store,
                        placements=SqlPlacementUpdates(sessions, {n: h.uri for n, h in hosts.items()}))
    name = f"vmpt-{os.getpid()}-owner"
    spec = GuestSpec.from_mapping({"name": name, "vcpus": 1, "memory_mib": 64, "cpu_policy": "dedicated"})
    try:
        placed = service.place(hosts["h1"], spec, start=True).placement
        first = next(iter(placed.exclusive_cpus))
        other = 1 - first
        _agree(testbed.host1_uri, name, first, store, "h1")

        # a plan repins it onto the other pCPU: what it owns moves with it, in libvirt and the records
        before = hosts["h1"].domain(name).placement
        assert before is not None
        moved = replace(before, vcpupin={0: frozenset({other})}, emulatorpin=frozenset({other}),
                        exclusive_cpus=frozenset({other}))
        done = executor.run(Plan(actions=(Action(index=0, kind="repin", host="h1", guest=name, before=before,
                                                 after=moved),), hosts=("h1",), state="approved"))
        assert done.state == "succeeded", done.message
        _agree(testbed.host1_uri, name, other, store, "h1")

        # live migration to host 2, then pinned on arrival back onto the first pCPU
        arrived = replace(moved, host="h2")
        landed = replace(arrived, vcpupin={0: frozenset({first})}, emulatorpin=frozenset({first}),
                         exclusive_cpus=frozenset({first}))
        done = executor.run(Plan(actions=(
            Action(index=0, kind="migrate", host="h1", target_host="h2", guest=name, before=moved, after=arrived),
            Action(index=1, kind="repin", host="h2", guest=name, before=arrived, after=landed, depends_on=(0,)),
        ), hosts=("h1", "h2"), state="approved"))
        assert done.state == "succeeded", (done.message, [(a.kind, a.state, a.message) for a in done.actions])
        assert name not in _virsh(testbed.host1_uri, "list", "--all", "--name").split()
        _agree(testbed.host2_uri, name, first, store, "h2")
        for host in hosts.values():
            layout = [d.placement for d in host.domains() if d.placement is not None]
            mine = [v for v in isolation_violations(host.topology(), layout) if name in (v.guest, v.owner)]
            assert mine == [], [v.describe() for v in mine]
    finally:
        _cleanup(host1_conn, [name])
        _cleanup(host2_conn, [name])
        engine.dispose()
