"""Property-based run of the whole API from its own OpenAPI document (schemathesis), as a gate.

Every check schemathesis has (`--checks all`), in every phase — examples, coverage, fuzzing,
and the stateful phase that follows the document's links (a placement made → read and removed,
a job accepted → polled and cancelled, a plan stored → applied and cancelled) — with a fixed
seed, against a real `vmplacer serve` on SQLite and on PostgreSQL:

- any 5xx is a failure, and so is an answer (status, headers, body) the document does not
  declare;
- a request the document calls invalid must be refused (4xx), and one it calls valid must be
  accepted: a 4xx other than 401, 403, 404 or 409 for a schema-valid request is a failure, so
  the document is as strict as the server (patterns, bounds, formats, enums).

What a schema cannot know is this deployment's state, so a valid request is made the way a
correct client makes it (`prepare`, run just before each request is sent): host names are the
configured host's (a name the server does not have is a 422 naming the field: the document is
the same for every deployment), an `Idempotency-Key` is one per distinct request (the same key
with another request is a 422 by design), a `cursor` is one the server gave (an opaque
token: a made-up one is a 422), and a placement list's `label` filter asks each label once (one
asked with two values is a 422: no guest has both). What JSON Schema cannot state about a body (NUMA cells must
cover every vCPU, base_xml must be a domain XML libvirt takes, t_m shorter than the freeze cap,
the profiled VMs must run on the host) is allowed its 422 on the two operations that have such
rules (`CROSS_FIELD`).

The document cannot know this server's api.max_request_bytes either: a body over it is refused
with 413 before it is read, and that counts as a rejection of invalid data too.

Bounded by examples, not time: `MAX_EXAMPLES` per operation in the fuzzing and stateful phases
(the coverage phase's boundary cases are as many as the document has). The rebalancing dry run
observes the host for a second, so it gets `SLOW_EXAMPLES` and only the coverage phase's invalid
cases (its valid ones come from fuzzing and the stateful phase).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest

from tests.functional.test_api_helpers import Server, scratch_database, write_config
from tests.support import clean_env
from vmplacer.api.idempotency import KEY_RE

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CAPABILITIES = Path(__file__).resolve().parents[2] / "examples" / "hosts" / "xeon-e3-4c8t.xml"
SEED = "20261121"
HOST = "t"
MAX_EXAMPLES = 6
# A rebalancing dry run observes every host for a second (vCPU demand): fewer examples there.
SLOW = "POST /v1/plans"
SLOW_EXAMPLES = 4
STATEFUL_STEPS = 8
# Operations whose bodies have rules across fields (a 422 naming the rule).
CROSS_FIELD = ("POST /v1/placements", "POST /v1/profiles")
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409"]
CONFIG = f"""\
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]

[checks.positive_data_acceptance]
expected-statuses = {json.dumps(ACCEPTED)}

[phases.stateful]
max-steps = {STATEFUL_STEPS}

[phases.stateful.inference]
algorithms = []

[[operations]]
include-name = "{SLOW}"
generation.max-examples = {SLOW_EXAMPLES}
phases.coverage.generation.mode = "negative"
""" + "".join(f"""
[[operations]]
include-name = "{name}"
checks.positive_data_acceptance.expected-statuses = {json.dumps([*ACCEPTED, "422"])}
""" for name in CROSS_FIELD)
HOOKS = """\
from tests.functional.test_api_schemathesis import register

register()
"""


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_every_operation_conforms_to_its_schema(database, tmp_path):
    if not SCHEMATHESIS.exists() and shutil.which("schemathesis") is None:
        pytest.fail("schemathesis is not installed (pip install -e '.[dev]')")
    with scratch_database(database, tmp_path) as url:
        config = write_config(tmp_path, url, hosts(tmp_path), max_request_bytes=64 * 1024)
        server = Server(config, tmp_path, instance=f"schemathesis-{database}").start()
        try:
            result = run(server, tmp_path)
        finally:
            server.stop()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-12000:]
    for phase in ("Coverage", "Fuzzing", "Stateful"):  # Examples: the document has none, so it is skipped
        assert re.search(rf"✅ {phase}\b", output), f"phase {phase} did not pass:\n{output[-6000:]}"
    assert "Server error" not in output and "not_a_server_error" not in output
    assert "Traceback" not in server.log()


def hosts(directory: Path) -> list[dict[str, Any]]:
    """One libvirt test-driver host without domains, its pCPUs from a capabilities file (8 pCPUs):
    guests fit, so placements are made, read and removed, and jobs run on it."""
    node = directory / "node.xml"
    node.write_text("<node>\n</node>\n")
    return [{"name": HOST, "uri": f"test://{node}", "domain_type": "qemu", "capabilities": str(CAPABILITIES)}]


def run(server: Server, cwd: Path, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    (cwd / "schemathesis.toml").write_text(CONFIG)
    (cwd / "vmplacer_schemathesis_hooks.py").write_text(HOOKS)
    return subprocess.run(
        [str(SCHEMATHESIS if SCHEMATHESIS.exists() else shutil.which("schemathesis")),
         "--config-file", str(cwd / "schemathesis.toml"), "run",
         f"{server.url}/openapi.json", "--header", f"Authorization: Bearer {server.admin}",
         "--checks", "all", "--phases", "examples,coverage,fuzzing,stateful", "--max-examples", str(MAX_EXAMPLES),
         "--seed", SEED, "--generation-database", "none", "--no-color", "--request-timeout", "30",
         "--workers", "1", *extra],
        capture_output=True, text=True, timeout=900, cwd=cwd,
        env=clean_env({"SCHEMATHESIS_HOOKS": "vmplacer_schemathesis_hooks",
                       "PYTHONPATH": f"{cwd}:{Path(__file__).resolve().parents[2]}"}))


# --- what a correct client does that a schema cannot say (run inside schemathesis) ---------------

HOST_FIELDS = ("host", "drain")


def prepare(case: Any) -> None:
    """Make a schema-valid request one this deployment can accept (see the module's docstring);
    an invalid one is left as generated, its fault intact."""
    if case.meta is not None and not case.meta.generation.mode.is_positive:
        return
    query = case.query if isinstance(case.query, MutableMapping) else None
    if query is not None:
        query.pop("cursor", None)
        if isinstance(query.get("host"), str):
            query["host"] = HOST
        if isinstance(query.get("label"), list):  # one value per label: two can never both match
            query["label"] = list({item.partition("=")[0]: item for item in reversed(query["label"])}.values())
    body = case.body if isinstance(case.body, MutableMapping) else None
    if body is not None:
        for name in HOST_FIELDS:
            if isinstance(body.get(name), str):
                body[name] = HOST
        if isinstance(body.get("hosts"), list):
            body["hosts"] = [HOST] if body["hosts"] else []
    headers = case.headers if isinstance(case.headers, MutableMapping) else None
    key = None if headers is None else headers.get("Idempotency-Key")
    if isinstance(key, str) and KEY_RE.match(key):
        request = json.dumps([case.method, case.formatted_path, None if query is None else dict(query),
                              None if body is None else dict(body)], sort_keys=True, default=str)
        headers["Idempotency-Key"] = f"{key[:200]}.{hashlib.sha256(request.encode()).hexdigest()[:32]}"


def register() -> None:
    import schemathesis

    @schemathesis.hook
    def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
        prepare(case)
