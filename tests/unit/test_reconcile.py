"""Judging placement records against live domains: every kind of finding, and the windows'
boundaries (`core/reconcile.py` is pure, so records and domains are built by hand)."""

from __future__ import annotations

import json

import pytest

from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.reconcile import (
    DEFAULT_PLANNED_GRACE_S,
    DEFAULT_SETTLE_S,
    KINDS,
    Finding,
    count_by_kind,
    describe_drift,
    reconcile_host,
    record_state_of,
)
from vmplacer.ports import DomainInfo, RecordedPlacement

HOST = "h1"
OLD = 10 * 3600.0  # well past every default window
UUID = "6f1c1f4e-0000-4000-8000-000000000001"
OTHER_UUID = "6f1c1f4e-0000-4000-8000-000000000002"


def placement(guest: str, pins: dict[int, set[int]], *, emulator: set[int] = frozenset(),
              nodes: set[int] = frozenset({0}), dedicated: bool = True) -> Placement:
    vcpupin = {v: frozenset(c) for v, c in pins.items()}
    owned = frozenset(c for cpus in vcpupin.values() for c in cpus) if dedicated else frozenset()
    return Placement(guest=guest, host=HOST, vcpupin=vcpupin, emulatorpin=frozenset(emulator),
                     memory_nodes=frozenset(nodes), memory_kib=65536, dedicated=dedicated, exclusive_cpus=owned)


def record(guest: str, state: str = "running", *, uuid: str | None = UUID, age: float = OLD,
           pins: dict[int, set[int]] | None = None, **kwargs) -> RecordedPlacement:
    return RecordedPlacement(guest, HOST, state, uuid, placement(guest, pins or {0: {2}, 1: {3}}, **kwargs), age)


def domain(name: str, state: str = "running", *, uuid: str = UUID, pins: dict[int, set[int]] | None = None,
           readable: bool = True, **kwargs) -> DomainInfo:
    live = placement(name, pins or {0: {2}, 1: {3}}, **kwargs) if readable else None
    return DomainInfo(name=name, uuid=uuid, state=state, pause_reason=None, vcpus=2, memory_kib=65536,
                      placement=live)


def judge(records, domains, **kwargs) -> list[Finding]:
    return reconcile_host(HOST, records, domains, **kwargs)


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, [f.to_dict() for f in findings]
    return findings[0]


# ----- agreement --------------------------------------------------------------------------------------
@pytest.mark.parametrize("recorded, live", [("running", "running"), ("running", "paused"),
                                            ("defined", "shutoff"), ("defined", "crashed")])
def test_a_record_that_matches_its_domain_produces_nothing(recorded, live):
    assert judge([record("a", recorded)], [domain("a", live)]) == []


def test_no_records_and_no_domains_is_quiet():
    assert judge([], []) == []


# ----- gone / replaced ------------------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["defined", "running"])
def test_a_placed_domain_that_is_no_longer_on_the_host_is_released(state):
    findings = judge([record("a", state, pins={0: {4}, 1: {5}})], [domain("b", uuid=OTHER_UUID)])
    assert [(f.guest, f.kind) for f in findings] == [("a", "gone"), ("b", "unmanaged")]
    finding = findings[0]
    assert (finding.guest, finding.host, finding.kind, finding.action) == ("a", HOST, "gone", "release")
    assert finding.recorded_state == state and finding.live_state is None
    assert "no domain a" in finding.detail and "pCPUs 4-5" in finding.detail


def test_a_domain_redefined_under_the_same_name_is_replaced_and_not_also_unmanaged():
    findings = judge([record("a", uuid=UUID)], [domain("a", uuid=OTHER_UUID, pins={0: {7}})])
    finding = only(findings)  # neither "drifted" nor "unmanaged" on top: the record is not this domain's
    assert (finding.kind, finding.action) == ("replaced", "release")
    assert UUID in finding.detail and OTHER_UUID in finding.detail


def test_a_record_without_uuid_is_not_replaced_but_learns_the_uuid():
    finding = only(judge([record("a", "running", uuid=None)], [domain("a", "running", uuid=OTHER_UUID)]))
    assert (finding.kind, finding.action, finding.state, finding.domain_uuid) == (
        "state", "set_state", "running", OTHER_UUID)
    assert "without its domain uuid" in finding.detail


# ----- reservations ------------------------------------------------------------------------------------
def test_reservation_boundary_pending_up_to_the_grace_then_stale():
    grace = 1800.0
    at_grace = only(judge([record("r", "planned", uuid=None, age=grace)], [], planned_grace_s=grace))
    assert (at_grace.kind, at_grace.action) == ("pending", "none")
    assert "30 min" in at_grace.detail
    past = only(judge([record("r", "planned", uuid=None, age=grace + 0.001)], [], planned_grace_s=grace))
    assert (past.kind, past.action) == ("stale-reservation", "release")
    assert "reservation grace of 30 min" in past.detail


