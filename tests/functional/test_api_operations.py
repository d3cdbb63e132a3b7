"""Operating the API: TLS, listen addresses, the systemd unit, the docs covering every route."""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from pathlib import Path

import httpx
import pytest

from tests.functional.test_api_helpers import Server, make_container, write_config
from tests.support import require, systemd_verify_problems
from vmplacer.cli.common import UsageError
from vmplacer.cli.serve import is_loopback, parse_listen

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "vmplacer-api.service"


def test_listen_addresses():
    assert parse_listen("127.0.0.1:8470") == ("127.0.0.1", 8470)
    assert parse_listen("[::1]:9000") == ("::1", 9000)
    assert parse_listen("localhost:1") == ("localhost", 1)
    for bad in ("8470", ":8470", "host:port", "127.0.0.1:70000"):
        with pytest.raises(UsageError, match="--listen"):
            parse_listen(bad)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")


def test_https_with_a_certificate(tmp_path):
    openssl = shutil.which("openssl")
    require(openssl is not None, "openssl is not installed (needed to make a test certificate)")
    cert = tmp_path / "cert.pem"
    subprocess.run([str(openssl), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(cert.with_suffix(".key")), "-out", str(cert)], check=True, capture_output=True)
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'tls.db'}", [{"name": "t", "uri": "test:///default"}])
    server = Server(config, tmp_path, instance="tls", ca=cert).start()
    try:
        assert server.url.startswith("https://")
        with server.client(server.read) as client:
            assert client.get("/v1/hosts").status_code == 200
        with pytest.raises(httpx.HTTPError):  # no plain HTTP on that port
            httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=3).raise_for_status()
    finally:
        server.stop()


def test_half_tls_options_are_refused(tmp_path):
    from tests.functional.test_api_helpers import vmplacer

    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'x.db'}", [{"name": "t", "uri": "test:///default"}])
    result = vmplacer(config, "serve", "--ssl-certfile", str(tmp_path / "cert.pem"))
    assert result.returncode == 2 and "go together" in result.stderr


def test_systemd_unit_is_hardened_and_writes_only_its_data_dir(tmp_path):
    text = UNIT.read_text()
    settings = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    assert any(v.endswith("vmplacer serve") for v in settings["ExecStart"])
    for key, value in {"ProtectSystem": "strict", "NoNewPrivileges": "yes", "PrivateTmp": "yes",
                       "ProtectHome": "yes", "PrivateDevices": "yes", "RestrictSUIDSGID": "yes",
                       "CapabilityBoundingSet": "", "User": "vmplacer"}.items():
        assert settings.get(key) == [value], key
    assert "/var/lib/vmplacer" in settings["ReadWritePaths"]
    assert settings["StateDirectory"] == ["vmplacer"]
    assert settings["Environment"] == ["VMPLACER_CONFIG=/etc/vmplacer/vmplacer.yaml"]
    problems = systemd_verify_problems([UNIT], tmp_path)
    assert not problems, problems


def test_docs_cover_every_route(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.routing import iter_route_contexts

    from vmplacer.api.app import create_app
    from vmplacer.api.services import ApiOptions

    container = make_container(f"sqlite:///{tmp_path / 'd.db'}", tmp_path, [{"name": "t", "uri": "test:///default"}])
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False))
    docs = (ROOT / "docs" / "api.md").read_text()
    for route in iter_route_contexts(app.routes):
        if not route.path or not route.methods:
            continue
        # /v1/placements/{guest} is documented as /v1/placements/db1, etc.
        pattern = re.sub(r"\\\{\w+\\\}", r"[^/\\s\"?]+", re.escape(route.path)) + r"(?![\w/])"
        assert re.search(pattern, docs), f"docs/api.md does not show {route.path}"
    container.close()
