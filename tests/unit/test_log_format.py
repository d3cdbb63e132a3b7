"""Log lines as text or one JSON object per line; what a caller supplied stays data in both."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess

import pytest

from tests.support import VMPLACER, clean_env, run_vmplacer
from vmplacer.cli.log_format import JsonLineFormatter, TextFormatter, chosen_format

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
FORGED = 'web"1\n2026-01-01T00:00:00.000Z INFO vmplacer: forged \x1b[31m'


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    entry = logging.LogRecord("vmplacer.app.protect.loop", logging.WARNING, __file__, 1, message, args, None)
    entry.__dict__.update(extra)
    return entry


def test_json_is_one_object_per_line_with_time_level_logger_message_and_extras():
    line = JsonLineFormatter().format(record("throttled %s", FORGED, vm=FORGED, share=0.25))
    assert "\n" not in line
    entry = json.loads(line)
    assert ISO_MS.match(entry["time"]), entry["time"]
    assert (entry["level"], entry["logger"]) == ("warning", "vmplacer.app.protect.loop")
    assert entry["message"] == f"throttled {FORGED}" and entry["vm"] == FORGED and entry["share"] == 0.25


def test_json_keeps_the_traceback_inside_the_object():
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        entry = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), __import__("sys").exc_info())
    parsed = json.loads(JsonLineFormatter().format(entry))
    assert parsed["message"] == "failed" and "ValueError: bad" in parsed["exception"]


def test_text_escapes_control_characters_so_a_name_cannot_forge_a_line():
    line = TextFormatter().format(record("throttled %s", FORGED, vm="a\nb"))
    assert "\n" not in line and "\x1b" not in line
    assert line.endswith("throttled web\"1\\n2026-01-01T00:00:00.000Z INFO vmplacer: forged \\x1b[31m vm=a\\nb")
    assert ISO_MS.match(line.split(" ", 1)[0])


def test_the_flag_wins_over_the_variable_and_a_bad_variable_is_named(monkeypatch):
    monkeypatch.setenv("VMPLACER_LOG_FORMAT", "json")
    assert chosen_format(None) == "json" and chosen_format("text") == "text"
    monkeypatch.setenv("VMPLACER_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="VMPLACER_LOG_FORMAT='xml'"):
        chosen_format(None)


@pytest.mark.parametrize("argv", [("--log-format", "json", "guard"), ("guard", "--log-format", "json")])
def test_the_guard_loop_logs_json_before_or_after_the_command(tmp_path, argv):
    env = clean_env({"VMPLACER_DATA_DIR": str(tmp_path)})
    assert run_vmplacer("db", "upgrade", env=env).returncode == 0
    process = subprocess.Popen([VMPLACER, "-v", *argv, "--every", "1s"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        first = process.stderr.readline()  # the loop says its pace when it starts
    finally:
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=60)
    lines = [line for line in (first + rest).splitlines() if line]
    assert lines, "guard -v logs that it started"
    entries = [json.loads(line) for line in lines]
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in entries)
    assert any(e["logger"] == "vmplacer.cli.guard" and "every 1 s" in e["message"] for e in entries), entries


def test_a_bad_log_format_exits_2():
    result = run_vmplacer("hosts", "--log-format", "xml")
    assert result.returncode == 2 and "--log-format" in result.stderr
    result = run_vmplacer("version", env=clean_env({"VMPLACER_LOG_FORMAT": "xml"}))
    assert result.returncode == 2 and "VMPLACER_LOG_FORMAT" in result.stderr
