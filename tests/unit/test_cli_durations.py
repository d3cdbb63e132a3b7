"""Every duration option of the command line reads one grammar (500us, 10ms, 2.5s, 10m, 1h; a bare
number is seconds, refused for freeze lengths and retention ages), and counts and durations are held to
their range at parse time: exit 2 naming the option, the rule and examples."""

from __future__ import annotations

import pytest

from vmplacer.cli.main import build_parser
from vmplacer.core.durations import duration_seconds, format_seconds, is_bare_number


def parse(*argv: str):
    return build_parser(list(argv)).parse_args(list(argv))


def refused(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        parse(*argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


# (command words before the option, option, its dest)
DURATION_OPTIONS = [
    (("rebalance",), "--cooldown", "cooldown"),
    (("rebalance",), "--backoff", "backoff"),
    (("rebalance",), "--wait", "wait"),
    (("rebalance",), "--profile-seconds", "profile_seconds"),
    (("rebalance",), "--migration-timeout", "migration_timeout"),
    (("plan", "--rebalance"), "--cooldown", "cooldown"),
    (("plan", "--rebalance"), "--backoff", "backoff"),
    (("apply", "1"), "--wait", "wait"),
    (("apply", "1"), "--migration-timeout", "migration_timeout"),
    (("serve",), "--lease-ttl", "lease_ttl"),
    (("serve",), "--isolation-every", "isolation_every"),
    (("protect",), "--interval", "interval"),
    (("protect", "status"), "--since", "since"),
    (("profile",), "--tsleep", "tsleep"),
    (("profile",), "--duration", "duration"),
    (("guard",), "--every", "every"),
    (("reconcile",), "--settle", "settle"),
    (("reconcile",), "--reservation-grace", "reservation_grace"),
]
AGES = [(("db", "prune"), "--older-than", "older_than")]  # retention ages: days allowed, a unit required
FREEZE_LENGTHS = [(("profile",), "--tm", "tm"), (("profile",), "--max-freeze", "max_freeze"),
                  (("protect",), "--tm", "tm")]


@pytest.mark.parametrize(("words", "option", "dest"), DURATION_OPTIONS)
@pytest.mark.parametrize(("text", "seconds"), [("10m", 600.0), ("2.5s", 2.5), ("1h", 3600.0), ("2", 2.0)])
def test_duration_options_take_units_and_a_bare_number_is_seconds(words, option, dest, text, seconds):
    assert getattr(parse(*words, option, text), dest) == pytest.approx(seconds)


@pytest.mark.parametrize(("words", "option", "dest", "garbage"), [
    (*flag, garbage) for flag in DURATION_OPTIONS + FREEZE_LENGTHS + AGES for garbage in ("soon", "10x", "1d", "ms")
    if not (garbage == "1d" and flag[1] == "--older-than")])  # retention ages are counted in days
def test_duration_options_refuse_garbage_naming_the_option_with_examples(capsys, words, option, dest, garbage):
    err = refused(capsys, *words, option, garbage)
    assert f"argument {option}: {garbage!r} is not a duration (e.g. " in err, err
    assert "10ms" in err or "30d" in err


@pytest.mark.parametrize(("words", "option", "dest"), FREEZE_LENGTHS)
def test_freeze_lengths_take_units_and_refuse_a_bare_number(capsys, words, option, dest):
    assert getattr(parse(*words, option, "10ms"), dest) == pytest.approx(0.010)
    assert getattr(parse(*words, option, "500us"), dest) == pytest.approx(0.0005)
    err = refused(capsys, *words, option, "10")
    assert f"argument {option}: '10' has no unit: write one, e.g. 10ms or 10s" in err


@pytest.mark.parametrize(("text", "seconds"), [("30d", 30 * 86_400.0), ("12h", 43_200.0), ("90m", 5400.0),
                                              ("3600s", 3600.0)])
def test_retention_ages_take_s_m_h_d(text, seconds):
    assert parse("db", "prune", "--older-than", text).older_than == pytest.approx(seconds)


def test_a_retention_age_without_a_unit_is_refused_naming_the_option_and_the_units(capsys):
    err = refused(capsys, "db", "prune", "--older-than", "30")
    assert err.count("\n") == 1, err  # one line, no usage block
    assert err.startswith("vmplacer: error: argument --older-than: '30' has no unit: write one of s, m, h, d, "
                          "e.g. 30d or 30h"), err


def test_the_deprecated_t_m_ms_keeps_milliseconds_and_takes_units():
    assert parse("protect", "--t-m-ms", "50").t_m_ms == pytest.approx(0.050)
    assert parse("protect", "--t-m-ms", "2ms").t_m_ms == pytest.approx(0.002)
    assert "--t-m-ms" not in build_parser(["protect"]).format_help()  # hidden; --help shows --tm


@pytest.mark.parametrize(("argv", "message"), [
    (("rebalance", "--migration-timeout", "0"), "argument --migration-timeout: must be longer than 0, got '0'"),
    (("rebalance", "--wait", "-1"), "argument --wait: '-1' is not a duration"),
    (("serve", "--lease-ttl", "500ms"), "argument --lease-ttl: must be at least 1 s, got '500ms'"),
    (("protect", "--interval", "2h"), "argument --interval: must be 200 ms..1 h, got '2h'"),
    (("protect", "--tm", "2s"), "argument --tm: must be 100 us..1 s, got '2s'"),
    (("protect", "--t-m-ms", "0"), "argument --t-m-ms: must be 100 us..1 s, got '0'"),
    (("profile", "--duration", "0s"), "argument --duration: must be longer than 0"),
    (("guard", "--every", "0"), "argument --every: must be longer than 0"),
    (("db", "prune", "--older-than", "0d"), "argument --older-than: must be longer than 0"),
    (("plan", "--request", "r.yaml", "--max-actions", "-1"), "argument --max-actions: must be at least 0, got -1"),
    (("rebalance", "--max-actions", "x"), "argument --max-actions: not a whole number: 'x'"),
    (("rebalance", "--bandwidth", "0"), "argument --bandwidth: must be at least 1, got 0"),
    (("plans", "list", "--limit", "0"), "argument --limit: must be at least 1, got 0"),
    (("protect", "--samples", "101"), "argument --samples: must be 1..100, got 101"),
    (("protect", "--rounds", "0"), "argument --rounds: must be at least 1, got 0"),
    (("profile", "--pair-probes", "-1"), "argument --pair-probes: must be at least 0, got -1"),
    (("plan", "--hosts-to-score", "-1"), "argument --hosts-to-score: must be 0..100000 (every host at 0)"),
])
def test_ranges_are_refused_naming_the_option_and_the_rule(capsys, argv, message):
    assert message in refused(capsys, *argv)


@pytest.mark.parametrize(("argv", "dest"), [
    (("rebalance", "--profile-seconds", "0"), "profile_seconds"), (("rebalance", "--cooldown", "0"), "cooldown"),
    (("rebalance", "--backoff", "0s"), "backoff"), (("serve", "--isolation-every", "0"), "isolation_every"),
    (("reconcile", "--settle", "0"), "settle"), (("profile", "--tsleep", "0"), "tsleep"),
    (("plan", "--request", "r.yaml", "--max-actions", "0"), "max_actions"),
])
def test_zero_where_it_means_something(argv, dest):
    assert getattr(parse(*argv), dest) == 0


def test_defaults_are_seconds():
    assert parse("reconcile").settle == 60.0 and parse("reconcile").reservation_grace == 3600.0
    assert parse("serve").lease_ttl == 30.0 and parse("serve").isolation_every == 60.0
    assert parse("apply", "1").migration_timeout == 300.0 and parse("apply", "1").wait == 0.0
    assert parse("guard").every is None and parse("rebalance").profile_seconds is None  # resolved by the command


def test_the_grammar():
    assert duration_seconds("10", None) is None and duration_seconds("10ms", None) == pytest.approx(0.01)
    assert is_bare_number("10") and is_bare_number(" 2.5 ") and not is_bare_number("10ms")
    assert not is_bare_number("soon")
    assert [format_seconds(s) for s in (0, 1e-4, 0.2, 1.0, 90.0, 3600.0)] == [
        "0 s", "100 us", "200 ms", "1 s", "1.5 m", "1 h"]
