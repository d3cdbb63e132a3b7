"""The REST API end to end on a real libvirtd (the testbed's host 1, qemu:///system).

`vmplacer serve` runs in a subprocess; httpx drives it over HTTP: place (with
the testbed's bootable guest XML as base) → define → start → profile with
Freeze'nSense next to a floating neighbour → plan → apply → remove, against SQLite and PostgreSQL. What
libvirt reports is read back with libvirt-python (an independent client).

The load test sends 200 concurrent placement requests for host 1 from 20
clients. Host 1 is this machine: 2 pCPUs, ~24 GiB. Most requests ask for a
dedicated pCPU, so at most 2 can win and the rest must get a 409 with their
reasons; every tenth asks for a shared vCPU and 16 MiB and should fit. Guests
are defined, not started (200 booting guests would not fit 2 pCPUs). The
check: no pCPU is claimed twice, in the database or in libvirt, every answer
is 201 or 409, and nothing is left behind by the losers.
"""

from __future__ import annotations

import concurrent.futures
import statistics
import time

import httpx
import libvirt
import pytest

from tests.functional.test_api_helpers import Server, scratch_database, wait_job, write_config
from vmplacer.adapters.domain_xml import parse_placement
from vmplacer.testbed.guests import console_path, domain_xml, owned_name, wait_for_progress

pytestmark = pytest.mark.integration


def _remove(conn: libvirt.virConnect, names: list[str]) -> None:
    for name in names:
        try:
            dom = conn.lookupByName(name)
        except libvirt.libvirtError:
            continue
        try:
            if dom.isActive():
                dom.destroy()
            dom.undefine()
        except libvirt.libvirtError:
            pass


@pytest.fixture(params=["sqlite", "postgresql"])
def live_server(request, testbed, tmp_path):
    with scratch_database(request.param, tmp_path) as url:
        # the testbed's guests boot their kernel directly, from files under the testbed directory
        policy = {"allow": ["direct-boot"], "storage_paths": [str(testbed.dirs.root)]}
        config = write_config(tmp_path, url, [{"name": "h1", "uri": testbed.host1_uri, "domain_type": "qemu",
                                               "xml_policy": policy}])
        server = Server(config, tmp_path, instance=f"live-{request.param}", lease_ttl_s=10).start()
        try:
            yield server
        finally:
            server.stop()


