"""The round store on SQLite and PostgreSQL: one open round per selection, claims that never
hand out a host done or leased live by another, done marked only by the lease's holder, a
finished round that rests, and a run that leaves hosts held by someone else for the next run."""

from __future__ import annotations

import time

from vmplacer.adapters.db.plans import SqlLeaseStore
from vmplacer.adapters.db.rounds import SqlRoundStore
from vmplacer.app.rebalance.rebalancer import round_key
from vmplacer.lab.shared_rounds import run_instance

HOSTS = ["h000", "h001", "h002", "h003"]


def test_join_claim_done_and_rest(sessions):
    rounds, leases = SqlRoundStore(sessions), SqlLeaseStore(sessions)
    key = round_key(HOSTS, dry_run=False)
    first = rounds.join(key, HOSTS, "a", dry_run=False)
    second = rounds.join(key, HOSTS, "b", dry_run=False)
    assert first.opened and not second.opened and first.id == second.id
    dry = rounds.join(round_key(HOSTS, dry_run=True), HOSTS, "a", dry_run=True)
    assert dry.id != first.id, "a dry run must not share (and use up) a real round"

    assert rounds.claim(first.id, "a", 2, 60) == ["h000", "h001"]
    assert rounds.claim(first.id, "b", 5, 60) == ["h002", "h003"]
    assert rounds.claim(first.id, "c", 5, 60) == [], "every pending host is leased live by another"
    assert rounds.progress(first.id, "c").busy == {"h000": "a", "h001": "a", "h002": "b", "h003": "b"}
    assert rounds.progress(first.id, "c").foreign == (), "leased by the instances that claimed them"

    assert rounds.mark_done(first.id, ["h002", "h003"], "a", None, "applied") == [], "a is not their holder"
    assert rounds.mark_done(first.id, ["h000", "h001"], "a", 7, "applied") == ["h000", "h001"]
    leases.release(["h000", "h001"], "a")
    assert rounds.claim(first.id, "c", 5, 60) == [], "done hosts are not claimed again, free or not"

    leases.release(["h003"], "b")
    leases.acquire(["h003"], "b", 0.2)  # b's lease lapses: b stopped
    time.sleep(0.4)
    assert rounds.claim(first.id, "c", 5, 60) == ["h003"], "an expired lease's host is taken over"
    assert rounds.mark_done(first.id, ["h003"], "b", None, "applied") == [], "b lost it to c"
    assert rounds.mark_done(first.id, ["h003"], "c", 8, "nothing-to-do") == ["h003"]
    assert rounds.progress(first.id, "c").pending == ("h002",)
    assert rounds.mark_done(first.id, ["h002"], "b", 9, "applied") == ["h002"]
    assert rounds.progress(first.id, "c").pending == ()
    done = {r["host"]: (r["done_by"], r["plan_id"]) for r in rounds.hosts(first.id)}
    assert done == {"h000": ("a", 7), "h001": ("a", 7), "h002": ("b", 9), "h003": ("c", 8)}

    rested = rounds.join(key, HOSTS, "d", dry_run=False, rest_s=600)
    assert rested.finished and rested.id == first.id
    fresh = rounds.join(key, HOSTS, "d", dry_run=False)
    assert fresh.opened and fresh.id != first.id


def test_a_run_leaves_hosts_someone_else_keeps_for_the_next_run(migrated_url, sessions):
    """A host leased outside the round (an API job) that keeps it: the run does the others, does
    not wait a lease TTL for it (only --wait, here 0), leaves it pending; the next run joins the
    same round and does it."""
    held = SqlLeaseStore(sessions)
    assert held.acquire(["h001"], "api-job", 120)
    ttl = 600.0
    first = run_instance(migrated_url, "first", hosts=4, guests=6, batch_hosts=2, lease_ttl_s=ttl)
    assert first["round"]["opened"] and first["round"]["left"] == ["h001"]
    assert sorted(first["round"]["done_here"]) == ["h000", "h002", "h003"]
    assert any("still held by api-job after 0 s outside this round" in note for note in first["notes"]), \
        first["notes"]
    assert first["wall_s"] < ttl, "a host held outside the round must not be waited for a lease TTL"
    held.release(["h001"], "api-job")
    second = run_instance(migrated_url, "second", hosts=4, guests=6, batch_hosts=2, lease_ttl_s=ttl)
    assert second["round"]["id"] == first["round"]["id"] and not second["round"]["opened"]
    assert second["round"]["done_here"] == ["h001"] and second["round"]["left"] == []


def test_prune_deletes_finished_rounds_and_keeps_open_ones(sessions):
    from datetime import datetime, timedelta, timezone

    from vmplacer.adapters.db.retention import Pruner, RetentionAges

    rounds = SqlRoundStore(sessions)
    key = round_key(HOSTS, dry_run=False)
    finished = rounds.join(key, HOSTS, "a", dry_run=False)
    assert rounds.claim(finished.id, "a", 10, 60) == HOSTS
    rounds.mark_done(finished.id, HOSTS, "a", None, "nothing-to-do")
    SqlLeaseStore(sessions).release(HOSTS, "a")
    still_open = rounds.join(key, HOSTS, "b", dry_run=False)
    later = datetime.now(timezone.utc) + timedelta(days=60)
    ages = RetentionAges(plans_s=86400, profiles_s=86400, audit_s=86400, jobs_s=86400)
    report = Pruner(sessions).prune(ages, now=later)
    assert report.counts["rebalance_rounds"] == 1 and report.counts["rebalance_round_hosts"] == len(HOSTS)
    assert rounds.hosts(finished.id) == []
    assert [r["host"] for r in rounds.hosts(still_open.id)] == HOSTS, "an open round is never pruned"
