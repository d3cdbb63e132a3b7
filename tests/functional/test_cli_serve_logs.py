"""`vmplacer serve`'s log, read from a real process: uvicorn's coloured copies of its messages
(`color_message`, terminal escapes) appear in neither form, and under --log-format json every
line — vmplacer's own warning before uvicorn starts included — is one JSON object."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.functional.test_api_helpers import Server, write_config


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_serve_log_has_no_color_message_and_json_has_only_json(tmp_path, log_format):
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'logs.db'}", [{"name": "t", "uri": "test:///default"}])
    server = Server(config, tmp_path, instance=f"logs-{log_format}")
    # on every address without TLS: vmplacer warns before uvicorn starts
    server.extra_args = ("--log-format", log_format, "-v", "--access-log", "--listen", f"0.0.0.0:{server.port}")
    server.start()
    try:
        assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
    finally:
        code = server.stop()
    assert code in (0, -15), server.log()
    text = server.log_path.read_text()
    assert "color_message" not in text and "\x1b" not in text and "\\u001b" not in text, text
    lines = [line for line in text.splitlines() if line]
    if log_format == "text":
        assert any(line.startswith("vmplacer: warning: listening on 0.0.0.0 without TLS") for line in lines), text
        assert any("uvicorn.error: Started server process" in line for line in lines), text
        return
    entries = [json.loads(line) for line in lines]  # every line: a JSON object, or this fails naming it
    warning = [e for e in entries if e["logger"] == "vmplacer.cli" and e["level"] == "warning"]
    assert warning and warning[0]["message"].startswith("listening on 0.0.0.0 without TLS"), entries
    assert any(e["message"].startswith("Started server process") for e in entries), entries
    assert any(e["logger"] == "uvicorn.access" for e in entries), entries
