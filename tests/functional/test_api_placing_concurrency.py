"""Real placements through the API on libvirt's test driver, SQLite and PostgreSQL:
concurrent placements never share a pCPU, and what others do to the host's domains
behind vmplacer's back (define, redefine, re-pin, undefine) is seen by the next
placement once libvirt's event for it is in, and by every placement with
`domain_resync_s: 0`, although parsed domain XML is kept between placements.

The test driver's host has 16 pCPUs (0-15) on two nodes.
"""

from __future__ import annotations

import contextlib
import threading
import warnings

import pytest

from tests.functional.test_api_helpers import make_container, roomy_test_driver

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from vmplacer.adapters.db.api import SqlTokenStore
from vmplacer.api.app import create_app
from vmplacer.api.services import ApiOptions

HOST_CPUS = frozenset(range(16))
EXTERNAL_UUID = "6f1c2f1e-2b0e-4a52-9a43-0d8a7c3e5b10"


EVENT_TIMEOUT_S = 30.0  # only how long a missing event is waited for before failing


@contextlib.contextmanager
def _serving(database_url, tmp_path, **host):  # type: ignore[no-untyped-def]
    with roomy_test_driver() as connection:
        container = make_container(database_url, tmp_path, [{"name": "t", "uri": "test:///default",
                                                             "domain_type": "qemu", **host}])
        admin = SqlTokenStore(container.sessions).create("orchestrator", "admin")
        app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
        with TestClient(app, raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {admin}"
            yield client, connection, container.hypervisor("t")
        container.close()


@pytest.fixture
def host(database_url, tmp_path):
    with _serving(database_url, tmp_path) as (client, connection, _):
        yield client, connection


@pytest.fixture
def strict_host(database_url, tmp_path):
    """Every placement reads every domain's XML again (no events relied on)."""
    with _serving(database_url, tmp_path, domain_resync_s=0) as (client, connection, _):
        yield client, connection


@pytest.fixture
def watching_host(database_url, tmp_path):
    """The default: domains re-read when libvirt's events say they changed, all every 5 s."""
    with _serving(database_url, tmp_path) as served:
        yield served


def _dedicated(client, name: str):  # type: ignore[no-untyped-def]
    return client.post("/v1/placements", json={"name": name, "vcpus": 1, "memory_mib": 16,
                                                "cpu_policy": "dedicated", "host": "t"})


def _pcpus(response) -> frozenset[int]:  # type: ignore[no-untyped-def]
    assert response.status_code == 201, response.text
    return frozenset(response.json()["placement"]["exclusive_cpus"])


def _live_pins(connection, name: str) -> frozenset[int]:  # type: ignore[no-untyped-def]
    """The pCPUs the domain libvirt holds has its vCPUs pinned to (its <vcpupin> elements)."""
    from lxml import etree

    from vmplacer.core.topology.cpuset import parse_cpuset

    root = etree.fromstring(connection.lookupByName(name).XMLDesc(0).encode())
    return frozenset().union(*(parse_cpuset(pin.get("cpuset")) for pin in root.iter("vcpupin")))


def _external(connection, pins: list[int], name: str = "theirs") -> None:  # type: ignore[no-untyped-def]
    """Define (or redefine) a domain outside vmplacer, one vCPU alone on each pCPU in `pins`:
    a foreign domain vmplacer counts as owning them."""
    pinning = "".join(f"<vcpupin vcpu='{v}' cpuset='{c}'/>" for v, c in enumerate(pins))
    connection.defineXML(
        f"<domain type='test'><name>{name}</name><uuid>{EXTERNAL_UUID}</uuid><memory>16384</memory>"
        f"<vcpu>{len(pins)}</vcpu><cputune>{pinning}</cputune><os><type>hvm</type></os></domain>")


def test_concurrent_placements_never_share_a_pcpu(host):
    client, connection = host
    answers: dict[str, object] = {}

    def place(name: str) -> None:
        answers[name] = _dedicated(client, name)

    names = [f"race-{i}" for i in range(24)]  # more guests than pCPUs: some lose
    threads = [threading.Thread(target=place, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    placed = {n: r for n, r in answers.items() if r.status_code == 201}  # type: ignore[attr-defined]
    refused = {n: r for n, r in answers.items() if r.status_code != 201}  # type: ignore[attr-defined]
    assert len(answers) == len(names)
    assert all(r.status_code == 409 and r.json()["error"]["code"] == "no-fit"  # type: ignore[attr-defined]
               for r in refused.values()), {n: r.text for n, r in refused.items()}  # type: ignore[attr-defined]
    assert len(placed) == len(HOST_CPUS)  # every pCPU went to exactly one guest
    claimed = [_pcpus(r) for r in placed.values()]
    assert frozenset().union(*claimed) == HOST_CPUS and sum(len(c) for c in claimed) == len(HOST_CPUS)
    live = [_live_pins(connection, name) for name in placed]
    assert sorted(live, key=sorted) == sorted(claimed, key=sorted)  # libvirt pins them where the claims say
    for name in refused:
        assert client.get(f"/v1/placements/{name}").status_code == 404  # a loser leaves no record
        assert name not in connection.listDefinedDomains()  # and no domain


def test_domains_changed_behind_vmplacers_back_are_seen_by_the_next_placement(strict_host):
    client, connection = strict_host
    taken = _pcpus(_dedicated(client, "warm")) | _pcpus(_dedicated(client, "warm2"))  # domains read and parsed
    free = sorted(HOST_CPUS - taken)

    _external(connection, free[:-1])  # defined outside vmplacer: all but one free pCPU
    assert _pcpus(_dedicated(client, "after-define")) == {free[-1]}

    _external(connection, free[1:])  # redefined, same name and UUID: now the first one is left
    client.delete("/v1/placements/after-define")
    assert _pcpus(_dedicated(client, "after-redefine")) == {free[0]}

    client.delete("/v1/placements/after-redefine")
    domain = connection.lookupByName("theirs")  # started, then re-pinned live: vCPU 0 moves onto free[0]
    domain.create()
    domain.pinVcpu(0, tuple(c == free[0] for c in range(len(HOST_CPUS))))
    assert _pcpus(_dedicated(client, "after-repin")) == {free[1]}

    domain.destroy()  # gone outside vmplacer: its pCPUs are free again
    domain.undefine()
    again = {next(iter(_pcpus(_dedicated(client, f"after-undefine-{i}")))) for i in range(len(free) - 1)}
    assert again == set(free) - {free[1]}
    assert _dedicated(client, "one-too-many").status_code == 409


def test_outside_changes_with_an_event_are_seen_by_the_first_placement_after_it(watching_host):
    client, connection, hypervisor = watching_host
    events = hypervisor.domain_events

    def outside(change) -> None:  # type: ignore[no-untyped-def]
        seen = events.events_seen
        change()
        assert events.wait_for_events(seen, EVENT_TIMEOUT_S), "no domain event arrived"

    taken = _pcpus(_dedicated(client, "warm")) | _pcpus(_dedicated(client, "warm2"))
    free = sorted(HOST_CPUS - taken)
    outside(lambda: _external(connection, free[:-1]))
    assert _pcpus(_dedicated(client, "after-define")) == {free[-1]}

    outside(lambda: _external(connection, free[1:]))  # redefined, same name and UUID
    client.delete("/v1/placements/after-define")
    assert _pcpus(_dedicated(client, "after-redefine")) == {free[0]}

    client.delete("/v1/placements/after-redefine")
    outside(lambda: connection.lookupByName("theirs").undefine())  # its pCPUs are free again
    again = {next(iter(_pcpus(_dedicated(client, f"after-undefine-{i}")))) for i in range(len(free))}
    assert again == set(free)
    assert _dedicated(client, "one-too-many").status_code == 409


def test_a_failed_define_leaves_no_claim_and_no_domain_and_frees_the_pcpus(host):
    client, connection = host
    _external(connection, [0], name="holder")  # holds EXTERNAL_UUID: a placement asking for it is refused
    base = (f"<domain type='qemu'><name>clash</name><uuid>{EXTERNAL_UUID}</uuid>"
            "<os><type>hvm</type></os></domain>")
    refused = client.post("/v1/placements", json={"name": "clash", "vcpus": 15, "memory_mib": 16,
                                                   "cpu_policy": "dedicated", "host": "t", "base_xml": base})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "exists", refused.text
    assert client.get("/v1/placements/clash").status_code == 404
    assert "clash" not in connection.listDefinedDomains()
    every = _pcpus(client.post("/v1/placements", json={"name": "all", "vcpus": 15, "memory_mib": 16,
                                                       "cpu_policy": "dedicated", "host": "t"}))
    assert every == HOST_CPUS - {0}  # the refused claim was given back
