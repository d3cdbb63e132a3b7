"""Fixtures for tests on real libvirt hosts: the two-host testbed and its guests.

`testbed` brings both hosts up once per session (starting only what is not
running), builds or reuses the guest image, and at the end stops only the
daemons it started itself. Missing libvirt/QEMU fails the run under CI=true
and skips it elsewhere.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.machine_report import CpuTimes, snapshot
from tests.support import require
from vmplacer.testbed import daemons, guests
from vmplacer.testbed.guests import GuestHandle
from vmplacer.testbed.image import GuestImage, build_image
from vmplacer.testbed.paths import StateDirs

_TOOLS = ("libvirtd", "virtlogd", "virsh", "qemu-system-x86_64", "unshare", "cpio", "apt-get", "dpkg-deb")


@dataclass(frozen=True)
class Testbed:
    __test__ = False  # not a test class

    dirs: StateDirs
    image: GuestImage
    host1_uri: str
    host2_uri: str
    up: daemons.UpResult


def _missing() -> list[str]:
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    missing = [tool for tool in _TOOLS if shutil.which(tool, path=search) is None]
    if not Path("/bin/busybox").exists():
        missing.append("/bin/busybox (busybox-static)")
    try:
        import libvirt  # noqa: F401
    except ImportError:
        missing.append("libvirt-python")
    if os.geteuid() != 0:
        missing.append("root (the testbed starts system daemons)")
    return missing


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    missing = _missing()
    require(not missing, f"the libvirt testbed needs: {', '.join(missing)}")
    dirs = StateDirs.default()
    result = daemons.up(dirs)  # a daemon that is installed but will not start is a failure, not a skip
    try:
        image = build_image(dirs)
        import libvirt

        for uri in (daemons.HOST1_URI, daemons.HOST2_URI):
            conn = libvirt.open(uri)
            try:
                guests.cleanup_orphans(conn)  # leftovers of runs that died
            finally:
                conn.close()
        guests.prune_consoles(dirs)
        yield Testbed(dirs, image, daemons.HOST1_URI, daemons.HOST2_URI, result)
    finally:
        daemons.down(dirs, only=result.started)


DAEMON_READY_S = 120.0  # a daemon a test killed and restarted, or one still tearing down a broken migration
DAEMON_PROBE_S = 10.0


@pytest.fixture(autouse=True)
def daemons_answer(request):
    """Each live test starts on daemons that answer: one left slow by the test before (a restart,
    a migration whose destination died) is waited for here, and named if it never recovers."""
    if "testbed" not in request.fixturenames:
        yield
        return
    import subprocess
    import time

    request.getfixturevalue("testbed")  # up first
    deadline = time.monotonic() + DAEMON_READY_S
    for uri in (daemons.HOST1_URI, daemons.HOST2_URI):
        while True:
            try:
                done = subprocess.run([daemons.binary("virsh"), "-c", uri, "list", "--all", "--name"],
                                      capture_output=True, text=True, timeout=DAEMON_PROBE_S)
                if done.returncode == 0:
                    break
                problem = done.stderr.strip()
            except subprocess.TimeoutExpired:
                problem = f"no answer within {DAEMON_PROBE_S:.0f} s"
            if time.monotonic() > deadline:
                pytest.fail(f"the testbed daemon at {uri} does not answer: {problem}")
            time.sleep(1.0)
    yield


# One connection per test (cheap): a test may restart a daemon, which ends its connections.
@pytest.fixture
def host1_conn(testbed: Testbed):
    import libvirt

    conn = libvirt.open(testbed.host1_uri)
    yield conn
    conn.close()


@pytest.fixture
def host2_conn(testbed: Testbed):
    import libvirt

    conn = libvirt.open(testbed.host2_uri)
    yield conn
    conn.close()


GuestFactory = Callable[..., GuestHandle]


@pytest.fixture
def make_guest(testbed: Testbed, host1_conn, host2_conn, request) -> Iterator[GuestFactory]:
    """`make_guest(label, conn=host1_conn, start=True, **define_guest_args) -> GuestHandle`.

    Names are `vmpt-<pid>-<test>-<digest>-<label>`; every guest made here is removed from
    both hosts after the test, wherever it migrated to.
    """
    made: list[str] = []

    def factory(label: str, conn=None, *, start: bool = True, **kwargs) -> GuestHandle:
        conn = conn or host1_conn
        # Test names are long and share prefixes: a short digest of the node id keeps names unique.
        digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
        name = guests.owned_name(f"{request.node.name[:20]}-{digest}-{label}")
        handle = guests.define_guest(conn, name, image=testbed.image, dirs=testbed.dirs, **kwargs)
        made.append(name)
        if start:
            guests.start(conn, handle)
        return handle

    yield factory
    left = {name: _remove_everywhere(testbed, name) for name in made}
    for name in made:
        guests.console_path(name, testbed.dirs).unlink(missing_ok=True)
    left = {name: problems for name, problems in left.items() if problems}
    # A guest left behind would crowd the pCPUs of every later test: say so here, not there.
    assert not left, f"guests this test made are still defined or running: {left}"


def _remove_everywhere(testbed: Testbed, name: str, attempts: int = 3) -> list[str]:
    """Destroy and undefine `name` on both hosts, on fresh connections (the test's own
    may be broken); what still stands after the last attempt, with the errors seen."""
    import time

    import libvirt

    problems: list[str] = []
    for attempt in range(attempts):
        problems = []
        for uri in (testbed.host1_uri, testbed.host2_uri):
            try:
                conn = libvirt.open(uri)
            except libvirt.libvirtError as exc:
                problems.append(f"{uri}: cannot connect: {exc.get_error_message()}")
                continue
            try:
                guests.destroy_and_undefine(conn, name)
                conn.lookupByName(name)
                problems.append(f"{uri}: still defined")
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                    problems.append(f"{uri}: {exc.get_error_message()}")
            finally:
                conn.close()
        if not problems:
            return []
        time.sleep(2.0 * (attempt + 1))
    return problems


_CPU_AT_SETUP = pytest.StashKey[CpuTimes]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT_SETUP] = CpuTimes.now()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed live test carries a snapshot of the machine: load, steal, busy processes, domains."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when in ("call", "teardown"):
        try:
            text = snapshot(item.stash.get(_CPU_AT_SETUP, None))
        except Exception as exc:  # noqa: BLE001 - the diagnosis must never hide the failure
            text = f"no snapshot: {exc!r}"
        report.sections.append(("machine when it failed", text))
