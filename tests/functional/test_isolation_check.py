"""`serve` checks each host's live pinning against the isolation invariant periodically: a
guest an operator pins by hand onto another guest's exclusive pCPU shows in /metrics
(vmplacer_isolation_violations) within one period, and disappears once it is pinned back.

Host: libvirt's test driver (shared with this process, so the test pins "by hand" through
its own connection), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import re
import time
import warnings

from tests.functional.test_api_helpers import make_container, roomy_test_driver

HOST = {"name": "t", "uri": "test:///default", "domain_type": "qemu"}
GAUGE = re.compile(r'^vmplacer_isolation_violations\{host="t"\} (\S+)$', re.M)


def _gauge(client) -> float | None:  # type: ignore[no-untyped-def]
    found = GAUGE.search(client.get("/metrics").text)
    return float(found.group(1)) if found else None


def _until(client, wanted) -> float | None:  # type: ignore[no-untyped-def]
    """The gauge once `wanted(value)` holds, polling for up to 50 check periods."""
    value = None
    for _ in range(250):
        value = _gauge(client)
        if wanted(value):
            return value
        time.sleep(0.02)
    return value


def test_a_guest_pinned_by_hand_onto_an_owned_pcpu_shows_in_metrics_within_a_period(database_url, tmp_path):
    from vmplacer.adapters.db.api import SqlTokenStore
    from vmplacer.api.app import create_app
    from vmplacer.api.services import ApiOptions

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    with roomy_test_driver() as connection:
        container = make_container(database_url, tmp_path, [HOST])
        try:
            admin = SqlTokenStore(container.sessions).create("ops", "admin")
            options = ApiOptions(run_jobs=False, replay_freeze_journal=False, isolation_check_s=0.1)
            with TestClient(create_app(container, options), raise_server_exceptions=False) as client:
                client.headers["Authorization"] = f"Bearer {admin}"
                owner = client.post("/v1/placements", json={"name": "iso-owner", "vcpus": 1, "memory_mib": 64,
                                                            "cpu_policy": "dedicated", "host": "t"})
                assert owner.status_code == 201, owner.text
                shared = client.post("/v1/placements", json={"name": "iso-shared", "vcpus": 1, "memory_mib": 64,
                                                             "host": "t"})
                assert shared.status_code == 201, shared.text
                assert _until(client, lambda v: v == 0) == 0, "placed by vmplacer: no violation"

                owned = owner.json()["placement"]["exclusive_cpus"]
                domain = connection.lookupByName("iso-shared")
                domain.create()  # running: the test driver pins running domains only
                cpus = connection.getCPUMap(0)[0]
                domain.pinVcpuFlags(0, tuple(i == owned[0] for i in range(cpus)), 0)  # the operator, by hand
                assert _until(client, lambda v: v is not None and v >= 1) >= 1

                # off the owned pCPU again (the test driver pins within its own 8 CPUs only)
                domain.pinVcpuFlags(0, tuple(i not in owned for i in range(cpus)), 0)
                assert _until(client, lambda v: v == 0) == 0
        finally:
            container.close()