def test_default_grace_is_an_hour():
    assert DEFAULT_PLANNED_GRACE_S == 3600.0
    assert only(judge([record("r", "planned", uuid=None, age=3599.0)], [])).kind == "pending"
    assert only(judge([record("r", "planned", uuid=None, age=3601.0)], [])).kind == "stale-reservation"


@pytest.mark.parametrize("live_state, expected", [("shutoff", "defined"), ("running", "running"),
                                                  ("paused", "running")])
def test_a_reservation_whose_domain_now_exists_is_adopted(live_state, expected):
    finding = only(judge([record("r", "planned", uuid=None)], [domain("r", live_state, uuid=OTHER_UUID)]))
    assert (finding.kind, finding.action, finding.state, finding.domain_uuid) == (
        "adopted", "set_state", expected, OTHER_UUID)
    assert finding.live_state == live_state


def test_an_adopted_domain_defined_with_other_pins_is_also_reported_drifted():
    findings = judge([record("r", "planned", uuid=None)], [domain("r", "running", pins={0: {2}, 1: {6}})])
    assert [(f.kind, f.action) for f in findings] == [("adopted", "set_state"), ("drifted", "none")]


# ----- states ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("recorded, live, expected", [
    ("defined", "running", "running"),
    ("defined", "paused", "running"),
    ("running", "shutoff", "defined"),
    ("running", "crashed", "defined"),
])
def test_recorded_state_follows_libvirt(recorded, live, expected):
    finding = only(judge([record("a", recorded)], [domain("a", live)]))
    assert (finding.kind, finding.action, finding.state, finding.domain_uuid) == (
        "state", "set_state", expected, UUID)
    assert f"recorded {recorded}, libvirt says {live}" in finding.detail


@pytest.mark.parametrize("live, expected", [("running", "running"), ("paused", "running"),
                                            ("blocked", "running"), ("pmsuspended", "running"),
                                            ("shutoff", "defined"), ("crashed", "defined"),
                                            ("shutdown", "defined"), ("nostate", "defined")])
def test_record_state_of_each_libvirt_state(live, expected):
    assert record_state_of(live) == expected


# ----- drift -------------------------------------------------------------------------------------------
def test_drift_names_each_part_that_differs():
    recorded = record("a", pins={0: {2}, 1: {3}}, emulator={0}, nodes={0})
    live = domain("a", pins={0: {2}, 1: {5}}, emulator={0, 1}, nodes={1})
    finding = only(judge([recorded], [live]))
    assert (finding.kind, finding.action) == ("drifted", "none")
    assert "vCPU pins 1→5 (recorded 3);" in finding.detail and "0→" not in finding.detail.split("emulator")[0]
    assert "emulator pins 0-1 (recorded 0)" in finding.detail
    assert "memory nodes 1 (recorded 0)" in finding.detail


@pytest.mark.parametrize("live_kwargs, named", [
    ({"pins": {0: {2}, 1: {3}, 2: {4}}}, "2→4 (recorded absent)"),
    ({"emulator": {1}}, "emulator pins 1 (recorded unpinned)"),
    ({"nodes": set()}, "memory nodes any (recorded 0)"),
])
def test_each_drift_alone(live_kwargs, named):
    assert named in describe_drift(record("a").placement, domain("a", **live_kwargs).placement)


def test_unreadable_live_pinning_is_not_called_drift():
    assert judge([record("a")], [domain("a", readable=False)]) == []


def test_drift_and_state_together():
    findings = judge([record("a", "defined")], [domain("a", "running", pins={0: {2}, 1: {9}})])
    assert [f.kind for f in findings] == ["state", "drifted"]


# ----- unmanaged -----------------------------------------------------------------------------------------
def test_a_domain_without_record_is_unmanaged_and_left_alone():
    finding = only(judge([], [domain("foreign", "paused", uuid=OTHER_UUID)]))
    assert (finding.guest, finding.kind, finding.action, finding.live_state, finding.domain_uuid) == (
        "foreign", "unmanaged", "none", "paused", OTHER_UUID)


# ----- settle window ----------------------------------------------------------------------------------
@pytest.mark.parametrize("rec, live, deferred", [
    (record("a", "running", age=59.9), [], "gone"),
    (record("a", "running", uuid=UUID, age=0.0), [domain("a", uuid=OTHER_UUID)], "replaced"),
    (record("a", "defined", age=30.0), [domain("a", "running")], "state"),
    (record("a", "planned", uuid=None, age=1.0), [domain("a", "shutoff")], "adopted"),
])
def test_a_record_changed_within_the_settle_window_is_never_written(rec, live, deferred):
    finding = only(judge([rec], live, settle_s=60.0))
    assert (finding.kind, finding.action, finding.deferred) == ("settling", "none", deferred)
    assert finding.state is None and not finding.writes
    assert f"would be {deferred}" in finding.detail


