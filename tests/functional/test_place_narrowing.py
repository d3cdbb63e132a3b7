"""A placement's "place ok" audit entry comes after the floating domains left its pCPUs
(the placement service on a real database, SQLite and PostgreSQL; a host that records calls)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from vmplacer.adapters.capabilities import read_capabilities_file
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.models import AuditRow
from vmplacer.adapters.db.placements import SqlPlacementStore
from vmplacer.app.place.placement_service import PlacementService
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.ports import DomainGone, DomainInfo

XEON_E3 = Path(__file__).resolve().parents[2] / "examples" / "hosts" / "xeon-e3-4c8t.xml"


class RecordingHost:
    """One floating domain on every pCPU; defines and pins are recorded, nothing else happens."""

    name = "e3"
    uri = "test:///e3"

    def __init__(self) -> None:
        self._topology = read_capabilities_file(XEON_E3)
        every = frozenset(self._topology.usable_cpus)
        self.floater = Placement(guest="floater", host=self.name, vcpupin={0: every, 1: every}, memory_kib=65536)
        self.calls: list[tuple] = []
        self.defined: set[str] = {"floater"}

    def topology(self):  # type: ignore[no-untyped-def]
        return self._topology

    def domains(self) -> list[DomainInfo]:
        return [DomainInfo("floater", "u-floater", "running", None, 2, 65536, self.floater)]

    def domain_state(self, name: str) -> tuple[str, str | None]:
        if name not in self.defined:
            raise DomainGone(f"no domain {name}", host=self.name, domain=name)
        return "running", None

    def define(self, xml: str, name: str = "") -> str:
        self.calls.append(("define", name))
        self.defined.add(name)
        return f"u-{name}"

    def start(self, name: str) -> None:
        self.calls.append(("start", name))

    def destroy(self, name: str) -> None:
        self.calls.append(("destroy", name))

    def undefine(self, name: str) -> None:
        self.defined.discard(name)

    def pin_vcpu(self, name: str, vcpu: int, cpus: frozenset[int]) -> None:
        self.calls.append(("pin", name, vcpu, cpus))

    def pin_emulator(self, name: str, cpus: frozenset[int]) -> None:
        self.calls.append(("emulatorpin", name, cpus))


@pytest.mark.parametrize("start", [False, True])
def test_place_is_audited_after_the_floaters_left_its_pcpus(migrated_url, start):
    engine = make_engine(migrated_url)
    try:
        sessions = make_session_factory(engine)
        store = SqlPlacementStore(sessions, actor="api:orchestrator", actor_detail={"token_id": 3})
        service = PlacementService(store, lambda spec, placement, base: "<domain/>")
        host = RecordingHost()
        spec = GuestSpec.from_mapping({"name": "pinned", "vcpus": 2, "memory_mib": 64, "cpu_policy": "dedicated"})
        result = service.place(host, spec, start=start)

        owned = result.placement.exclusive_cpus
        assert owned and result.narrowed == ["floater"]
        pins = [call for call in host.calls if call[0] == "pin"]
        assert {call[2] for call in pins} == {0, 1} and all(not call[3] & owned for call in pins)
        # its emulator threads, which ran anywhere, now float with its vCPUs, off the owned pCPUs
        emulator = [call for call in host.calls if call[0] == "emulatorpin"]
        assert [call[1] for call in emulator] == ["floater"] and emulator[0][2] == pins[0][3]
        assert result.narrowed_pins() == [{"guest": "floater", "host": "e3",
                                           "vcpupin": {"0": sorted(pins[0][3]), "1": sorted(pins[1][3])},
                                           "emulatorpin": sorted(emulator[0][2])}]
        with sessions() as session:
            entries = session.scalars(select(AuditRow).order_by(AuditRow.id)).all()
        assert [(e.action, e.guest, e.outcome) for e in entries] == [
            ("narrow-shared-pins", "floater", "ok"), ("place", "pinned", "ok")]
        place = entries[-1]
        assert place.actor == "api:orchestrator" and place.detail["token_id"] == 3
        assert place.detail["narrowed"] == ["floater"]
        assert place.detail["state"] == ("running" if start else "defined")
        assert store.get("pinned")["state"] == place.detail["state"]
    finally:
        engine.dispose()


def test_a_recorded_floater_s_record_follows_its_narrowing(migrated_url):
    """Records equal the host: a floater vmplacer placed is narrowed live and in its row."""
    engine = make_engine(migrated_url)
    try:
        sessions = make_session_factory(engine)
        store = SqlPlacementStore(sessions)
        service = PlacementService(store, lambda spec, placement, base: "<domain/>")
        host = RecordingHost()
        host.defined.clear()
        host.domains = lambda: []  # type: ignore[method-assign]
        shared = service.place(host, GuestSpec.from_mapping({"name": "shared", "vcpus": 2, "memory_mib": 64}))
        assert not shared.placement.exclusive_cpus
        pinned = service.place(host, GuestSpec.from_mapping(
            {"name": "pinned", "vcpus": 2, "memory_mib": 64, "cpu_policy": "dedicated"}))
        owned = pinned.placement.exclusive_cpus
        assert pinned.narrowed == ["shared"]
        recorded = store.get("shared")["placement"]
        assert recorded["vcpupin"] == pinned.narrowed_pins()[0]["vcpupin"]
        assert recorded["emulatorpin"] == pinned.narrowed_pins()[0]["emulatorpin"]
        assert not {c for cpus in recorded["vcpupin"].values() for c in cpus} & owned
        assert recorded["emulatorpin"] and not set(recorded["emulatorpin"]) & owned
        # what was pinned on the host is what the row says
        last = {(call[1], call[2]): call[3] for call in host.calls if call[0] == "pin"}
        assert {str(v): sorted(c) for (g, v), c in last.items() if g == "shared"} == recorded["vcpupin"]
    finally:
        engine.dispose()
