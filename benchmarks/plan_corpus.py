"""A frozen corpus of rebalance plans: any change that alters a plan shows here, case by case.

    python benchmarks/plan_corpus.py [--out benchmarks/results/plan_corpus.json]   # write the hashes
    python benchmarks/plan_corpus.py --check [--only PREFIX ...]                   # compare; exit 1 on a difference

The corpus is a deterministic set of `plan_rebalance` inputs (no clock, no simulator run; every
draw seeded), planned with the product's defaults and CP-SAT on small hosts (a deterministic time
limit and one worker: a loaded machine changes no answer):

- bench/…: the starting points of `benchmarks/rebalance.py` (every pair matrix × host shape ×
  start, seed 0, `max_actions` = the VMs as there), as the cluster state the rebalancer reads,
  with a model learned from Freeze'nSense samples of that matrix; each also planned a second time
  (…/round2) with a history drawn from the first plan (its trials measured one way or the other,
  the hosts it tried, refuted and held, guests moved), so the stages that read the history run.
- nodata/…: a few of them with no learned data (the linear predictor: time sharing only).
- mult/…: a few with the model's multiplicative form (the small and the two-node shapes: on a
  full host its relinearized exact layouts take seconds each).
- scale/…: `rebalance_scale.py`'s fleet (uniform 2 × 12 × 2 hosts, one-vCPU guests pinned at
  random), 100 hosts × 40 guests, and 20 × 40 in the multiplicative form.
- shapes/…: `host_shapes.py`'s big hosts, 112 pCPUs, 20 guests: unpinned, node-floating,
  dedicated and overcommit mixes.

Each case is recorded as the sha256 of its plan's canonical JSON (actions, notes, summary, the
objective before and after and the predicted performances; sorted keys, no spaces; what the exact
solver reports of its effort — wall seconds, bound, deterministic work — left out: it varies
between identical runs). `--check`
plans every case again and names each one whose hash differs. CP-SAT's wall-clock safety net is
lifted while the corpus plans (`WALL_NET_S`): under a load far past the machine's cores it would
cut some solves short and change their plans; the deterministic limit alone decides.
Regenerate the file only when a change to plans is deliberate and measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # one BLAS thread: sums in one order on any machine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import host_shapes  # noqa: E402
from benchmarks import rebalance as bench  # noqa: E402
from vmplacer.adapters.cpsat_layout import CpSatLayoutSolver  # noqa: E402
from vmplacer.core.model.interference import MULTIPLICATIVE, InterferenceModel, ModelConfig  # noqa: E402
from vmplacer.core.model.pairs import parse_pairs  # noqa: E402
from vmplacer.core.placement.guest_placement import Placement  # noqa: E402
from vmplacer.core.rebalance.plan import Plan  # noqa: E402
from vmplacer.core.rebalance.policy import plan_rebalance  # noqa: E402
from vmplacer.core.rebalance.state import ClusterState, HostState, RebalanceSettings, describe_guest  # noqa: E402
from vmplacer.core.rebalance.trial import Backoff  # noqa: E402
from vmplacer.lab.evaluate import ProfileSettings, profile_host  # noqa: E402
from vmplacer.lab.rebalance_eval import Case, starting_point  # noqa: E402
from vmplacer.lab.simulator import SimCluster  # noqa: E402
from vmplacer.core.topology.host import uniform_topology  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "plan_corpus.json"
NOW = 1_000_000.0  # the planner's clock in every case (epoch seconds)
# what the exact solver reports of its effort, not of its answer: its wall seconds are the
# machine's, and CP-SAT's bound and deterministic work vary between identical runs (one worker,
# one seed) when it stops short of proving its layout optimal; status, objective and gain stay
SOLVER_EFFORT = frozenset({"seconds", "bound", "work"})
# CP-SAT stops at its deterministic limit; its wall-clock safety net (ten times that, at least
# one second: vmplacer/adapters/cpsat_layout.py) is lifted to this while the corpus plans, so
# that a machine loaded far past its cores (a time-shared solve gets a small share of the
# limit) cannot cut a solve short and change a plan
WALL_NET_S = 3600.0


@dataclass(frozen=True)
class PlanCase:
    """One planning call: the state, the model, the settings and the history it is given."""

    name: str
    state: ClusterState
    model: InterferenceModel
    settings: RebalanceSettings
    history: dict[str, Any] = field(default_factory=dict)  # plan_rebalance's history keywords

    def plan(self) -> Plan:
        with deterministic_cp_sat():
            return plan_rebalance(self.state, self.model, self.settings, now=NOW, solver=CpSatLayoutSolver(),
                                  **self.history)


@contextmanager
def deterministic_cp_sat() -> Iterator[None]:
    """CP-SAT with its wall-clock safety net at `WALL_NET_S`, within the block only."""
    from ortools.sat.python import cp_model

    solve = cp_model.CpSolver.solve

    def deterministic(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        self.parameters.max_time_in_seconds = WALL_NET_S
        return solve(self, model, *args, **kwargs)

    cp_model.CpSolver.solve = deterministic  # type: ignore[method-assign]
    try:
        yield
    finally:
        cp_model.CpSolver.solve = solve  # type: ignore[method-assign]


def canonical(plan: Plan) -> str:
    """The plan's canonical JSON: what the planner decided, not when or under which id."""
    data = plan.to_dict()
    notes = dict(data["settings"].get("notes") or {})
    notes["exact"] = [{k: v for k, v in report.items() if k not in SOLVER_EFFORT} for report in notes.get("exact", [])]
    kept = {"actions": data["actions"], "notes": notes, "summary": data["summary"],
            "objective_before": data["objective_before"], "objective_after": data["objective_after"],
            "predicted": data["predicted"]}
    return json.dumps(kept, sort_keys=True, separators=(",", ":"), default=_jsonable)