def test_settle_boundary_is_inclusive_of_the_window_length():
    assert DEFAULT_SETTLE_S == 60.0
    assert only(judge([record("a", age=59.999)], [])).kind == "settling"
    assert only(judge([record("a", age=60.0)], [])).kind == "gone"


def test_a_stale_reservation_never_settles_past_its_grace_but_a_short_grace_still_waits_for_settle():
    finding = only(judge([record("r", "planned", uuid=None, age=20.0)], [], planned_grace_s=10.0, settle_s=60.0))
    assert (finding.kind, finding.deferred) == ("settling", "stale-reservation")


def test_informational_findings_are_not_deferred_by_the_settle_window():
    findings = judge([record("r", "planned", uuid=None, age=1.0), record("a", age=1.0)],
                     [domain("a", pins={0: {2}, 1: {8}})])
    assert [(f.guest, f.kind) for f in findings] == [("a", "drifted"), ("r", "pending")]


# ----- reports and bad input ------------------------------------------------------------------------------
def test_findings_are_sorted_by_guest_then_kind_and_serialise():
    findings = judge(
        [record("c", "running", uuid=None, pins={0: {4}}), record("b", "planned", uuid=None, age=5.0),
         record("a", "defined")],
        [domain("c", "running", uuid=OTHER_UUID, pins={0: {6}}), domain("z", uuid="u-z")],
        settle_s=0,
    )
    assert [(f.guest, f.kind) for f in findings] == [
        ("a", "gone"), ("b", "pending"), ("c", "state"), ("c", "drifted"), ("z", "unmanaged")]
    data = json.loads(json.dumps([f.to_dict() for f in findings]))
    assert set(data[0]) == {"guest", "host", "kind", "action", "detail", "recorded_state", "live_state", "state",
                            "domain_uuid", "age_s", "deferred", "target_host"}
    assert count_by_kind(findings) == {"gone": 1, "state": 1, "pending": 1, "drifted": 1, "unmanaged": 1}
    assert list(count_by_kind(findings)) == [k for k in KINDS if k in count_by_kind(findings)]


@pytest.mark.parametrize("kwargs, message", [
    ({"planned_grace_s": -1.0}, "planned_grace_s: must be a number of seconds >= 0"),
    ({"settle_s": float("nan")}, "settle_s: must be a number of seconds >= 0"),
])
def test_bad_windows_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        judge([], [], **kwargs)


def test_a_record_in_an_unknown_state_is_refused_naming_the_guest():
    with pytest.raises(ValueError, match=r"guest a on host h1: record state 'removed' is not one of"):
        judge([record("a", "removed")], [])


def test_a_guest_recorded_twice_is_refused():
    with pytest.raises(ValueError, match="guest a on host h1: recorded twice"):
        judge([record("a"), record("a")], [])


def test_followed_placement_moves_ownership_with_the_vcpus():
    from vmplacer.core.reconcile import followed_placement

    recorded = Placement(guest="g", host="h1", vcpupin={0: frozenset({0}), 1: frozenset({1}), 2: frozenset({2, 3})},
                         emulatorpin=frozenset({8}), memory_nodes=frozenset({0}), memory_kib=1024,
                         exclusive_cpus=frozenset({0, 1, 8}))
    live = Placement(guest="g", host="h2", vcpupin={0: frozenset({4}), 1: frozenset({5}), 2: frozenset({6, 7})},
                     emulatorpin=frozenset({9}), memory_nodes=frozenset({1}), memory_kib=1024)
    moved_to = followed_placement(recorded, live, "h2")
    assert moved_to.host == "h2" and moved_to.vcpupin == live.vcpupin and moved_to.memory_nodes == frozenset({1})
    assert moved_to.exclusive_cpus == frozenset({4, 5, 9}), "dedicated vCPUs and the isolated emulator own their new pCPUs"
    assert moved_to.memory_kib == 1024 and moved_to.guest == "g"


# ----- what drifted pinning does ----------------------------------------------------------------------
@pytest.mark.parametrize("policy, action", [("restore", "restore"), ("adopt", "adopt"), ("report", "none")])
def test_drifted_pinning_is_pinned_back_adopted_or_reported_as_the_operator_chose(policy, action):
    findings = judge([record("g")], [domain("g", pins={0: {2}, 1: {6}})], drift=policy)
    assert [(f.kind, f.action, f.writes) for f in findings] == [("drifted", action, action != "none")]
    assert "1→6 (recorded 3)" in findings[0].detail


def test_a_young_record_s_drift_waits_for_the_settle_window():
    findings = judge([record("g", age=1.0)], [domain("g", pins={0: {2}, 1: {6}})], drift="restore")
    assert [(f.kind, f.deferred) for f in findings] == [("settling", "drifted")]


def test_an_unknown_drift_policy_is_refused():
    with pytest.raises(ValueError, match="drift"):
        judge([record("g")], [domain("g")], drift="ignore")
