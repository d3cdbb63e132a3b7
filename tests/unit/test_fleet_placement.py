"""FleetPlacement: one guest over several hosts — the best host wins, hosts are tried best
first through the placement service, and no domain is ever replaced by name."""

from __future__ import annotations

import pytest

from vmplacer.app.place.fleet_placement import FleetPlacement, NothingFits
from vmplacer.app.place.placement_service import PlacementService
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.nofit import NoFit
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import uniform_topology
from vmplacer.ports import DomainGone, DomainInfo, HypervisorError


class _Host:
    def __init__(self, name: str, cores: int, domains: tuple[str, ...] = (), down: bool = False):
        self.name, self.uri = name, f"test:///{name}"
        self._topology = uniform_topology(nodes=1, cores_per_node=cores, threads_per_core=1,
                                          memory_mib_per_node=16384, name=name)
        self.defined: dict[str, str] = {d: "<theirs/>" for d in domains}
        self.down = down

    def topology(self):  # type: ignore[no-untyped-def]
        if self.down:
            raise HypervisorError(f"host {self.name}: connection refused", host=self.name, retriable=True)
        return self._topology

    def domains(self) -> list[DomainInfo]:
        return [DomainInfo(name=name, uuid=f"uuid-{name}", state="shutoff", pause_reason=None, vcpus=1,
                           memory_kib=1024, placement=None) for name in self.defined]

    def domain_state(self, name: str) -> tuple[str, str | None]:
        if name not in self.defined:
            raise DomainGone(name)
        return "shutoff", None

    def define(self, xml: str, name: str = "") -> str:
        self.defined[name] = xml
        return f"uuid-{name}"


class _Store:
    def __init__(self) -> None:
        self.placements: dict[str, tuple[str, Placement]] = {}
        self.refusing: dict[str, tuple[str, ...]] = {}
        self.audits: list[dict] = []

    def occupied(self, host: str) -> list[Placement]:
        return [p for h, p in self.placements.values() if h == host]

    def occupied_and_refusals(self, host: str) -> tuple[list[Placement], dict[str, tuple[str, ...]]]:
        return self.occupied(host), {g: peers for g, peers in self.refusing.items()
                                     if g in self.placements and self.placements[g][0] == host}

    def record(self, host: str, uri: str, placement: Placement, spec: dict) -> None:
        self.placements[placement.guest] = (host, placement)
        if spec.get("anti_affinity"):
            self.refusing[placement.guest] = tuple(spec["anti_affinity"])

    def set_state(self, guest: str, state: str, domain_uuid: str | None = None, *,
                  audit: dict | None = None) -> None:
        pass

    def forget(self, guest: str) -> None:
        self.placements.pop(guest, None)

    def get(self, guest: str):  # type: ignore[no-untyped-def]
        return self.placements.get(guest)

    def audit(self, **entry) -> None:  # type: ignore[no-untyped-def]
        self.audits.append(entry)


def _fleet(*hosts: _Host) -> tuple[FleetPlacement, PlacementService, _Store]:
    by_name = {h.name: h for h in hosts}
    store = _Store()
    service = PlacementService(store, lambda spec, placement, base: f"<domain>{spec.name}</domain>")
    return FleetPlacement(service, by_name.__getitem__, by_name.__getitem__), service, store


def _spec(name: str = "g", vcpus: int = 2) -> GuestSpec:
    return GuestSpec.from_mapping({"name": name, "vcpus": vcpus, "memory_mib": 1024, "cpu_policy": "dedicated"})


def test_the_best_scoring_host_wins_and_each_host_is_reported():
    fleet, _, _ = _fleet(_Host("a", 2), _Host("b", 8), _Host("c", 1))
    choice = fleet.plan(_spec(), ["a", "b", "c"], None)
    scores = {r["host"]: r["score"] for r in choice.report if "score" in r}
    assert choice.host == max(scores, key=scores.get)
    assert [r["host"] for r in choice.report if "reasons" in r] == ["c"]  # 1 core: no room for 2 vCPUs


def test_placing_skips_a_host_with_a_domain_of_the_same_name_and_leaves_it_alone():
    a, b = _Host("a", 8, domains=("g",)), _Host("b", 2)
    fleet, service, store = _fleet(a, b)
    outcomes: list[tuple[str, str]] = []
    choice = fleet.place(_spec(), ["a", "b"], None, service=service, record=lambda h, o: outcomes.append((h, o)))
    assert choice.host == "b" and b.defined["g"] == "<domain>g</domain>"
    assert a.defined["g"] == "<theirs/>" and store.placements["g"][0] == "b"
    assert outcomes == [("b", "placed")]


def test_nothing_fits_names_every_host_and_why():
    fleet, service, store = _fleet(_Host("a", 8, domains=("g",)), _Host("b", 1), _Host("c", 4, down=True))
    with pytest.raises(NothingFits) as caught:
        fleet.place(_spec(), ["a", "b", "c"], None, service=service)
    failures = dict(caught.value.failures)
    assert set(failures) == {"a", "b", "c"}
    assert isinstance(failures["a"], NoFit) and failures["a"].reasons[0].constraint == "name"
    assert isinstance(failures["b"], NoFit) and "dedicated-cpus" in str(failures["b"])
    assert isinstance(failures["c"], HypervisorError)
    assert store.placements == {}