def _jsonable(value: object) -> object:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def digest(plan: Plan) -> str:
    return hashlib.sha256(canonical(plan).encode()).hexdigest()


# ----------------------------------------------------------------------------- models
@cache
def matrix_model(matrix: str, form: str | None = None) -> InterferenceModel:
    """A model learned the production way from Freeze'nSense samples of random simulated hosts of
    `matrix` (as `benchmarks/rebalance.py`'s `trained_model` does for the first matrix)."""
    path = ROOT / "tests" / "data" / "interference" / matrix
    table = parse_pairs(path.read_text(), path.name)
    cluster = SimCluster(table, seed=1)
    rng = random.Random(1)
    observations = []
    for index in range(8):
        topology = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2, name=f"t{index}")
        host = cluster.add_host(f"t{index}", topology)
        for vm in range(8):
            host.define_domain(f"t{index}-{vm}", workload=rng.choice(table.workloads),
                               vcpupin=[rng.randrange(16)], workload_class="batch")
        observations += profile_host(host, cluster.sampler(host), cluster.clock, ProfileSettings(rounds=2))
    return InterferenceModel(bench.model_config(form)).fit(observations)


@cache
def fleet_model(form: str | None = None) -> InterferenceModel:
    return bench.trained_model(form=form)


def no_data_model() -> InterferenceModel:
    return InterferenceModel(ModelConfig(distance_prior=bench.DISTANCE_PRIOR))


# ----------------------------------------------------------------------------- states
def bench_state(matrix: str, label: str, start: str, hosts: int, vms: int, shape: Any, mix: str) -> ClusterState:
    """The starting point of one case of the rebalance benchmark, as the rebalancer reads it."""
    path = ROOT / "tests" / "data" / "interference" / matrix
    table = parse_pairs(path.read_text(), path.name)
    begin = starting_point(table, Case(start, hosts, vms, shape, 0, mix))
    host_states = {f"host{i}": HostState(f"host{i}", shape.topology(f"host{i}")) for i in range(hosts)}
    guests = {}
    for vm, (host, cpu) in sorted(begin.placement.items()):
        placement = Placement(guest=vm, host=host, vcpupin={0: frozenset({cpu})}, memory_kib=1024 * 1024)
        guests[vm] = describe_guest(placement, labels={"workload": begin.workloads[vm], "workload_class": "batch"})
    return ClusterState(host_states, guests)


