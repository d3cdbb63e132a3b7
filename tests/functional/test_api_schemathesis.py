"""Property-based run of the whole API from its own OpenAPI document (schemathesis).

Every generated request (valid and invalid, with and without the token) must
get a documented status and a body matching its schema, and none a 5xx. The
host is libvirt's test driver, whose memory is full: no placement can change
anything. One check is left out, `positive_data_acceptance`: guest specs and
profiler settings have cross-field rules (NUMA cells must cover every vCPU,
t_m shorter than the freeze cap, ...) that JSON Schema cannot express, so a
schema-valid body may rightly get a 422 naming the rule.

The document is the same for every deployment, so it cannot know this server's
api.max_request_bytes: a body over it is refused with 413 before it is read, and that
counts as a rejection of invalid data too (a `base_xml` longer than the contract's
maxLength is such a body here).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.functional.test_api_helpers import Server, scratch_database, write_config
from tests.support import clean_env

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
MAX_EXAMPLES = 25
# A rebalancing dry run observes every host for a second (vCPU demand): fewer examples there.
SLOW = "POST /v1/plans"
SLOW_EXAMPLES = 5
# Schemathesis' own list of statuses that reject invalid data, plus 413 (see above).
CONFIG = """\
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
"""


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_every_operation_conforms_to_its_schema(database, tmp_path):
    if not SCHEMATHESIS.exists() and shutil.which("schemathesis") is None:
        pytest.fail("schemathesis is not installed (pip install -e '.[dev]')")
    with scratch_database(database, tmp_path) as url:
        config = write_config(tmp_path, url, [{"name": "t", "uri": "test:///default", "domain_type": "qemu"}],
                              max_request_bytes=64 * 1024)
        server = Server(config, tmp_path, instance=f"schemathesis-{database}").start()
        try:
            runs = [run(server, ("--exclude-name", SLOW, "--max-examples", str(MAX_EXAMPLES)), tmp_path),
                    run(server, ("--include-name", SLOW, "--max-examples", str(SLOW_EXAMPLES)), tmp_path)]
        finally:
            server.stop()
        for result in runs:
            output = result.stdout + result.stderr
            assert result.returncode == 0, output[-8000:]
            assert "passed" in output and " 0 passed" not in output
            assert "Server error" not in output and "not_a_server_error" not in output
        assert "Traceback" not in server.log()


def run(server: Server, selection: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess[str]:
    config = cwd / "schemathesis.toml"
    config.write_text(CONFIG)
    return subprocess.run(
        [str(SCHEMATHESIS if SCHEMATHESIS.exists() else shutil.which("schemathesis")), "--config-file", str(config),
         "run",
         f"{server.url}/openapi.json", "--header", f"Authorization: Bearer {server.admin}",
         "--checks", "all", "--exclude-checks", "positive_data_acceptance", *selection,
         "--seed", "20261121", "--generation-database", "none", "--no-color", "--request-timeout", "30"],
        capture_output=True, text=True, timeout=600, env=clean_env(), cwd=cwd)
