"""Stored profiles (SQLite and PostgreSQL) and the `vmplacer profile` command's
offline parts: `show` tables, JSON and plots from stored samples, option errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.support import run_vmplacer
from vmplacer.adapters.db import migrate
from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.profiles import SqlProfileStore
from vmplacer.cli.common import parse_duration
from vmplacer.cli.profile import show_data
from vmplacer.cli.common import UsageError
from vmplacer.ports import Neighbour, ProfileSample


def store_for(url: str) -> SqlProfileStore:
    migrate.upgrade(url)
    return SqlProfileStore(make_session_factory(make_engine(url)))


def fill(store: SqlProfileStore, guests: dict[str, tuple[float, float]], n: int = 25, host: str = "h1") -> int:
    """One finished run; each guest's ζ ~ N(shared, 0.02), ζb ~ N(alone, 0.02)."""
    rng = np.random.default_rng(5)
    run = store.start_run(host, "cpu", {"t_m_ms": 10.0})
    samples = []
    for guest, (shared, alone) in guests.items():
        others = tuple(Neighbour(o, "same-cpu", True) for o in guests if o != guest)
        for i in range(n):
            samples.append(ProfileSample(guest, "zeta", "cpu", float(rng.normal(shared, 0.02)), 0.01, 10.0,
                                         1_700_000_000.0 + i))
            samples.append(ProfileSample(guest, "zeta_b", "cpu", float(rng.normal(alone, 0.02)), 0.01, 10.0,
                                         1_700_000_000.0 + i, others, freeze_ms=14.5))
    store.add_samples(run, samples)
    store.finish_run(run, {"vms": list(guests)})
    return run


def test_runs_and_samples_round_trip(database_url):
    store = store_for(database_url)
    first = fill(store, {"a": (0.5, 1.0), "b": (0.5, 1.0)})
    second = fill(store, {"a": (0.8, 0.9)})
    assert store.latest_run_with(["a"]).id == second
    assert store.latest_run_with(["a", "b"]).id == first
    assert store.latest_run_with(["nobody"]) is None
    assert store.latest_run_with(["a"], host="h1").id == second
    assert store.latest_run_with(["a"], host="elsewhere") is None
    run = store.run(first)
    assert run.status == "finished" and run.finished_at is not None and run.results == {"vms": ["a", "b"]}
    rows = store.samples(first, "a")
    assert len(rows) == 50
    frozen = [r for r in rows if r["kind"] == "zeta_b"]
    assert frozen[0]["neighbours"] == [{"name": "b", "distance": "same-cpu", "frozen": True}]
    assert frozen[0]["freeze_ms"] == pytest.approx(14.5)
    assert abs(frozen[0]["at"] - 1_700_000_000.0) < 1


def test_show_data_recomputes_the_distributions(database_url):
    store = store_for(database_url)
    run = fill(store, {"a": (0.5, 1.0), "b": (0.9, 0.9)})
    data = show_data(store, ["a", "b"], None)
    assert data["run"]["id"] == run
    a, b = data["vms"]["a"], data["vms"]["b"]
    values = a["values"]
    assert a["degradation"]["estimate"] == pytest.approx(1 - np.median(values["zeta"]) / np.median(values["zeta_b"]))
    assert 0.4 < a["degradation"]["estimate"] < 0.6
    assert abs(b["degradation"]["estimate"]) < 0.1
    assert a["zeta"]["n"] == a["zeta_b"]["n"] == 25
    with pytest.raises(UsageError, match="no a profiling run with ghost"):
        show_data(store, ["ghost"], None)
    with pytest.raises(UsageError, match="no run 999"):
        show_data(store, ["a"], 999)


@pytest.mark.parametrize(("text", "unit", "seconds"),
                         [("10ms", "ms", 0.01), ("2.5s", "ms", 2.5), ("500us", "s", 0.0005), ("1m", "s", 60.0),
                          ("10", "ms", 0.01), ("0.5", "s", 0.5), (" 3 ms ", "s", 0.003)])
def test_durations(text, unit, seconds):
    assert parse_duration(text, "--tm", unit) == pytest.approx(seconds)


