"""The frozen-share limit on real libvirt and QEMU guests (the testbed's host 1), through the
profiler as the product builds it (`bootstrap.profiler.build_profiler`: real suspends, the real
freeze journal and profile store on SQLite): a later run counts what the earlier one froze,
leaves the guests at their share running, names them, and leaves every guest running."""

from __future__ import annotations

from pathlib import Path

import libvirt
import pytest

from vmplacer.app.observe.profiler import ProfilerConfig, SensitiveSelector
from vmplacer.bootstrap import Container
from vmplacer.bootstrap.profiler import build_profiler
from vmplacer.config import settings_from_mapping
from vmplacer.core.rebalance.frozen_share import HOUR_S, frozen_seconds
from vmplacer.testbed.guests import wait_for_progress

pytestmark = pytest.mark.integration

T_M_S = 0.02


def container_with_share(testbed, database: Path, share: float) -> Container:
    settings = settings_from_mapping(
        {"database_url": f"sqlite:///{database}",
         "hosts": [{"name": "host1", "uri": testbed.host1_uri, "domain_type": "qemu"}],
         "rebalance": {"disruption": {"max_frozen_share_per_guest_hour": share}}},
        "integration test", {})
    container = Container(settings)
    container.upgrade_database()
    return container


def run(container: Container, names: list[str], samples: int, duration_s: float) -> dict:
    config = ProfilerConfig(t_m_s=T_M_S, t_sleep_s=0.1, max_freeze_s=0.5, samples=samples, duration_s=duration_s,
                            scope=tuple(names), sensitive=SensitiveSelector(frozenset(names)))
    profiler, freezer = build_profiler(container, "host1", config)
    try:
        return profiler.run().to_dict()
    finally:
        freezer.close()


def test_a_second_run_leaves_guests_at_their_share_running(testbed, host1_conn, make_guest, tmp_path,
                                                           record_property):
    handles = [make_guest(label, pin="1", emulator_pin="0", workload="idle") for label in ("a", "b", "c")]
    for handle in handles:
        wait_for_progress(handle.console, timeout_s=90)
    names = [h.name for h in handles]
    database = tmp_path / "vmplacer.db"
    first = run(container_with_share(testbed, database, 0.02), names, samples=4, duration_s=60.0)
    assert first["freezes"] > 0 and first["frozen_share"]["spared"] == {}

    container = container_with_share(testbed, database, 0.02)
    store = container.profile_store
    records = store.freezes_since("host1", 0.0, None)
    spent = frozen_seconds(records, 0.0)
    assert set(spent) == set(names)
    assert sum(r.seconds for r in records) == pytest.approx(first["frozen_s"], rel=1e-6)
    # a limit each guest has reached (but for half a window): the next run may freeze none of them
    share = (min(spent.values()) + T_M_S / 2) / HOUR_S
    second = run(container_with_share(testbed, database, share), names, samples=100, duration_s=5.0)

    record_property("first_run", {"freezes": first["freezes"], "frozen_s": first["frozen_s"],
                                  "stored_freezes": len(records), "dropped": {n: vm["dropped"] for n, vm in
                                                                               first["vms"].items()}})
    record_property("second_run", {"freezes": second["freezes"], "spared": second["frozen_share"]["spared"]})
    print(f"\nfirst run: {first['freezes']} freezes, {first['frozen_s']:.3f} s frozen, {len(records)} stored; "
          f"second run: {second['freezes']} freezes, spared {second['frozen_share']['spared']}")
    assert set(second["frozen_share"]["spared"]) == set(names)
    # every guest was at its share before the run began: it froze nobody, and the count stands
    assert second["freezes"] == 0 and second["frozen_s"] == 0
    assert frozen_seconds(store.freezes_since("host1", 0.0, None), 0.0) == pytest.approx(spent)
    # room for a few more freezes each: the run freezes until a guest's next freeze would pass the
    # share, so the share is passed by at most one freeze's suspend and resume latency
    share = (max(spent.values()) + 3 * T_M_S) / HOUR_S
    third = run(container_with_share(testbed, database, share), names, samples=100, duration_s=10.0)
    fresh = store.freezes_since("host1", 0.0, None)[len(records):]
    assert third["freezes"] > 0 and set(third["frozen_share"]["spared"]) == set(names)
    latency = max(r.seconds for r in fresh) - T_M_S
    for name, seconds in frozen_seconds(fresh + records, 0.0).items():
        assert seconds <= share * HOUR_S + latency + 1e-6, (name, seconds, share * HOUR_S, latency)
    print(f"third run: {third['freezes']} freezes up to {share * HOUR_S:.3f} s per guest, latency {latency:.4f} s")
    for name in names:
        state, _reason = host1_conn.lookupByName(name).state()
        assert state == libvirt.VIR_DOMAIN_RUNNING, name
