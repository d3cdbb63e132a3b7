"""Every line vmplacer writes to stderr follows --log-format: uvicorn's terminal-coloured copy of
a message (`color_message`) is dropped from both forms, and under JSON the command's own error
and warning lines and Python warnings are JSON objects as well."""

from __future__ import annotations

import json
import logging
import warnings

import pytest

from vmplacer.cli.log_format import JsonLineFormatter, TextFormatter, configure_logging, format_in, say

COLOURED = "Started server process [\x1b[36m%d\x1b[0m]"


def _uvicorn_record() -> logging.LogRecord:
    entry = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "Started server process [%d]", (42,), None)
    entry.color_message = COLOURED  # what uvicorn passes as extra=
    return entry


def test_color_message_never_reaches_a_log_line():
    text = TextFormatter().format(_uvicorn_record())
    assert text.endswith("INFO uvicorn.error: Started server process [42]"), text
    entry = json.loads(JsonLineFormatter().format(_uvicorn_record()))
    assert "color_message" not in entry and entry["message"] == "Started server process [42]"


@pytest.mark.parametrize(("kind", "level"), [("error", "error"), ("failed", "error"), ("warning", "warning")])
def test_say_writes_json_under_json(capsys, kind, level):
    say(kind, "line one\nline two", "json")
    entry = json.loads(capsys.readouterr().err)
    assert (entry["level"], entry["logger"], entry["message"]) == (level, "vmplacer.cli", "line one line two")
    assert entry.get("kind", kind) == kind


def test_say_writes_the_vmplacer_prefix_as_text_with_control_characters_escaped(capsys):
    say("warning", "listening on 0.0.0.0 without TLS\x1b[31m", "text")
    assert capsys.readouterr().err == "vmplacer: warning: listening on 0.0.0.0 without TLS\\x1b[31m\n"


@pytest.mark.parametrize(("argv", "chosen"), [
    (["--log-format", "json", "serve"], "json"), (["serve", "--log-format=json"], "json"),
    (["serve", "--log-form", "json"], "json"), (["serve"], "text"), (["--", "--log-format", "json"], "text"),
])
def test_the_format_a_refusal_is_written_in(monkeypatch, argv, chosen):
    monkeypatch.delenv("VMPLACER_LOG_FORMAT", raising=False)
    assert format_in(argv) == chosen


def test_python_warnings_go_through_the_json_handler(capsys):
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("json", 0)
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            # pytest's own catch_warnings around each test may have swapped showwarning since: hook again
            logging.captureWarnings(False)
            logging.captureWarnings(True)
            warnings.warn("an old option", DeprecationWarning, stacklevel=1)
        lines = capsys.readouterr().err.splitlines()
    finally:
        configure_logging("text", 0)
        logging.captureWarnings(False)
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    entries = [json.loads(line) for line in lines]
    assert any(e["logger"] == "py.warnings" and "an old option" in e["message"] for e in entries), lines
