"""A mistyped option or command is refused in one line, exit 2, with the closest spelling the
command knows ("did you mean --request?") and never the usage block; under --log-format json
that line is a JSON object too."""

from __future__ import annotations

import json

import pytest

from vmplacer.cli.main import main
from vmplacer.cli.suggest import closest, suggest


def refused(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


@pytest.mark.parametrize(("argv", "said"), [
    (("plan", "--requst", "r.yaml"), "unrecognized arguments: --requst; did you mean --request? "
                                     "(`vmplacer plan --help` lists the options)"),
    (("db", "prune", "--older-thn", "3d"), "unrecognized arguments: --older-thn; did you mean --older-than? "
                                           "(`vmplacer db prune --help` lists the options)"),
    (("plna",), "did you mean 'plan'?"),
    (("protect", "stats"), "invalid choice: 'stats' (choose from 'run', 'status'); did you mean 'status'?"),
])
def test_a_typo_is_one_line_with_the_closest_spelling(capsys, argv, said):
    err = refused(capsys, *argv)
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith("vmplacer: error: ") and said in err, err


def test_nothing_is_suggested_when_nothing_is_close(capsys):
    err = refused(capsys, "plan", "--zzzzzzzz", "r.yaml")
    assert err == ("vmplacer: error: unrecognized arguments: --zzzzzzzz "
                   "(`vmplacer plan --help` lists the options)\n")


@pytest.mark.parametrize("argv", [("--log-format", "json", "plan", "--requst", "r.yaml"),
                                  ("plan", "--requst", "r.yaml", "--log-format=json")])
def test_under_json_logs_the_refusal_is_a_json_object(capsys, argv):
    err = refused(capsys, *argv)
    lines = err.splitlines()
    assert len(lines) == 1, err
    entry = json.loads(lines[0])
    assert (entry["level"], entry["logger"]) == ("error", "vmplacer.cli")
    assert "did you mean --request?" in entry["message"]


def test_the_variable_asks_for_json_refusals_too(capsys, monkeypatch):
    monkeypatch.setenv("VMPLACER_LOG_FORMAT", "json")
    entry = json.loads(refused(capsys, "db", "prune", "--older-than", "30"))
    assert entry["message"].startswith("argument --older-than: '30' has no unit: write one of s, m, h, d")


def test_suggestions():
    assert closest("--hots", ["--host", "--all-hosts", "--format"]) == "--host"
    assert closest("--x", ["--host", "--format"]) is None
    assert suggest("unrecognized arguments: --fromat", "--fromat", ["-h", "--format", "--host"]) == "--format"
    assert suggest("argument A: invalid choice: 'upgrde' (choose from 'upgrade', 'downgrade')", None, []) \
        == "'upgrade'"
    assert suggest("the following arguments are required: --request", None, ["--request"]) is None
