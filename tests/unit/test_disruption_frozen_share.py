"""The frozen share of a guest's hour: the pure rule (core/rebalance/frozen_share.py) and the
profiler's gate on a fake host whose suspends are logged, on a clock that moves only when the
profiler sleeps (a freeze's span is exactly t_m, so every bound is exact)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.unit.test_profiler import FakeDomain, FakeHost, VirtualClock, make_profiler
from vmplacer.app.observe.frozen_share import FrozenShareGate
from vmplacer.app.observe.profiler import Profiler, ProfilerConfig
from vmplacer.config_rebalance import read_rebalance
from vmplacer.core.rebalance.frozen_share import (
    HOUR_S,
    FreezeRecord,
    FrozenShareError,
    check_share,
    frozen_seconds,
    records_from_samples,
    spared_guests,
)
from vmplacer.core.rebalance.state import RebalanceInputError, RebalanceSettings


def test_frozen_seconds_counts_only_freezes_inside_the_window():
    records = [FreezeRecord(10.0, 0.5, frozenset({"a", "b"})), FreezeRecord(20.0, 0.25, frozenset({"a"})),
               FreezeRecord(5.0, 9.0, frozenset({"a"}))]
    assert frozen_seconds(records, since=10.0) == {"a": 0.75, "b": 0.5}
    assert frozen_seconds(records, since=21.0) == {}


def test_a_guest_is_spared_when_one_more_freeze_would_pass_its_share():
    allowance = 0.01 * HOUR_S  # 36 s
    spent = {"full": allowance, "edge": allowance - 0.010, "over_by_one": allowance - 0.009, "fresh": 0.0}
    spared = spared_guests(spent, ["full", "edge", "over_by_one", "fresh", "unknown"], 0.01, next_freeze_s=0.010)
    assert spared == {"full": allowance, "over_by_one": allowance - 0.009}
    assert spared_guests(spent, spent, 0.0, 0.010) == {}  # 0: no limit


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan"), True, "2%"])
def test_a_share_outside_zero_to_one_is_refused_by_name(share):
    with pytest.raises(FrozenShareError, match="max_frozen_share_per_guest_hour must be a number in"):
        check_share(share)
    with pytest.raises(RebalanceInputError, match="max_frozen_share_per_guest_hour"):
        RebalanceSettings(max_frozen_share_per_guest_hour=share)


def test_the_config_file_key_is_read_and_bad_values_named():
    problems: list[tuple[str, str]] = []
    settings = read_rebalance({"disruption": {"max_frozen_share_per_guest_hour": 0.05}},
                              lambda key, why: problems.append((key, why)))
    assert problems == [] and settings.max_frozen_share_per_guest_hour == 0.05
    assert RebalanceSettings().max_frozen_share_per_guest_hour == 0.02
    read_rebalance({"disruption": {"max_frozen_share_per_guest_hour": 2}}, lambda k, w: problems.append((k, w)))
    read_rebalance({"disruption": {"max_frozen_share_per_guest_hour": "lots"}}, lambda k, w: problems.append((k, w)))
    assert [key for key, _ in problems] == ["rebalance.disruption.max_frozen_share_per_guest_hour"] * 2
    assert "in [0, 1]" in problems[0][1] and "must be a number" in problems[1][1]


def _row(row_id, run, kind, frozen, freeze_ms=12.0, at=100.0, running=()):
    neighbours = [{"name": n, "distance": "same-node", "frozen": True} for n in frozen]
    neighbours += [{"name": n, "distance": "same-node", "frozen": False} for n in running]
    return {"id": row_id, "run_id": run, "kind": kind, "freeze_ms": freeze_ms, "t_m_ms": 10.0,
            "neighbours": neighbours, "at": at}


def test_stored_samples_count_a_pair_probe_once_and_zeta_not_at_all():
    rows = [
        _row(1, 7, "zeta_b", ["b", "c", "d"]),
        _row(2, 7, "zeta_p", ["c", "d"], freeze_ms=13.0, running=["b"]),  # pair (a, b): a's row
        _row(3, 7, "zeta_p", ["c", "d"], freeze_ms=13.0, running=["a"]),  # ... and b's row
        _row(4, 7, "zeta_p", ["c", "d"], freeze_ms=14.0, running=["b"]),  # the same pair probed again
        _row(5, 7, "zeta", [], running=["b", "c", "d"]),
        _row(6, 7, "zeta_b", ["a"], freeze_ms=None),  # no measured span: t_m counts
        _row(7, 7, "frozen", ["a", "b"], freeze_ms=11.0),  # a freeze whose sample was dropped
    ]
    records = records_from_samples(rows)
    assert [(r.seconds, sorted(r.frozen)) for r in records] == [
        (0.012, ["b", "c", "d"]), (0.013, ["c", "d"]), (0.014, ["c", "d"]), (0.010, ["a"]), (0.011, ["a", "b"])]
    assert frozen_seconds(records, 0.0) == pytest.approx({"a": 0.021, "b": 0.023, "c": 0.039, "d": 0.039})


# ----- the profiler's gate ------------------------------------------------------------------


def gated_profiler(host, config, gate, clock):
    profiler, freezer, sampler = make_profiler(host, config, clock=clock, freezer_clock=clock.now)
    profiler = Profiler(host, sampler, freezer, config, clock=clock, wall=clock.now, frozen_share=gate)
    return profiler, freezer


def test_the_profiler_stops_freezing_a_guest_at_its_share_and_names_it():
    host = FakeHost(*(FakeDomain(n, frozenset({i % 2})) for i, n in enumerate("abc")))
    clock = VirtualClock()
    t_m = 0.01
    share = 0.05 / HOUR_S  # 50 ms of the hour: five freezes of t_m
    gate = FrozenShareGate(share, None)
    config = ProfilerConfig(t_m_s=t_m, t_sleep_s=1.0, duration_s=40.0)
    profiler, freezer = gated_profiler(host, config, gate, clock)
    result = profiler.run()
    freezer.close()
    suspends = Counter(name for op, name, _ in host.log if op == "suspend")
    assert suspends == {"a": 5, "b": 5, "c": 5}  # 5 × 10 ms = the share, never more
    assert host.running() == {"a", "b", "c"}  # nobody left paused
    assert result.frozen_s == pytest.approx(result.freezes * t_m)
    assert result.freezes < 15  # most freezes paused two neighbours at once; the spared one ran
    assert sum(vm.dropped["frozen share"] for vm in result.vms.values()) > 0
    assert result.to_dict()["frozen_share"]["spared"] == {name: pytest.approx(0.05) for name in "abc"}


def test_a_guest_is_frozen_again_once_its_old_freezes_leave_the_hour():
    """Over three hours no guest is frozen more than its share in any hour-long window."""
    host = FakeHost(*(FakeDomain(n, frozenset({i % 2})) for i, n in enumerate("abcd")))
    clock = VirtualClock()
    t_m = 0.01
    share = 0.1 / HOUR_S  # 100 ms of the hour
    gate = FrozenShareGate(share, None)
    config = ProfilerConfig(t_m_s=t_m, t_sleep_s=120.0, duration_s=3 * HOUR_S)
    frozen_at: list[tuple[str, float]] = []
    host.on_suspend = lambda name: frozen_at.append((name, clock.now()))
    profiler, freezer = gated_profiler(host, config, gate, clock)
    profiler.run()
    freezer.close()
    assert host.running() == set("abcd")
    for name in "abcd":
        times = [t for n, t in frozen_at if n == name]
        assert len(times) > 10  # frozen again in the second and third hours
        for end in times:
            assert sum(t_m for t in times if end - HOUR_S < t <= end) <= share * HOUR_S + 1e-9


def test_stored_freezes_of_other_runs_count_and_a_share_of_zero_turns_the_gate_off():
    asked: list[tuple[str, float, int | None]] = []

    def history(host: str, since: float, exclude_run: int | None) -> list[FreezeRecord]:
        asked.append((host, since, exclude_run))
        return [FreezeRecord(since + 10.0, 0.05, frozenset({"b"}))]

    gate = FrozenShareGate(0.05 / HOUR_S, history)
    gate.start("h1", 42)
    assert gate.spare(["a", "b"], 0.01, now=5000.0) == {"b": 0.05}
    assert asked == [("h1", 5000.0 - HOUR_S, 42)]
    gate.spare(["a"], 0.01, now=5010.0)  # within refresh_s: not read again
    assert len(asked) == 1
    off = FrozenShareGate(0.0, history)
    assert off.spare(["b"], 0.01, now=5000.0) == {} and len(asked) == 1


def test_the_config_file_names_bad_disruption_values_with_their_rule():
    from vmplacer.config import ConfigError, settings_from_mapping

    with pytest.raises(ConfigError) as excinfo:
        settings_from_mapping({"rebalance": {"disruption": {"max_frozen_share_per_guest_hour": 1.5,
                                                            "max_migrations_in_flight": -1}}},
                              "vmplacer.yaml", environ={})
    problems = excinfo.value.problems
    assert any("vmplacer.yaml: key 'rebalance.disruption.max_frozen_share_per_guest_hour': must be a number in [0, 1]"
               in p for p in problems), problems
    assert any("vmplacer.yaml: key 'rebalance.disruption.max_migrations_in_flight': must be an integer >= 0"
               in p for p in problems), problems
    settings = settings_from_mapping({"rebalance": {"disruption": {"max_frozen_share_per_guest_hour": 0,
                                                                   "max_migrations_in_flight": 0}}},
                                     "vmplacer.yaml", environ={}).rebalance
    assert settings.max_frozen_share_per_guest_hour == 0 and settings.max_migrations_in_flight == 0