def test_place_start_profile_plan_apply_remove(live_server, testbed, host1_conn, make_guest):
    # B: a testbed guest defined outside vmplacer, floating on every pCPU (a neighbour to A)
    neighbour = make_guest(f"api-nb-{live_server.instance[-6:]}", vcpus=1, memory_mib=96, workload="spin")
    name = owned_name(f"api-a-{live_server.instance[-6:]}")
    names = [name, neighbour.name]
    console = console_path(name, testbed.dirs)
    console.unlink(missing_ok=True)
    base = domain_xml(name, testbed.image, console, vcpus=1, memory_mib=96, workload="spin")
    body = {"name": name, "vcpus": 1, "memory_mib": 96, "cpu_policy": "dedicated", "host": "h1",
            "start": True, "base_xml": base}
    try:
        with live_server.client() as api:
            # a dry run first: XML with the caller's (escaped) labels, nothing defined
            label = "<x & y> \"q\" 'a'"
            dry = api.post("/v1/placements", json={**body, "start": False, "dry_run": True,
                                                   "labels": {"owner": label}})
            assert dry.status_code == 200, dry.text
            assert "&lt;x &amp; y&gt;" in dry.json()["xml"] and "<devices>" in dry.json()["xml"]
            assert not _exists(host1_conn, name)
            invalid = api.post("/v1/placements", json={**body, "dry_run": True, "start": False,
                                                       "base_xml": "<domain type='qemu'><bogus/></domain>"})
            assert invalid.status_code == 422 and invalid.json()["error"]["details"][0]["field"] == "base_xml"
            # the host's domain XML policy knows its real emulator (domain capabilities): not this one
            shell = api.post("/v1/placements", json={**body, "dry_run": True, "start": False, "base_xml": base.replace(
                "<devices>", "<devices><emulator>/bin/sh</emulator>")})
            assert shell.status_code == 422 and shell.json()["error"]["details"][0]["rule"] == "emulator", shell.text

            # a reservation: a pCPU claimed and XML returned, the caller would define the domain
            reserved_name = owned_name(f"api-r-{live_server.instance[-6:]}")
            reserved = api.post("/v1/placements", json={"name": reserved_name, "vcpus": 1, "memory_mib": 16,
                                                         "cpu_policy": "dedicated", "host": "h1", "define": False})
            assert reserved.status_code == 201, reserved.text
            assert reserved.json()["state"] == "planned" and f"<name>{reserved_name}</name>" in reserved.json()["xml"]
            assert not _exists(host1_conn, reserved_name)
            claimed = set(reserved.json()["placement"]["exclusive_cpus"])
            assert api.get(f"/v1/placements/{reserved_name}").json()["claims"] == sorted(claimed)
            assert neighbour.name in reserved.json()["narrowed"]  # B stops floating onto the reserved pCPU
            # ... its emulator threads too, live, and the answer says what libvirt now has
            neighbour_dom = host1_conn.lookupByName(neighbour.name)
            live_vcpus = {cpu for row in neighbour_dom.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE)
                          for cpu, on in enumerate(row) if on}
            live_emulator = {cpu for cpu, on in enumerate(neighbour_dom.emulatorPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE))
                             if on}
            assert live_vcpus and not live_vcpus & claimed and live_emulator and not live_emulator & claimed
            (answer,) = [n for n in reserved.json()["narrowed_pins"] if n["guest"] == neighbour.name]
            assert set(answer["vcpupin"]["0"]) == live_vcpus and set(answer["emulatorpin"]) == live_emulator
            assert reserved.json()["isolation_violations"] == []
            # the caller defines the domain from the XML it got: its threads stay on what it claimed
            host1_conn.defineXML(reserved.json()["xml"])
            defined = parse_placement(host1_conn.lookupByName(reserved_name).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE),
                                      "h1")
            assert defined.pcpus <= claimed and defined.emulatorpin <= claimed
            # a reservation's domain is the caller's: removing the record leaves it defined
            assert api.delete(f"/v1/placements/{reserved_name}").json()["undefined"] is False
            host1_conn.lookupByName(reserved_name).undefine()

            # A: placed, defined and started through the API
            answer = api.post("/v1/placements", json=body, headers={"Idempotency-Key": f"place-{name}"})
            assert answer.status_code == 201, answer.text
            assert answer.headers["location"] == f"/v1/placements/{name}"
            placed = answer.json()
            assert placed["state"] == "running"
            # a retry of the same request is answered from the first result, nothing twice
            retry = api.post("/v1/placements", json=body, headers={"Idempotency-Key": f"place-{name}"})
            assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "true"
            assert retry.json() == placed
            # libvirt runs what the API said; B no longer floats onto A's pCPU
            dom = host1_conn.lookupByName(name)
            assert dom.isActive()
            live = parse_placement(dom.XMLDesc(0), "h1")
            assert {str(v): sorted(c) for v, c in live.vcpupin.items()} == placed["placement"]["vcpupin"]
            mine = set(placed["placement"]["exclusive_cpus"])
            pins = host1_conn.lookupByName(neighbour.name).vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE)
            assert not {cpu for row in pins for cpu, on in enumerate(row) if on} & mine
            record = api.get(f"/v1/placements/{name}").json()
            assert record["claims"] == sorted(mine) and record["state"] == "running"
            wait_for_progress(console, samples=2, timeout_s=90)  # it boots and spins

            # Freeze'nSense on these two only (other tests' guests are never frozen)
            job = api.post("/v1/profiles", json={
                "host": "h1", "vms": [name], "scope": names, "samples": 4, "duration_s": 60,
                "t_m_ms": 50, "t_sleep_s": 0.2, "max_freeze_ms": 500, "metric": "cpu"})
            assert job.status_code == 202, job.text
            done = wait_job(api, job.json()["job"]["id"], timeout=120)
            assert done["status"] == "succeeded", done
            assert done["result"]["freezes"] >= 1
            profile = api.get(f"/v1/profiles/{name}", params={"run_id": done["result"]["run_id"]})
            assert profile.status_code == 200, profile.text
            assert profile.json()["profile"]["zeta_b"]["n"] >= 1
            assert neighbour.name in [n["name"] for n in profile.json()["profile"]["neighbours"]]

            # B crowds onto A's dedicated pCPU by hand; a rebalancing plan (dry run) separates them
            # again (moving either), applied as a job
            crowded = host1_conn.lookupByName(neighbour.name)
            width = len(crowded.vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE)[0])
            crowded.pinVcpuFlags(0, tuple(cpu in mine for cpu in range(width)), libvirt.VIR_DOMAIN_AFFECT_LIVE)
            plan = api.post("/v1/plans", json={"hosts": ["h1"], "scope": names})
            assert plan.status_code == 201, plan.text
            assert plan.json()["state"] == "proposed", plan.json()
            assert {a["guest"] for a in plan.json()["actions"] if a["kind"] == "repin"} & set(names)
            apply = api.post(f"/v1/plans/{plan.json()['id']}/apply")
            assert apply.status_code == 202, apply.text
            applied = wait_job(api, apply.json()["job"]["id"], timeout=300)
            assert applied["status"] == "succeeded", applied
            assert api.get(f"/v1/plans/{plan.json()['id']}").json()["state"] == "succeeded"
            again = api.post(f"/v1/plans/{plan.json()['id']}/apply")
            assert again.status_code == 409, again.text
            pcpus = {n: {cpu for row in host1_conn.lookupByName(n).vcpuPinInfo(libvirt.VIR_DOMAIN_AFFECT_LIVE)
                         for cpu, on in enumerate(row) if on} for n in names}
            assert not pcpus[name] & pcpus[neighbour.name], f"A and B still share a pCPU: {pcpus}"

            metrics = api.get("/metrics").text
            assert 'vmplacer_placements_total{host="h1",mode="define",outcome="placed"} 1.0' in metrics
            assert 'vmplacer_freezes_total{host="h1"}' in metrics
            assert "vmplacer_freeze_duration_seconds_count" in metrics
            degradation = [line for line in metrics.splitlines()
                           if line.startswith("vmplacer_vm_degradation{") and f'guest="{name}"' in line]
            assert len(degradation) == 1 and 'host="h1"' in degradation[0]
            assert float(degradation[0].rsplit(" ", 1)[1]) == pytest.approx(
                done["result"]["vms"][name]["degradation"]["estimate"])

            removed = api.delete(f"/v1/placements/{name}")
            assert removed.status_code == 200 and removed.json()["undefined"] is True
            assert not _exists(host1_conn, name)
            assert api.get(f"/v1/placements/{name}").status_code == 404
            actions = [(e["action"], e["guest"]) for e in
                       api.get("/v1/audit", params={"limit": 200}).json()["entries"]]
            assert ("place", name) in actions and ("remove", name) in actions
    finally:
        _remove(host1_conn, [name, owned_name(f"api-r-{live_server.instance[-6:]}")])
        console.unlink(missing_ok=True)