def shapes_state(model: InterferenceModel, pcpus: int, mix: str, guests: int) -> ClusterState:
    """One big host of `host_shapes.py` (its seed 1)."""
    host, placed = host_shapes.build_host("h0", pcpus, mix, guests, sorted(model.known_keys()), 1)
    return ClusterState({"h0": host}, {p.guest: describe_guest(p, labels=labels) for p, labels in placed})


def history_after(plan: Plan, state: ClusterState) -> dict[str, Any]:
    """A second run's history, drawn from the first plan: its trials measured (confirm trials
    worse, the others alternately better and worse), one layout tried on each host a trial
    touched, confirm hosts refuted, the first of them held (back-off), every moved guest moved
    once and pooled when it floats."""
    measured, tried, refuted = [], {}, []
    probes = [a for a in plan.actions if a.kind == "probe" and a.parameters.get("trial")]
    for number, action in enumerate(probes):
        trial = action.parameters["trial"]
        hosts = list(trial.get("hosts", [action.host]))
        worse = trial["kind"] == "confirm" or number % 2 == 0
        here, there = trial["from_key"], trial["to_key"]
        measured.append((here, there) if worse else (there, here))
        for host in hosts:
            tried[host] = tried.get(host, 0) + 1
        if trial["kind"] == "confirm" and worse:
            refuted.extend(hosts)
    moved = sorted({a.guest for a in plan.actions if a.guest is not None})
    held = {refuted[0]: Backoff(refuted[0], 1, NOW + 600.0)} if refuted else {}
    pooled = [g for g in moved if state.guests[g].placement.vcpupin
              and all(len(p) > 1 for p in state.guests[g].placement.vcpupin.values())]
    return {"measured": measured, "tried": tried, "refuted": sorted(set(refuted)), "held": held,
            "pooled": pooled, "moves_last_hour": {g: 1 for g in moved},
            "last_moved": {g: NOW - 10_000.0 for g in moved[:1]}}


# ----------------------------------------------------------------------------- the corpus
Builder = Callable[[], PlanCase]


def case_builders() -> Iterator[tuple[str, Builder | Callable[[Plan], PlanCase], str | None]]:
    """(name, builder, the case whose plan the builder takes, or None) in the corpus's order."""
    no_data = {"e7600_2core_pairs.csv"}
    for path in bench.matrices():
        matrix = path.name
        for label, hosts, vms, shape, mix in bench.SHAPES:
            for start in ("siblings", "random"):
                name = f"bench/{matrix}/{label}/{start}"

                def first(matrix=matrix, label=label, start=start, hosts=hosts, vms=vms, shape=shape, mix=mix,
                          name=name) -> PlanCase:
                    return PlanCase(name, bench_state(matrix, label, start, hosts, vms, shape, mix),
                                    matrix_model(matrix), RebalanceSettings(max_actions=vms))
                yield name, first, None

                def second(plan: Plan, first=first, name=name) -> PlanCase:
                    case = first()
                    return PlanCase(f"{name}/round2", case.state, case.model, case.settings,
                                    history_after(plan, case.state))
                yield f"{name}/round2", second, name

                if start == "random" and (matrix in no_data or mix == "hungry-compute"):
                    def linear(matrix=matrix, label=label, start=start, hosts=hosts, vms=vms, shape=shape,
                               mix=mix) -> PlanCase:
                        return PlanCase(f"nodata/{matrix}/{label}/{start}",
                                        bench_state(matrix, label, start, hosts, vms, shape, mix),
                                        no_data_model(), RebalanceSettings(max_actions=vms))
                    yield f"nodata/{matrix}/{label}/{start}", linear, None
                if start == "siblings" and matrix == bench.matrices()[0].name and (vms <= 4 or shape.nodes > 1):
                    def multiplicative(matrix=matrix, label=label, start=start, hosts=hosts, vms=vms,
                                       shape=shape, mix=mix) -> PlanCase:
                        return PlanCase(f"mult/{matrix}/{label}/{start}",
                                        bench_state(matrix, label, start, hosts, vms, shape, mix),
                                        matrix_model(matrix, MULTIPLICATIVE), RebalanceSettings(max_actions=vms))
                    yield f"mult/{matrix}/{label}/{start}", multiplicative, None
    for mix in ("unpinned", "node", "dedicated", "overcommit"):
        def big(mix=mix) -> PlanCase:
            model = fleet_model()
            return PlanCase(f"shapes/112/{mix}/20", shapes_state(model, 112, mix, 20), model, RebalanceSettings())
        yield f"shapes/112/{mix}/20", big, None
    for hosts, guests, form in ((20, 40, MULTIPLICATIVE), (100, 40, None)):
        label = f"scale/{hosts}x{guests}" + (f"/{form}" if form else "")

        def fleet(hosts=hosts, guests=guests, form=form, label=label) -> PlanCase:
            model = fleet_model(form)
            return PlanCase(label, bench.scale_fleet(model, hosts, guests), model, RebalanceSettings())
        yield label, fleet, None


