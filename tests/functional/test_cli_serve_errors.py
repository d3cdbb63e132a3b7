"""`vmplacer serve` that cannot start says why in one line and exits with the right code: a TLS
key that is not the certificate's is bad input (2, both files named); an address already taken
is "cannot start" (1, HOST:PORT named), never uvicorn's exit 3, which means "does not fit"."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.functional.test_api_helpers import Server, free_port, vmplacer, write_config
from tests.support import require


def _certificate(directory: Path, name: str) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    require(openssl is not None, "openssl is not installed (needed to make a test certificate)")
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run([str(openssl), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=120)
    return cert, key


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path, f"sqlite:///{tmp_path / 'serve.db'}", [{"name": "t", "uri": "test:///default"}])


def test_a_key_of_another_certificate_is_one_line_naming_both_files(tmp_path, config):
    cert, _key = _certificate(tmp_path, "one")
    _cert, other_key = _certificate(tmp_path, "two")
    result = vmplacer(config, "serve", "--listen", f"127.0.0.1:{free_port()}",
                      "--ssl-certfile", str(cert), "--ssl-keyfile", str(other_key))
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"vmplacer: error: --ssl-certfile {cert}, --ssl-keyfile {other_key}: "
                             "the private key does not belong to the certificate\n")


def test_a_file_that_is_not_pem_is_one_line(tmp_path, config):
    cert, key = _certificate(tmp_path, "one")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    result = vmplacer(config, "serve", "--listen", f"127.0.0.1:{free_port()}",
                      "--ssl-certfile", str(garbage), "--ssl-keyfile", str(key))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"vmplacer: error: --ssl-certfile {garbage}, --ssl-keyfile {key}: ")
    assert cert.exists()


def _taken_port() -> tuple[socket.socket, int]:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    return holder, int(holder.getsockname()[1])


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_an_address_in_use_is_one_line_naming_it_and_exit_1(config, log_format):
    holder, port = _taken_port()
    try:
        result = vmplacer(config, "--log-format", log_format, "serve", "--listen", f"127.0.0.1:{port}")
    finally:
        holder.close()
    assert result.returncode == 1, result.stderr  # 1: cannot start; 3 would say "does not fit"
    said = f"cannot listen on 127.0.0.1:{port}: address already in use"
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    if log_format == "json":
        entry = json.loads(lines[0])
        assert entry["level"] == "error" and entry["message"].startswith(said), entry
    else:
        assert lines[0].startswith(f"vmplacer: failed: {said}"), lines


def test_a_second_server_on_the_same_port_is_refused_while_the_first_serves(tmp_path, config):
    first = Server(config, tmp_path, instance="first").start()
    try:
        result = vmplacer(config, "serve", "--listen", f"127.0.0.1:{first.port}", "--instance", "second")
    finally:
        first.stop()
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"vmplacer: failed: cannot listen on 127.0.0.1:{first.port}: "
                                    "address already in use"), result.stderr