def _exists(conn: libvirt.virConnect, name: str) -> bool:
    try:
        conn.lookupByName(name)
        return True
    except libvirt.libvirtError:
        return False


def test_concurrent_placements_never_double_book(testbed, host1_conn, tmp_path):
    requests_total, clients = 200, 20
    with scratch_database("postgresql", tmp_path) as url:
        config = write_config(tmp_path, url, [{"name": "h1", "uri": testbed.host1_uri, "domain_type": "qemu"}])
        server = Server(config, tmp_path, instance="load").start()
        names = [owned_name(f"load-{i}") for i in range(requests_total)]
        bodies = [{"name": name, "vcpus": 1, "host": "h1", "define": True,
                   **({"cpu_policy": "shared", "memory_mib": 16} if i % 10 == 0
                      else {"cpu_policy": "dedicated", "memory_mib": 32})} for i, name in enumerate(names)]
        pools = [httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.admin}"},
                              timeout=300) for _ in range(clients)]
        latencies: list[float] = []

        def send(i: int) -> httpx.Response:
            started = time.perf_counter()
            answer = pools[i % clients].post("/v1/placements", json=bodies[i])
            latencies.append(time.perf_counter() - started)
            return answer

        try:
            pcpus = sum(len(n["cpus"]) for n in pools[0].get("/v1/hosts/h1/topology").json()["nodes"])
            with concurrent.futures.ThreadPoolExecutor(clients) as pool:
                answers = list(pool.map(send, range(requests_total)))
            statuses = [a.status_code for a in answers]
            assert set(statuses) <= {201, 409}, [a.text for a in answers if a.status_code not in (201, 409)][:3]
            for lost in (a for a in answers if a.status_code == 409):
                assert lost.json()["error"]["code"] in ("no-fit", "conflict")
            won = [a.json() for a in answers if a.status_code == 201]
            assert won, "nothing fitted on an idle host"
            dedicated = {p["guest"]: set(p["placement"]["exclusive_cpus"]) for p in won if p["placement"]["dedicated"]}
            assert len(dedicated) <= pcpus
            owners: dict[int, str] = {}
            for guest, cpus in dedicated.items():
                for cpu in cpus:
                    assert cpu not in owners, f"pCPU {cpu} booked by {owners[cpu]} and {guest}"
                    owners[cpu] = guest
            # libvirt agrees: winners defined with their pins, no other guest of ours on a
            # dedicated pCPU, and the losers left nothing behind
            defined = {d.name(): d for d in host1_conn.listAllDomains()}
            for placement in won:
                live = parse_placement(defined[placement["guest"]].XMLDesc(0), "h1")
                used = set().union(*live.vcpupin.values())
                if placement["guest"] in dedicated:
                    assert used == dedicated[placement["guest"]]
                else:
                    assert not used & set(owners), f"{placement['guest']} floats on dedicated pCPUs"
            assert not (set(names) - {p["guest"] for p in won}) & set(defined)
            api = pools[0]
            recorded = api.get("/v1/placements", params={"host": "h1"}).json()["placements"]
            claims = [c for r in recorded for c in r["claims"]]
            assert sorted(claims) == sorted(owners)
            for placement in won:
                assert api.delete(f"/v1/placements/{placement['guest']}").status_code == 200
            latencies.sort()
            p50 = statistics.median(latencies) * 1e3
            p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1e3
            print(f"\n200 concurrent placements on h1 from {clients} clients: {len(won)} placed "
                  f"({len(dedicated)} dedicated), {statuses.count(409)} refused; p50 {p50:.0f} ms, "
                  f"p99 {p99:.0f} ms")
        finally:
            for client in pools:
                client.close()
            server.stop()
            _remove(host1_conn, names)
            for name in names:
                console_path(name, testbed.dirs).unlink(missing_ok=True)


