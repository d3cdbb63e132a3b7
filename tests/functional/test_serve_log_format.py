"""`vmplacer serve --log-format json`: uvicorn's lines and vmplacer's, one JSON object per line."""

from __future__ import annotations

import json

import httpx

from tests.functional.test_api_helpers import Server, scratch_database, write_config


def test_serve_logs_one_json_object_per_line_with_the_request_path_as_data(tmp_path):
    with scratch_database("sqlite", tmp_path) as url:
        config = write_config(tmp_path, url, [{"name": "t", "uri": "test:///default", "domain_type": "qemu"}])
        server = Server(config, tmp_path, instance="json-log",
                        extra_args=("--log-format", "json", "--access-log", "-v")).start()
        try:
            assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
            httpx.get(f"{server.url}/v1/hosts/a%0Ab%22c", timeout=30)
        finally:
            code = server.stop()
    assert code in (0, -15), server.log()
    lines = [line for line in server.log_path.read_text().splitlines() if line]
    entries = [json.loads(line) for line in lines]
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in entries)
    loggers = {entry["logger"] for entry in entries}
    assert {"uvicorn.error", "uvicorn.access", "vmplacer.cli.serve"} <= loggers, loggers
    assert any("Application startup complete" in e["message"] for e in entries)
    assert any("/v1/hosts/a%0Ab%22c" in e["message"] for e in entries if e["logger"] == "uvicorn.access")
