"""Options the chosen mode never reads are refused (exit 2, naming the option and where it applies)
instead of being ignored silently."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support import clean_env, run_vmplacer
from vmplacer.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
MIXED = str(ROOT / "examples" / "requests" / "mixed.yaml")
XEON = str(ROOT / "examples" / "hosts" / "xeon-2s-56c-smt2.xml")
REBALANCING = "applies to rebalancing plans (plan --rebalance), not to placement plans (plan --request)"
PLACING = "applies to placement plans (plan --request), not to plan --rebalance"
DRAIN = "does not apply to a drain (--drain)"


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """`vmplacer ARGS` in this process (the built-in example host, a data directory of its own):
    (exit code, stdout, stderr)."""
    for name in [n for n in os.environ if n.startswith("VMPLACER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("VMPLACER_DATA_DIR", str(tmp_path))

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's own refusals
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.mark.parametrize(("argv", "message"), [
    # plan with a request places new guests: the rebalancing options mean nothing there
    (("plan", "--request", MIXED, "--drain", "example", "--no-migrate", "--cooldown", "5"), f"--drain: {REBALANCING}"),
    (("plan", "--request", MIXED, "--no-migrate"), f"--no-migrate: {REBALANCING}"),
    (("plan", "--request", MIXED, "--cooldown", "5m"), f"--cooldown: {REBALANCING}"),
    (("plan", "--request", MIXED, "--max-actions", "3"), f"--max-actions: {REBALANCING}"),
    (("plan", "--request", MIXED, "--max-actions", "-1"), "argument --max-actions: must be at least 0, got -1"),
    (("plan", "--request", MIXED, "--backoff", "10m"), f"--backoff: {REBALANCING}"),
    (("plan", "--request", MIXED, "--min-gain", "0.1"), f"--min-gain: {REBALANCING}"),
    (("plan", "--request", MIXED, "--scope", "web*"), f"--scope: {REBALANCING}"),
    (("plan", "--request", MIXED, "--no-trials"), f"--no-trials: {REBALANCING}"),
    (("plan", "--request", MIXED, "--no-explore"), f"--no-explore: {REBALANCING}"),
    (("rebalance", "--no-second-opinion"), "unrecognized arguments: --no-second-opinion"),  # a removed option
    (("plan", "--request", MIXED, "--reason", "x"), f"--reason: {REBALANCING}"),
    (("plan", "--caps", XEON, "--request", MIXED, "--ignore-maintenance"),
     "--ignore-maintenance: applies to configured hosts, not to --caps files"),
    # and the other way round
    (("plan", "--rebalance", "--why"), f"--why: {PLACING}"),
    (("plan", "--rebalance", "--ignore-maintenance"), f"--ignore-maintenance: {PLACING}"),
    (("plan", "--rebalance", "--domain-type", "qemu"), f"--domain-type: {PLACING}"),
    (("plan", "--rebalance", "--hosts-to-score", "2"), f"--hosts-to-score: {PLACING}"),
    # a drain moves every guest whatever the gain, the cool-down or a measurement
    (("plan", "--rebalance", "--drain", "example", "--max-actions", "2"), f"--max-actions: {DRAIN}"),
    (("rebalance", "--drain", "example", "--cooldown", "1m"), f"--cooldown: {DRAIN}"),
    (("rebalance", "--drain", "example", "--backoff", "1m"), f"--backoff: {DRAIN}"),
    (("rebalance", "--drain", "example", "--profile-seconds", "10s"), f"--profile-seconds: {DRAIN}"),
    (("rebalance", "--reason", "x"), "--reason: only with --drain HOST"),
    # a dry run carries nothing out
    (("rebalance", "--dry-run", "--migration-timeout", "1m"), "--migration-timeout: applies when a plan is carried out"),
    (("rebalance", "--dry-run", "--on-failure", "rollback"), "--on-failure: applies when a plan is carried out"),
    # written at its default value, an option is still given (and refused where it does not apply)
    (("rebalance", "--dry-run", "--on-failure", "continue"), "--on-failure: applies when a plan is carried out"),
    (("rebalance", "--dry-run", "--migration-timeout=300s"), "--migration-timeout: applies when a plan is carried out"),
    (("plans", "3", "--limit", "20"), "--limit: only when listing plans (`plans list`)"),
    (("protect", "status", "--samples", "5"), "--samples: applies to the protection loop"),
    (("protect", "status", "--sam", "5"), "--samples: applies to the protection loop"),
    # plans: one plan shown, not a listing
    (("plans", "3", "--limit", "5"), "--limit: only when listing plans (`plans list`)"),
    (("plans", "3", "--all"), "--all: only when listing plans (`plans list`)"),
    # protect: the loop and `status` read different options
    (("protect", "--once", "--plot", "x.png"), "--plot: applies to `protect status`, not to the protection loop"),
    (("protect", "run", "--host", "example", "--since", "1h"), "--since: applies to `protect status`"),
    (("protect", "status", "--once"), "--once: applies to the protection loop, not to `protect status`"),
    (("protect", "status", "--tm", "10ms"), "--tm: applies to the protection loop"),
    (("protect", "status", "--interval", "2s"), "--interval: applies to the protection loop"),
    (("protect", "status", "--since", "1h"), "--since: only with `protect status --plot`"),
    (("protect", "run", "--host", "example", "--tm", "10ms", "--t-m-ms", "10"), "--t-m-ms: the deprecated spelling of --tm"),
    # guard --once replays once: nothing to pace
    (("guard", "--once", "--every", "5"), "--every: paces the repeated replays, not guard --once"),
    # profile: show and replay read no profiling options
    (("profile", "show", "a", "--pair-probes", "2"), "--pair-probes: not used by `vmplacer profile show`"),
    (("profile", "show", "a", "--probe-kind", "gauge"), "--probe-kind: not used by `vmplacer profile show`"),
    (("profile", "replay", "--sensitive", "all"), "--sensitive: not used by `vmplacer profile replay`"),
    (("profile", "run", "--host", "example", "--probe-kind", "gauge"), "--probe-kind: only with --probe"),
    (("profile", "--plot", "x.png"), "--plot: not used by `vmplacer profile`"),
])
def test_an_option_the_mode_does_not_read_is_refused(cli, argv, message):
    code, out, err = cli(*argv)
    assert code == 2, (out, err)
    assert message in err, err


def test_a_drain_may_say_it_profiles_nothing(cli):
    """--profile-seconds 0 states what a drain does anyway: not refused."""
    code, _, err = cli("rebalance", "--drain", "example", "--profile-seconds", "0")
    assert code == 2 and "no other configured host to move its guests to" in err, err  # further on


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_vmplacer(*args, env=clean_env({"VMPLACER_DATA_DIR": str(tmp_path)}))


def test_the_deprecated_t_m_ms_still_runs_and_says_so(tmp_path):
    done = run(tmp_path, "protect", "run", "--host", "example", "--once", "--t-m-ms", "5", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert "--t-m-ms is deprecated: write --tm 5ms" in done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["host"] == "example"


def test_refusals_through_the_console_script(tmp_path):
    done = run(tmp_path, "plan", "--request", MIXED, "--drain", "X", "--no-migrate", "--cooldown", "5")
    assert done.returncode == 2 and f"--drain: {REBALANCING}" in done.stderr, done.stderr
    done = run(tmp_path, "rebalance", "--cooldown", "10m", "--wait", "1m", "--profile-seconds", "soon")
    assert done.returncode == 2 and "argument --profile-seconds: 'soon' is not a duration (e.g. 500us, 10ms" \
        in done.stderr, done.stderr