def run(only: Sequence[str] = (), quiet: bool = False) -> tuple[dict[str, str], dict[str, float]]:
    """Every case (or those whose name starts with one of `only`, with the cases they need):
    name -> plan hash, and name -> seconds spent planning it."""
    hashes: dict[str, str] = {}
    seconds: dict[str, float] = {}
    plans: dict[str, Plan] = {}
    builders = list(case_builders())
    wanted = {name for name, _, _ in builders if not only or any(name.startswith(p) for p in only)}
    wanted |= {needs for name, _, needs in builders if name in wanted and needs is not None}
    for name, builder, needs in builders:
        if name not in wanted:
            continue
        case = builder(plans[needs]) if needs is not None else builder()  # type: ignore[call-arg]
        began = time.perf_counter()
        plan = case.plan()
        seconds[name] = round(time.perf_counter() - began, 3)
        plans[name] = plan
        hashes[name] = digest(plan)
        if not quiet:
            print(f"{seconds[name]:7.2f} s  {len(plan.actions):5d} actions  {name}", flush=True)
    return hashes, seconds


def differences(found: dict[str, str], recorded: dict[str, str]) -> list[str]:
    """The cases whose plans differ from the recorded ones (or that one side lacks)."""
    return sorted(name for name in found.keys() | recorded.keys()
                  if name in found and found[name] != recorded.get(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(OUT), help="the corpus file (written, or read with --check)")
    parser.add_argument("--check", action="store_true", help="compare with the corpus file; exit 1 on a difference")
    parser.add_argument("--only", action="append", default=[], metavar="PREFIX",
                        help="only the cases whose name starts with PREFIX (repeatable)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    hashes, seconds = run(args.only)
    total = round(time.perf_counter() - began, 1)
    if args.check:
        recorded = json.loads(Path(args.out).read_text())["plans"]
        missing = sorted(name for name in hashes if name not in recorded)
        changed = [name for name in differences(hashes, recorded) if name not in missing]
        for name in changed:
            print(f"plan changed: {name}")
        for name in missing:
            print(f"not in the corpus: {name}")
        if changed or missing:
            print(f"{len(changed) + len(missing)} of {len(hashes)} cases differ from {args.out} ({total} s); "
                  "regenerate it only when the change is deliberate and measured")
            return 1
        print(f"all {len(hashes)} plans as recorded ({total} s)")
        return 0
    if args.only:
        parser.error("--only applies to --check (the corpus file holds every case)")
    result = {"machine": bench.machine(), "total_s": total, "cases": len(hashes),
              "plans": hashes, "seconds": seconds}
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    print(f"{len(hashes)} plans in {total} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
