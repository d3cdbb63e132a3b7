"""Several instances share a rebalance round on one database (SQLite file and PostgreSQL):
three OS processes each run a shared `rebalance --all` over the same simulated fleet; every host
is planned and applied exactly once, each instance does a share; an instance killed while it
holds leases has its hosts taken over by another once the lease lapses."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

from sqlalchemy import select

from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.models import HostLeaseRow, PlanRow, RebalanceRoundHostRow, RebalanceRoundRow
from vmplacer.adapters.db.rounds import SqlRoundStore
from vmplacer.lab.shared_rounds import run_instance

HOSTS, GUESTS = 12, 6
SPAWN = multiprocessing.get_context("spawn")  # a fresh interpreter each, as separate instances are


def _start(url: str, holder: str, tmp_path: Path, **kwargs) -> tuple[multiprocessing.Process, Path]:
    out = tmp_path / f"{holder}.json"
    process = SPAWN.Process(target=run_instance, args=(url, holder),
                            kwargs={"hosts": HOSTS, "guests": GUESTS, "out": str(out), **kwargs})
    process.start()
    return process, out


def _rows(url: str):
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            rounds = list(session.scalars(select(RebalanceRoundRow)))
            hosts = list(session.scalars(select(RebalanceRoundHostRow)))
            plans = list(session.scalars(select(PlanRow)))
            return rounds, hosts, plans
    finally:
        engine.dispose()


def _every_host_once(url: str, reports: list[dict]) -> dict[str, str]:
    """The round is finished, each host done once and covered by exactly one plan made by the
    instance that marked it; host -> the instance that did it."""
    rounds, hosts, plans = _rows(url)
    assert len(rounds) == 1 and rounds[0].finished_at is not None and rounds[0].open_key is None
    fleet = {f"h{i:03d}" for i in range(HOSTS)}
    assert {r.host for r in hosts} == fleet and all(r.done_at is not None for r in hosts)
    done_by = {r.host: r.done_by for r in hosts}
    covering: dict[str, list[int]] = {}
    for plan in plans:
        for host in plan.hosts:
            covering.setdefault(host, []).append(plan.id)
    assert {h: len(ids) for h, ids in covering.items()} == {h: 1 for h in fleet}, "a host planned twice or never"
    by_plan = {p.id: p for p in plans}
    for row in hosts:
        plan = by_plan[row.plan_id]
        assert plan.created_by == row.done_by and row.host in plan.hosts
        assert plan.state in ("succeeded", "empty"), (plan.id, plan.state, plan.message)
    reported = {h: r["holder"] for r in reports for h in r["round"]["done_here"]}
    assert reported == done_by, "the reports must say which hosts each instance did"
    return done_by


def test_three_instances_share_a_round_each_host_exactly_once(migrated_url, tmp_path):
    together = SPAWN.Barrier(3)  # the three start planning once all have loaded, whatever the load
    started = [_start(migrated_url, f"instance-{i}", tmp_path, batch_hosts=2, lease_ttl_s=60.0, profile_s=0.2,
                      barrier=together) for i in range(3)]
    for process, _ in started:
        process.join(120)
        assert process.exitcode == 0
    reports = [json.loads(out.read_text()) for _, out in started]
    done_by = _every_host_once(migrated_url, reports)
    for report in reports:
        assert report["round"]["done_here"], f"{report['holder']} did no share of the round"
        assert report["status"] == "applied", report["notes"]
        assert all(b["status"] == "applied" for b in report["round"]["batches"]), report["round"]
    assert sorted(set(done_by.values())) == [r["holder"] for r in reports]
    assert sum(1 for r in reports if r["round"]["opened"]) == 1, "one instance opens the round, the others join"
    # A run of the same selection after the round finished opens the next round.
    later = run_instance(migrated_url, "later", hosts=HOSTS, guests=GUESTS, batch_hosts=HOSTS, lease_ttl_s=60.0)
    assert later["round"]["opened"] and len(later["round"]["done_here"]) == HOSTS


def test_a_killed_instance_hosts_are_taken_over_after_its_lease(migrated_url, tmp_path):
    ttl = 4.0
    victim, _ = _start(migrated_url, "victim", tmp_path, batch_hosts=3, lease_ttl_s=ttl, hang_in_profile=True)
    engine = make_engine(migrated_url)
    sessions = make_session_factory(engine)
    try:
        held: list[HostLeaseRow] = []
        deadline = time.monotonic() + 60
        # SQLite claims a batch one host per statement: wait for the whole batch, not its first host.
        while len(held) < 3 and time.monotonic() < deadline:
            with sessions() as session:
                held = list(session.scalars(select(HostLeaseRow).where(HostLeaseRow.holder == "victim")))
            time.sleep(0.1)
        assert [r.host for r in held] == ["h000", "h001", "h002"], "the victim never claimed its batch"
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        killed_at = time.time()
        lapse = max(r.expires_at.timestamp() for r in held)
        survivors = [_start(migrated_url, f"survivor-{i}", tmp_path, batch_hosts=3, lease_ttl_s=ttl)
                     for i in range(2)]
        for process, _ in survivors:
            process.join(120)
            assert process.exitcode == 0
        reports = [json.loads(out.read_text()) for _, out in survivors]
        done_by = _every_host_once(migrated_url, reports)
        assert "victim" not in done_by.values()
        with sessions() as session:
            taken = list(session.scalars(select(RebalanceRoundHostRow)
                                         .where(RebalanceRoundHostRow.host.in_([r.host for r in held]))))
        assert all(r.done_by.startswith("survivor-") for r in taken)
        assert all(r.done_at.timestamp() >= lapse for r in taken), "taken over before the lease lapsed"
        assert lapse > killed_at - ttl  # the test's own check: the lease was live when the victim died
        progress = SqlRoundStore(sessions).progress(1, "anyone")
        assert progress.pending == () and progress.busy == {}
    finally:
        engine.dispose()
        if victim.is_alive():
            victim.kill()


def test_three_cli_instances_running_rebalance_all_share_one_round(migrated_url, tmp_path):
    """`vmplacer rebalance --all` started three times at once (as a timer on three machines does),
    on libvirt's test driver: each host is done once, by one of them, covered by one plan."""
    import subprocess

    from tests.support import VMPLACER, clean_env, require

    try:
        import libvirt  # noqa: F401
    except ImportError:
        require(False, "libvirt-python is not installed")
    names = [f"t{i}" for i in range(6)]
    config = tmp_path / "vmplacer.yaml"
    config.write_text(f"database_url: {migrated_url}\ndata_dir: {tmp_path}\nhosts:\n"
                      + "".join(f"  - {{name: {n}, uri: \"test:///default\"}}\n" for n in names))
    command = [VMPLACER, "--config", str(config), "rebalance", "--all", "--profile-seconds", "0",
               "--batch-hosts", "1", "--format", "json"]
    processes = [subprocess.Popen(command, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]
    outputs = [p.communicate(timeout=180) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], [err for _, err in outputs]
    reports = [json.loads(out) for out, _ in outputs]
    rounds, hosts, plans = _rows(migrated_url)
    assert len(rounds) == 1 and rounds[0].finished_at is not None
    assert sorted(r.host for r in hosts) == names and all(r.done_at is not None for r in hosts)
    assert sorted(h for p in plans for h in p.hosts) == names, "each host in exactly one plan"
    done_here = [h for r in reports for h in r["round"]["done_here"]]
    assert sorted(done_here) == names, "the instances' reports partition the fleet"
    assert {r["round"]["id"] for r in reports} == {rounds[0].id}
    assert all(r["status"] == "nothing-to-do" for r in reports), [r["notes"] for r in reports]
