"""A few cases of the frozen plan corpus (benchmarks/plan_corpus.py), planned again: a change
that alters what the planner decides fails here, naming the case."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# quick cases that still cover migrations between hosts, a second run's history (measured,
# tried, refuted, held), the linear predictor, floating and dedicated guests on a big host
SUBSET = (
    "bench/e7600_2core_pairs.csv/2 hosts, 2 cores x 2 threads, 4 VMs/",
    "bench/e7600_2core_pairs.csv/1 host, 4 cores x 2 threads, 8 VMs/siblings",
    "nodata/",
    "shapes/112/",
)


def _corpus():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("plan_corpus", ROOT / "benchmarks" / "plan_corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("plan_corpus", module)
    spec.loader.exec_module(module)
    return module


def test_plans_of_the_corpus_subset_are_as_recorded():
    corpus = _corpus()
    recorded = json.loads(corpus.OUT.read_text())["plans"]
    found, _ = corpus.run(SUBSET, quiet=True)
    assert len(found) >= 10, f"the subset names too few cases: {sorted(found)}"
    assert set(found) <= set(recorded), f"cases missing from {corpus.OUT}: {sorted(set(found) - set(recorded))}"
    changed = corpus.differences(found, recorded)
    assert not changed, (
        f"{len(changed)} plans of the frozen corpus changed: {changed}. Plans must stay byte-for-byte "
        "the same unless a change is meant to alter them; regenerate the corpus with "
        "`python benchmarks/plan_corpus.py` only when the change is deliberate and measured.")


def test_the_canonical_json_leaves_out_only_the_solver_effort():
    corpus = _corpus()
    name, builder, _ = next(c for c in corpus.case_builders() if c[0].startswith(SUBSET[0]) and c[2] is None)
    plan = builder().plan()
    data = json.loads(corpus.canonical(plan))
    assert data["actions"] == [a.to_dict() for a in plan.actions], name
    assert data["summary"] == plan.summary
    notes = plan.settings["notes"]
    assert [{k: v for k, v in r.items() if k not in corpus.SOLVER_EFFORT} for r in notes["exact"]] == \
        data["notes"]["exact"]
    assert {k: v for k, v in data["notes"].items() if k != "exact"} == {
        k: v for k, v in json.loads(json.dumps(notes, default=corpus._jsonable)).items() if k != "exact"}
