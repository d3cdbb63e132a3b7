"""`vmplacer plan --rebalance`, `plans`, `apply`, `rebalance` and `eval rebalance` through the real
console script, against libvirt's built-in test driver and a SQLite database: JSON contract and
exit codes 0/1/2. (Moves on real guests: tests/integration/test_rebalance_live.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import require, run_vmplacer


ROOT = Path(__file__).resolve().parents[2]
E7600 = ROOT / "tests" / "data" / "interference" / "e7600_2core_pairs.csv"
MIXED = ROOT / "examples" / "requests" / "mixed.yaml"


@pytest.fixture
def config(tmp_path) -> Path:
    try:
        import libvirt  # noqa: F401
    except ImportError:
        require(False, "libvirt-python is not installed")
    path = tmp_path / "vmplacer.yaml"
    path.write_text(f"database_url: sqlite:///{tmp_path / 'vmplacer.db'}\ndata_dir: {tmp_path}\n"
                    "hosts:\n  - {name: t1, uri: \"test:///default\"}\n")
    return path


def vmplacer(config: Path | None, *args: str) -> tuple[int, dict, str]:
    done = run_vmplacer(*(["--config", str(config)] if config else []), *args)
    try:
        data = json.loads(done.stdout) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        data = {"text": done.stdout}
    return done.returncode, data, done.stderr


def _store(config: Path, state: str = "proposed", actions: int = 1) -> int:
    """Store a plan of no-op repins of the test driver's guest (its pins as they are: applying one
    succeeds as "already in the target state"), moved on to `state`; its id."""
    from vmplacer.adapters.db import migrate
    from vmplacer.adapters.db.engine import make_engine, make_session_factory
    from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlanStore
    from vmplacer.core.placement.guest_placement import Placement
    from vmplacer.core.rebalance.plan import Action, Plan

    url = config.read_text().splitlines()[0].split(": ", 1)[1]
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        store = SqlPlanStore(make_session_factory(engine))
        live = Placement("test", "t1", {0: frozenset(), 1: frozenset()})
        plan = store.save(Plan(tuple(Action(i, "repin", "t1", "test", before=live, after=live, reason="test")
                                     for i in range(actions)), ("t1",), summary=f"{actions} no-op repin(s)"))
        for before, after in (("proposed", "approved"), ("approved", "running")):
            if state == before:
                break
            if after == "running":  # a live executor holds its hosts' leases while the plan runs
                assert SqlLeaseStore(store.sessions).acquire(["t1"], "rebalance@elsewhere", 3600)
            assert store.transition(plan.id, before, after)
        return plan.id
    finally:
        engine.dispose()


def _audit(config: Path, plan_id: int) -> list[dict]:
    from vmplacer.adapters.db.engine import make_engine, make_session_factory
    from vmplacer.adapters.db.plans import SqlPlanStore

    engine = make_engine(config.read_text().splitlines()[0].split(": ", 1)[1])
    try:
        return SqlPlanStore(make_session_factory(engine)).audit_rows(plan_id)
    finally:
        engine.dispose()


def test_plan_store_show_apply_and_lifecycle(config):
    # The test driver's one guest has nothing worth moving: the plan is stored empty (final).
    code, data, err = vmplacer(config, "plan", "--rebalance", "--all", "--format", "json")
    assert code == 0, err
    plan = data["plan"]
    assert data["status"] == "nothing-to-do" and plan["state"] == "empty" and plan["id"] == 1
    assert plan["actions"] == [] and "nothing to do" in plan["summary"]
    assert {"actions", "diff", "objective_before", "objective_after", "predicted_gain", "settings"} <= set(plan)
    assert plan["settings"]["min_gain"] == 0.05 and "notes" in plan["settings"]
    code, listed, _ = vmplacer(config, "plans", "list", "--format", "json")
    assert code == 0 and listed == []  # empty plans are hidden by default
    code, listed, _ = vmplacer(config, "plans", "list", "--all", "--format", "json")
    assert code == 0 and [(p["id"], p["state"]) for p in listed] == [(1, "empty")]
    code, listed, _ = vmplacer(config, "plans", "list", "--state", "empty", "--format", "json")
    assert code == 0 and [p["id"] for p in listed] == [1]
    code, shown, _ = vmplacer(config, "plans", "1", "--format", "json")
    assert shown["plan"]["id"] == 1 and shown["plan"]["state"] == "empty"
    code, _, err = vmplacer(config, "apply", "1")
    assert code == 2 and "plan 1 is empty: nothing worth doing was found" in err
    # A plan with actions goes proposed → approved → running → succeeded.
    stored = _store(config)
    code, listed, _ = vmplacer(config, "plans", "list", "--format", "json")
    assert code == 0 and [(p["id"], p["state"]) for p in listed] == [(stored, "proposed")]
    code, applied, err = vmplacer(config, "apply", str(stored), "--format", "json")
    assert code == 0, err
    assert applied["plan"]["state"] == "succeeded"
    assert applied["plan"]["actions"][0]["message"] == "already in the target state"
    code, _, err = vmplacer(config, "apply", str(stored))
    assert code == 2 and f"plan {stored} is succeeded" in err
    code, _, err = vmplacer(config, "apply", "99")
    assert code == 2 and "plan 99 does not exist" in err
    code, listed, _ = vmplacer(config, "plans", "list", "--state", "succeeded", "--state", "empty", "--format", "json")
    assert [p["id"] for p in listed] == [stored, 1]


def test_plans_verbs_read_as_the_older_spellings(config):
    stored = _store(config)
    listed = vmplacer(config, "plans", "list", "--format", "json")
    assert listed[0] == 0 and [p["id"] for p in listed[1]] == [stored]
    assert vmplacer(config, "plans", "list", "--format", "json") == listed
    shown = vmplacer(config, "plans", "show", str(stored), "--format", "json")
    assert shown[0] == 0 and shown[1]["plan"]["id"] == stored
    assert vmplacer(config, "plans", "show", str(stored), "--format", "json") == shown
    assert vmplacer(config, "plans", "show", "--format", "json", str(stored)) == shown  # the id after an option
    code, data, err = vmplacer(config, "plans", "cancel", "--format", "json", str(stored))
    assert code == 0, err
    assert data["plan"]["state"] == "cancelled"


def test_plans_cancel(config):
    proposed, approved, running = _store(config, actions=2), _store(config, "approved"), _store(config, "running")
    code, data, err = vmplacer(config, "plans", "cancel", str(proposed), "--reason", "maintenance window",
                               "--format", "json")
    assert code == 0, err
    assert data["status"] == "cancelled" and data["plan"]["state"] == "cancelled"
    assert [a["state"] for a in data["plan"]["actions"]] == ["skipped", "skipped"]
    message = data["plan"]["actions"][0]["message"]
    assert message.startswith("cancelled by ") and message.endswith(": maintenance window")
    assert data["plan"]["message"] == message
    code, _, err = vmplacer(config, "plans", "cancel", str(approved))
    assert code == 0, err
    assert vmplacer(config, "plans", "show", str(approved), "--format", "json")[1]["plan"]["state"] == "cancelled"
    # Running: only a request, which the executor honours before its next action.
    code, data, err = vmplacer(config, "plans", "cancel", str(running), "--reason", "stop", "--format", "json")
    assert code == 0, err
    assert data["status"] == "cancel-requested" and data["plan"]["state"] == "running"
    assert data["plan"]["cancel_request"]["reason"] == "stop" and data["plan"]["actions"][0]["state"] == "pending"
    assert any("stops before its next action" in n for n in data["notes"])
    code, out, _ = vmplacer(config, "plans", "show", str(running))
    assert code == 0 and "cancel requested by" in out["text"] and ": stop" in out["text"]
    # Final plans, unknown plans and malformed commands are refused, naming the plan and its state.
    code, _, err = vmplacer(config, "plans", "cancel", str(proposed))
    assert code == 2 and f"plan {proposed} is cancelled: it is final" in err
    code, _, err = vmplacer(config, "apply", str(proposed))
    assert code == 2 and f"plan {proposed} is cancelled" in err
    code, _, err = vmplacer(config, "plans", "cancel", "99")
    assert code == 2 and "plan 99 does not exist" in err
    for args, message in ((["plans", "cancel"], "plans cancel: give exactly one PLAN_ID"),
                          (["plans", "cancel", "x"], "PLAN_ID: must be a plan number"),
                          (["plans", "show", str(proposed), "--reason", "x"], "--reason: only with"),
                          (["plans", "list", "--state", "done"], "--state 'done': not a plan state"),
                          (["plans", "list", "--all", "--state", "empty"], "not allowed with argument")):
        code, _, err = vmplacer(config, *args)
        assert code == 2 and message in err, (args, err)
    audit = _audit(config, proposed)
    assert [(r["action"], r["outcome"]) for r in audit] == [("rebalance-cancel", "ok")]
    assert audit[0]["detail"]["reason"] == "maintenance window" and audit[0]["detail"]["from_state"] == "proposed"
    assert [(r["action"], r["outcome"]) for r in _audit(config, running)] == [("rebalance-cancel", "requested")]


def test_rebalance_run_reports_its_steps(config):
    code, report, err = vmplacer(config, "rebalance", "--profile-seconds", "0", "--format", "json")
    assert code == 0, err
    assert report["status"] == "nothing-to-do" and report["plan"]["state"] == "empty"
    assert [s["name"] for s in report["steps"]] == ["profile", "learn", "plan"]
    assert report["steps"][0]["status"] == "skipped"
    code, report, err = vmplacer(config, "rebalance", "--dry-run", "--profile-seconds", "0", "--no-migrate",
                                 "--max-actions", "3", "--backoff", "600", "--format", "json")
    assert code == 0 and report["plan"]["settings"]["max_actions"] == 3
    assert report["plan"]["settings"]["backoff_s"] == 600.0
    assert report["plan"]["settings"]["allow_migration"] is False


@pytest.mark.parametrize("args, message", [
    (["plan", "--rebalance", "--host", "nope"], "--host 'nope': unknown host"),
    (["rebalance", "--host", "nope"], "--host 'nope': unknown host"),
    (["place", "--host", "nope", "--request", str(MIXED)], "--host 'nope': unknown host"),
    (["profile", "run", "--host", "nope"], "--host 'nope': unknown host"),
    (["profile", "replay", "--host", "nope"], "--host 'nope': unknown host"),
    (["plan", "--rebalance", "--request", "x.yaml"], "--request: not used with --rebalance"),
    (["plan", "--rebalance", "--host", "t1", "--host", "t2"], "--host: once with --rebalance (or --all)"),
    (["plan", "--all", "--request", "missing.yaml"], "--request"),
    (["plan"], "--request: required"),
    (["rebalance", "--max-actions", "-1"], "--max-actions"),
    (["rebalance", "--backoff", "-5"], "--backoff: '-5' is not a duration"),
    (["rebalance", "--profile-seconds", "-2"], "--profile-seconds"),
    (["rebalance", "--migration-timeout", "0"], "--migration-timeout"),
    (["rebalance", "--host", "t1", "--all"], "not allowed with argument"),
    (["rebalance", "--no-share", "--batch-hosts", "2"], "--batch-hosts: only when the run shares its hosts"),
    (["rebalance", "--batch-hosts", "0"], "--batch-hosts"),
    (["rebalance", "--host", "t1", "--round-rest", "5m"], "--round-rest: only when the run shares its hosts"),
])
def test_bad_input_exits_2_naming_the_option(config, args, message):
    code, _, err = vmplacer(config, *args)
    assert code == 2, err
    assert message in err


def test_eval_rebalance_prints_one_case():
    code, row, err = vmplacer(None, "eval", "rebalance", "--pairs", str(E7600), "--seed", "1", "--rounds", "2",
                              "--format", "json")
    assert code == 0, err
    for key in ("matrix", "start", "hosts", "vms", "none", "seed_policy", "blind_spread", "vmplacer", "optimum"):
        assert key in row
    assert row["matrix"] == "e7600_2core_pairs.csv" and row["start"] == "siblings"
    assert row["optimum"] is not None and row["none"] <= row["optimum"]
    assert set(row["per_vm"]["vmplacer"]) == {f"vm{i}" for i in range(row["vms"])}
    # the optimum's layout is rebuilt so the model's rating of it can be compared with its own choice
    assert set(row["model_objective"]) == {"none", "seed_policy", "blind_spread", "vmplacer", "optimum"}
    cpus = [tuple(where) for where in row["optimum_found_by"]["layout"].values()]
    assert row["time_shared_pcpus"]["optimum"] == sum(1 for c in set(cpus) if cpus.count(c) > 1)
    assert row["time_shared_pcpus"]["none"] == 0  # four VMs on the siblings of two cores: one per pCPU
    to_optimum = row["vmplacer_vs_optimum"]  # the step from vmplacer's layout to the optimum's, in truth

    def objective(values):  # the planner's, fairness 0.25 (RebalanceSettings' default)
        return sum(p - 0.25 * max(0.0, 1.0 - p) ** 2 for p in values)
    gain = objective(row["per_vm"]["optimum"].values()) - objective(row["per_vm"]["vmplacer"].values())
    assert abs(to_optimum["true_gain"] - gain) <= 1e-3 and to_optimum["migrations"] >= 0
    assert to_optimum["within_threshold"] == (to_optimum["true_gain"] < to_optimum["threshold"])
    # and against the optimum of that objective, which nothing vmplacer does can beat
    mine = row["objective_optimum"]
    assert mine["fairness"] == 0.25
    assert mine["objective_per_vm"] >= objective(row["per_vm"]["vmplacer"].values()) / row["vms"] - 1e-4
    assert mine["objective_per_vm"] >= objective(row["per_vm"]["optimum"].values()) / row["vms"] - 1e-4
    code, _, err = vmplacer(None, "eval", "rebalance", "--pairs", str(E7600), "--shape", "1x2")
    assert code == 2 and "--shape" in err
    code, _, err = vmplacer(None, "eval", "rebalance", "--pairs", str(E7600), "--vms", "9")
    assert code == 2 and "--vms 9" in err


def test_a_shared_round_rests_before_the_same_hosts_are_done_again(config):
    code, first, err = vmplacer(config, "rebalance", "--share", "--round-rest", "5m", "--profile-seconds", "0",
                                "--format", "json")
    assert code == 0, err
    assert first["round"]["opened"] and first["round"]["done_here"] == ["t1"]
    assert [b["plan_id"] for b in first["round"]["batches"]] == [first["plan"]["id"]]
    code, rested, err = vmplacer(config, "rebalance", "--share", "--round-rest", "5m", "--profile-seconds", "0",
                                 "--format", "json")
    assert code == 0, err
    assert rested["status"] == "nothing-to-do" and rested["plan"] is None
    assert rested["round"]["id"] == first["round"]["id"] and rested["round"]["done_here"] == []
    assert "finished less than 300 s ago" in rested["notes"][-1]
    code, again, err = vmplacer(config, "rebalance", "--share", "--profile-seconds", "0", "--format", "json")
    assert code == 0 and again["round"]["opened"] and again["round"]["id"] != first["round"]["id"], err