# ----- the command --------------------------------------------------------------------------------


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer("--config", str(config), "profile", *args)


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "vmplacer.yaml"
    path.write_text(
        f"database_url: sqlite:///{tmp_path / 'v.db'}\n"
        "hosts:\n  - {name: h1, uri: 'qemu+tcp://192.0.2.1:1/system'}\n"  # never contacted here
        "profiler: {t_m_ms: 10, t_sleep_s: 10, max_freeze_ms: 200}\n"
    )
    return path


@pytest.mark.parametrize(
    ("args", "option"),
    [(("--tm", "10xs"), "--tm"), (("--tsleep", "soon"), "--tsleep"), (("--tm", "300ms"), "--tm"),
     (("--max-freeze", "-5ms"), "--max-freeze"), (("--duration", "0s"), "--duration"),
     (("--samples", "0"), "--samples"), (("--sensitive", "tier=1"), "--sensitive"),
     (("--probe", "web"), "--probe"), (("--probe", "web=ftp://x"), "--probe"), (("--host", "nope"), "--host"),
     (("show",), "name at least one VM"), (("show", "a", "--plot", "x.gif"), "--plot"),
     (("show", "a", "--tm", "5ms"), "--tm")],
)
def test_bad_options_exit_2_naming_the_option(config, args, option):
    result = cli(config, *args)
    assert result.returncode == 2, result.stderr
    assert option in result.stderr


def test_show_prints_tables_json_and_plots(config, tmp_path):
    store = SqlProfileStore(make_session_factory(make_engine(f"sqlite:///{tmp_path / 'v.db'}")))
    migrate.upgrade(f"sqlite:///{tmp_path / 'v.db'}")
    run = fill(store, {"web": (0.5, 1.0), "db": (0.7, 0.95)})
    table = cli(config, "show", "web", "db")
    assert table.returncode == 0, table.stderr
    assert "ζb (frozen)" in table.stdout and "degradation" in table.stdout and "web" in table.stdout
    assert "neighbours at the last ζb sample: db (same-cpu)" in table.stdout
    shown = cli(config, "show", "web", "--format", "json", "--plot", str(tmp_path / "box.png"))
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["run"]["id"] == run and set(data["vms"]) == {"web"}
    assert (tmp_path / "box.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = cli(config, "show", "ghost")
    assert missing.returncode == 2 and "ghost" in missing.stderr


def fill_pairs(store: SqlProfileStore, host: str = "h1") -> int:
    """A run where a's pair probes ran it with b alone (it loses 40 %) and with c alone (10 %)."""
    run = store.start_run(host, "cpu", {"t_m_ms": 10.0, "pair_probes": 2})
    frozen = (Neighbour("b", "same-core", True), Neighbour("c", "same-llc", True), Neighbour("dns", "same-node", False))
    samples = []
    for i in range(10):
        at = 1_700_000_000.0 + 10 * i
        samples.append(ProfileSample("a", "zeta", "cpu", 0.5, 1.0, 10.0, at))
        samples.append(ProfileSample("a", "zeta_b", "cpu", 1.0 + 0.01 * (i % 3), 0.01, 10.0, at + 1, frozen))
        for partner, value in (("b", 0.6), ("c", 0.9)):
            ran = tuple(Neighbour(n.name, n.distance, n.name not in (partner, "dns")) for n in frozen)
            samples.append(ProfileSample("a", "zeta_p", "cpu", value, 0.01, 10.0, at + 2, ran, freeze_ms=12.0))
    store.add_samples(run, samples)
    store.finish_run(run, {"vms": ["a"]})
    return run


def test_show_says_what_each_probed_neighbour_alone_costs(config, tmp_path):
    url = f"sqlite:///{tmp_path / 'v.db'}"
    store = store_for(url)
    fill_pairs(store)
    pairs = show_data(store, ["a"], None)["vms"]["a"]["pairs"]
    assert [(p["neighbour"], p["distance"], p["n"]) for p in pairs] == [("b", "same-core", 10), ("c", "same-llc", 10)]
    assert pairs[0]["degradation"]["estimate"] == pytest.approx(1 - 0.6 / 1.01, abs=1e-6)
    assert pairs[1]["degradation"]["estimate"] == pytest.approx(1 - 0.9 / 1.01, abs=1e-6)
    table = cli(config, "show", "a")
    assert table.returncode == 0, table.stderr
    assert "a: with only b running (same-core, 10 pair probes): loses 40.6%" in table.stdout


def test_replay_with_an_empty_journal(config):
    result = cli(config, "replay", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["resumed"] == []
