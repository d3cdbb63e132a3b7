"""The climb judges only the offers that could change its choice, and chooses what judging every
host's offer would: the same move, the same declined gain, the same plan."""

from __future__ import annotations

import json
import math
import random

import pytest

from vmplacer.core.model.interference import Exposure, InterferenceModel, Observation
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance import whatif
from vmplacer.core.rebalance.local_moves import LocalOffer, local_offer
from vmplacer.core.rebalance.policy import ClusterState, HostState, RebalanceSettings, describe_guest, plan_rebalance
from vmplacer.core.rebalance.search import start_search
from vmplacer.core.rebalance.whatif import CandidateMove, GuestChange, judge
from vmplacer.core.topology.host import DistanceClass, uniform_topology

KEYS = ("a", "b", "c")
DISTANCES = (DistanceClass.SAME_CORE, DistanceClass.SAME_LLC, DistanceClass.REMOTE_NODE)


def model(seed: int, helpful: bool = False) -> InterferenceModel:
    """Learned from random observations; `helpful`: some runs went faster beside neighbours, so
    some coefficients come out negative."""
    rng = random.Random(seed)
    observations = []
    for _ in range(90):
        neighbours = tuple(Exposure(rng.choice(KEYS), rng.choice(DISTANCES), 1.0) for _ in range(rng.randint(1, 3)))
        ratio = rng.uniform(0.6, 1.4) if helpful else rng.uniform(0.5, 1.0)
        observations.append(Observation(rng.choice(KEYS), ratio, 1.0, neighbours))
    return InterferenceModel().fit(observations)


def fleet(seed: int, counts: list[int]) -> ClusterState:
    """Hosts of 2 nodes x 2 cores x 2 threads with `counts` one-vCPU guests on random pCPUs."""
    rng = random.Random(seed)
    hosts, guests = {}, {}
    for k, count in enumerate(counts):
        name = f"h{k}"
        topology = uniform_topology(nodes=2, cores_per_node=2, threads_per_core=2, name=name)
        hosts[name] = HostState(name, topology)
        for _ in range(count):
            guest = f"g{len(guests)}"
            placement = Placement(guest=guest, host=name, vcpupin={0: frozenset({rng.choice(sorted(topology.cpus))})},
                                  memory_kib=1024 * 1024)
            guests[guest] = describe_guest(placement, labels={"workload": rng.choice(KEYS)})
    return ClusterState(hosts, guests)


def test_a_move_is_never_surer_than_its_bound():
    rng = random.Random(7)
    for _ in range(5000):
        gain, linear = rng.uniform(-1, 1), rng.uniform(-1, 1)
        move = CandidateMove("move", [GuestChange("g", "h", {})], gain, linear,
                             confidence=rng.random(), prior_gain=rng.uniform(-1, 1), guess_weight=rng.random())
        assert move.sure_gain <= LocalOffer((move,)).bound + 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_an_offer_judged_is_never_surer_than_its_bound(seed):
    draft, inputs = start_search(fleet(seed, [7, 5, 6]), model(seed, seed % 2 == 1), RebalanceSettings())
    offers = [local_offer(draft, inputs, host) for host in draft.hosts.values()]
    for offer in offers:
        if offer is not None:
            assert judge(draft, inputs, offer.move(draft, inputs)) <= offer.bound + 1e-9


def plan_text(plan) -> str:
    return json.dumps({"actions": [repr(a) for a in plan.actions], "summary": plan.summary,
                       "settings": plan.settings, "before": plan.objective_before, "after": plan.objective_after},
                      sort_keys=True, default=repr)


CASES = [  # (seed, guests per host, settings): budgets spent, nothing clearing the threshold, migrations
    (0, [7, 5, 6, 4], {}),
    (1, [7, 6, 7, 5, 6], {"max_actions": 2}),
    (2, [6, 6], {"min_gain": 5.0, "min_gain_share": 0.0, "allow_migration": False}),
    (3, [8, 3, 1, 7], {"max_actions": 12}),
    (4, [7, 7, 7], {"allow_migration": False, "max_actions": 4}),
    (5, [5, 6, 7, 2], {"min_gain": 0.2}),
]


@pytest.mark.parametrize("seed,counts,overrides", CASES)
def test_the_climb_picks_what_judging_every_offer_picks(seed, counts, overrides, monkeypatch):
    state, learned = fleet(seed, counts), model(seed, seed % 2 == 1)
    settings = RebalanceSettings(**overrides)
    judged: list[int] = []
    real = whatif._assess
    monkeypatch.setattr(whatif, "_assess", lambda draft, inputs, move: judged.append(1) or real(draft, inputs, move))
    lazy = plan_rebalance(state, learned, settings, now=0.0)
    lazy_count = len(judged)
    monkeypatch.setattr(LocalOffer, "bound", property(lambda offer: math.inf))
    monkeypatch.setattr(LocalOffer, "most_gain", property(lambda offer: math.inf))
    judged.clear()
    every = plan_rebalance(state, learned, settings, now=0.0)
    assert plan_text(lazy) == plan_text(every)
    assert lazy_count <= len(judged)


def test_judging_only_what_could_matter_judges_fewer_offers(monkeypatch):
    state, learned = fleet(11, [7, 6, 7, 6, 7, 6, 7, 6]), model(11)
    judged: list[int] = []
    real = whatif._assess
    monkeypatch.setattr(whatif, "_assess", lambda draft, inputs, move: judged.append(1) or real(draft, inputs, move))
    plan_rebalance(state, learned, RebalanceSettings(allow_migration=False), now=0.0)
    lazy = len(judged)
    monkeypatch.setattr(LocalOffer, "bound", property(lambda offer: math.inf))
    monkeypatch.setattr(LocalOffer, "most_gain", property(lambda offer: math.inf))
    judged.clear()
    plan_rebalance(state, learned, RebalanceSettings(allow_migration=False), now=0.0)
    assert lazy < len(judged)
