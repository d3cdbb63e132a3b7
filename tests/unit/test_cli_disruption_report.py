"""What the CLI says of the disruption budget: `vmplacer profile run` names the guests a run left
running because of their frozen share, the `vmplacer rebalance` report names them in its profile
step, and every report of a plan prints the plan's disruption line (trials kept of their limit,
trial repins of theirs, the trials waiting and their hosts). The runs are the real profiler's
(Freeze'nSense over a fake host, the frozen-share gate as the product builds it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.unit.test_profiler import FakeDomain, FakeHost, ShareSampler, VirtualClock, make_profiler
from vmplacer.app.observe.frozen_share import FrozenShareGate
from vmplacer.app.observe.profiler import Profiler, ProfilerConfig
from vmplacer.app.rebalance.rebalancer import RunReport, Step
from vmplacer.bootstrap.rebalance import spared_text
from vmplacer.cli.profile import print_result
from vmplacer.cli.rebalance import render_report, disruption_line
from vmplacer.core.rebalance.frozen_share import HOUR_S
from vmplacer.core.rebalance.plan import Plan

T_M = 0.01
EPOCH = 1_700_000_000.0  # the profiler's wall clock: the virtual clock moved to 2023
# a share of the hour that leaves room for one freeze of each guest (t_m plus a little latency), not two
ONE_FREEZE_SHARE = 1.5 * T_M / HOUR_S


def _profiler(config: ProfilerConfig, share: float = ONE_FREEZE_SHARE) -> tuple[Profiler, Any, FakeHost]:
    host = FakeHost(*(FakeDomain(n, frozenset({i})) for i, n in enumerate(("db-1", "web-1", "web-2"))), name="h1")
    clock = VirtualClock()  # freezes last t_m of it: what the gate counts is exact
    _, freezer, _ = make_profiler(host, config, clock=clock, freezer_clock=clock.now)
    profiler = Profiler(host, ShareSampler(host), freezer, config, clock=clock, wall=lambda: EPOCH + clock.now(),
                        frozen_share=FrozenShareGate(share, None))
    return profiler, freezer, host


def _config(**changes: Any) -> ProfilerConfig:
    return ProfilerConfig(**{"t_m_s": T_M, "t_sleep_s": 0.5, "duration_s": 5.0, "pair_probes": 0, **changes})


def test_profile_run_names_the_guests_it_left_running_for_their_frozen_share(capsys):
    profiler, freezer, host = _profiler(_config())
    try:
        result = profiler.run()
    finally:
        freezer.close()
    assert host.running() == {"db-1", "web-1", "web-2"}  # nobody left paused
    data = result.to_dict()
    spared = data["frozen_share"]["spared"]
    assert set(spared) == {"db-1", "web-1", "web-2"}  # each frozen once, then held to its share
    print_result(data)
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("left running for their frozen share"))
    assert f"max_frozen_share_per_guest_hour {ONE_FREEZE_SHARE * 100:g} % of the hour" in line
    for guest, seconds in spared.items():
        assert f"{guest} ({seconds:.1f} s frozen)" in line


def test_profile_run_without_a_spared_guest_prints_no_such_line(capsys):
    profiler, freezer, _ = _profiler(_config(), share=0.0)  # 0: no limit, nobody spared
    try:
        result = profiler.run()
    finally:
        freezer.close()
    assert result.to_dict()["frozen_share"]["spared"] == {}
    print_result(result.to_dict())
    assert "frozen share" not in capsys.readouterr().out


def test_a_long_list_of_spared_guests_is_cut_and_counted():
    spared = {f"g{i:02d}": float(i) for i in range(13)}
    text = spared_text({"max_share_per_hour": 0.02, "spared": spared})
    assert text.startswith("left running for their frozen share (max_frozen_share_per_guest_hour 2 % of the hour): ")
    assert "g09 (9.0 s frozen)" in text and "g10" not in text and text.endswith(" and 3 more")
    assert spared_text(None) == spared_text({"spared": {}}) == ""


def _plan(notes: dict[str, Any] | None) -> Plan:
    """A stored plan with nothing to do, its settings holding `notes` as the planner writes them."""
    settings = {"max_trials": 20, "max_trial_repins": 400} | ({"notes": notes} if notes is not None else {})
    return Plan(actions=(), hosts=("h1",), state="empty", id=7, summary="nothing to do", settings=settings,
                created_at=1795830000.0)


WAITING_NOTES = {
    "disruption": {"trials": 20, "trial_repins": 392, "max_trials": 20, "max_trial_repins": 400,
                   "trials_waiting": 8},
    "over_budget": [{"trial": f"h{i}", "hosts": [f"h{i}"], "what": "spread", "value": 0.1, "repins": 8,
                     "migrations": 0, "why": "max_trials 20 per plan reached"} for i in range(3, 9)]
    + [{"trial": "h10+h11", "hosts": ["h10", "h11"], "what": "explore", "value": 0.05, "repins": 12,
        "migrations": 1, "why": "20 repins would pass max_trial_repins 400 per plan (392 spent)"}],
}


def test_the_rebalance_report_names_spared_guests_and_prints_the_disruption_line(monkeypatch, capsys, tmp_path):
    """The profile step's message is the one the rebalancer's profile step gets from the
    composition root (bootstrap/rebalance.py), over a run of the real profiler."""
    import vmplacer.bootstrap.profiler as bootstrap_profiler
    from vmplacer.bootstrap.rebalance import profile_step as compose_profile_step
    from vmplacer.config import settings_from_mapping

    built: list[FakeHost] = []

    def build_profiler(container: Any, host: str, config: ProfilerConfig) -> tuple[Profiler, Any]:
        profiler, freezer, fake = _profiler(config)
        built.append(fake)
        return profiler, freezer

    monkeypatch.setattr(bootstrap_profiler, "build_profiler", build_profiler)
    settings = settings_from_mapping({"data_dir": str(tmp_path), "database_url": f"sqlite:///{tmp_path}/db"},
                                     "test", environ={})
    profile, why = compose_profile_step(SimpleNamespace(settings=settings))  # type: ignore[arg-type]
    assert profile is not None, why
    measured = profile("h1", 5.0, ("*",))
    assert built and built[0].running() == {"db-1", "web-1", "web-2"}
    assert "left running for their frozen share" in measured.message
    report = RunReport(status="nothing-to-do", plan=_plan(WAITING_NOTES),
                       steps=[Step("profile h1", "ok", 5.0, measured.message)])
    render_report(report.to_dict())
    lines = capsys.readouterr().out.splitlines()
    step = next(line for line in lines if line.startswith("profile h1: ok"))
    for guest in ("db-1", "web-1", "web-2"):
        assert f"{guest} (" in step
    assert ("disruption: 20 of 20 trials kept, 392 of 400 trial repins; 8 trials waiting on "
            "h10, h11, h3, h4, h5 …") in lines
    assert lines[-1] == "status: nothing-to-do"


@pytest.mark.parametrize("notes, expected", [
    ({"disruption": {"trials": 2, "trial_repins": 96, "max_trials": 20, "max_trial_repins": 400,
                     "trials_waiting": 0}, "over_budget": []},
     "disruption: 2 of 20 trials kept, 96 of 400 trial repins; no trial waiting"),
    ({"disruption": {"trials": 1, "trial_repins": 40, "max_trials": 1, "max_trial_repins": 400,
                     "trials_waiting": 1},
      "over_budget": [{"trial": "h2", "hosts": ["h2"], "why": "max_trials 1 per plan reached"}]},
     "disruption: 1 of 1 trials kept, 40 of 400 trial repins; 1 trial waiting on h2"),
    ({"drain": "h1", "stuck": [], "fixed": []}, ""),  # a drain tries nothing: no line
    (None, ""),  # a plan made before the budget
])
def test_the_disruption_line_says_what_the_plans_trials_spent(notes, expected, capsys):
    plan = _plan(notes).to_dict()
    assert disruption_line(plan) == expected
    render_report({"status": "nothing-to-do", "plan": plan, "notes": []})
    out = capsys.readouterr().out
    assert (expected in out.splitlines()) if expected else "disruption:" not in out