def test_serve_resumes_what_a_killed_freezer_left_paused(testbed, host1_conn, make_guest, tmp_path):
    """A freeze journal row of a dead process names a guest it suspended: `vmplacer serve`
    resumes it before serving."""
    import socket

    from vmplacer.adapters.db import migrate
    from vmplacer.adapters.db.engine import make_engine, make_session_factory
    from vmplacer.adapters.db.profiles import SqlFreezeJournal

    guest = make_guest("api-frozen", vcpus=1, memory_mib=96, workload="spin")
    dom = host1_conn.lookupByName(guest.name)
    url = f"sqlite:///{tmp_path / 'vmplacer.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    dead = {"hostname": socket.gethostname(), "pid": 2**22 + 12345, "started": 0.0, "instance": "killed"}
    SqlFreezeJournal(make_session_factory(engine)).open("h1", [(guest.name, dom.UUIDString())], 0.5, dead)
    engine.dispose()
    dom.suspend()
    assert dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED
    config = write_config(tmp_path, url, [{"name": "h1", "uri": testbed.host1_uri, "domain_type": "qemu"}])
    server = Server(config, tmp_path, instance="replay").start()  # answers only once replayed
    try:
        assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
        assert f"resumed {guest.name} on h1" in server.log()
    finally:
        server.stop()
