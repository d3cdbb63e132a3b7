"""`vmplacer config check` reports a duplicate host name whatever else is wrong with the entries
that share it (a bad URI does not hide it), each name with the entries that use it."""

from __future__ import annotations

import json

from vmplacer.cli.main import main


def check(capsys, tmp_path, text: str, *options: str) -> tuple[int, str]:
    config = tmp_path / "vmplacer.yaml"
    config.write_text(text)
    code = main([*options, "config", "check", "--config", str(config)])
    return code, capsys.readouterr().err


def test_a_duplicate_name_is_reported_beside_a_bad_uri(capsys, tmp_path):
    code, err = check(capsys, tmp_path, "hosts:\n"
                                        "  - {name: a, uri: 'test:///default'}\n"
                                        "  - {name: a, uri: nonsense}\n"
                                        "  - {name: b, uri: 'test:///default'}\n"
                                        "  - {name: b, uri: 'qemu:///nowhere'}\n")
    assert code == 2
    lines = err.splitlines()
    assert any("key 'hosts[1].uri': not a libvirt URI: 'nonsense'" in line for line in lines), err
    assert any("key 'hosts[3].uri': qemu URIs end in /system or /session" in line for line in lines), err
    assert any("key 'hosts': duplicate host names: 'a' (hosts[0], hosts[1]); 'b' (hosts[2], hosts[3])" in line
               for line in lines), err
    assert lines[-1] == "vmplacer: 3 problems in the config"


def test_distinct_names_are_fine(capsys, tmp_path):
    code, err = check(capsys, tmp_path, "hosts:\n  - {name: a, uri: 'test:///default'}\n"
                                        "  - {name: b, uri: 'test:///default'}\n")
    assert (code, err) == (0, "")


def test_under_json_logs_every_problem_is_a_json_line(capsys, tmp_path):
    code, err = check(capsys, tmp_path, "hosts:\n  - {name: a, uri: 'test:///default'}\n  - {name: a, uri: x}\n",
                      "--log-format", "json")
    assert code == 2
    entries = [json.loads(line) for line in err.splitlines()]
    assert [e["level"] for e in entries] == ["error", "error", "error"]
    assert entries[-1]["message"] == "2 problems in the config"
