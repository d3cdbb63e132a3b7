"""How `vmplacer plans ID` names a trial probe: its kind, and the hosts a migration's trial judges together."""

from __future__ import annotations

from vmplacer.cli.rebalance import action_change_text


def probe(trial: dict) -> dict:
    return {"kind": "probe", "host": "h1", "target_host": None, "parameters": {"seconds": 3.0, "trial": trial}}


def test_a_migration_trial_names_the_hosts_it_judges_together():
    assert action_change_text(probe({"kind": "confirm", "hosts": ["h1", "h2"]})) == (
        "Freeze'nSense 3.0 s, confirm trial of h1 + h2 together")


def test_a_one_host_trial_names_only_its_kind():
    assert action_change_text(probe({"kind": "explore"})) == "Freeze'nSense 3.0 s, explore trial"
    assert action_change_text(probe({"kind": "confirm", "hosts": ["h1"]})) == "Freeze'nSense 3.0 s, confirm trial"
