"""Start, check and stop the testbed's two libvirt hosts on one machine.

host1 is the machine's own libvirtd (`qemu:///system`). host2 is a second,
independent libvirtd in its own mount namespace: private copies of the libvirt
directories are bind-mounted over the real ones, so it has its own sockets,
domain definitions, logs, capability cache, host UUID and migration ports, and
it listens on TCP (loopback only) so host1 and the tests can reach it.

Only daemons this module started are ever stopped: their pids are recorded in
the state directory at start and checked (pid + process name) before signalling.
"""

from __future__ import annotations

import fcntl
import grp
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from vmplacer.testbed import cgroups, runtime_fs
from vmplacer.testbed.paths import HOST2_PRIVATE_DIRS, StateDirs

HOST1_URI = "qemu:///system"
HOST2_PORT = 16510
HOST2_URI = f"qemu+tcp://127.0.0.1:{HOST2_PORT}/system"
MIGRATE_URI = "tcp://127.0.0.1"
# host1 keeps libvirt's default migration ports (49152-49215); host2 takes another range.
HOST2_MIGRATION_PORTS = (49400, 49463)
HOST1_PIDFILES = {"virtlogd": Path("/run/virtlogd.pid"), "libvirtd": Path("/run/libvirtd.pid")}
# libvirt's log filter level 3 = warnings and errors.
LOG_LEVEL = 3
START_TIMEOUT_S = 60.0
KVM_KEY = "machine/dev-kvm"
HOST1_RUN_DIR = Path("/run/libvirt")
# Keys of the tmpfs mounts `up` made for each host's runtime directory (see runtime_fs).
RUN_TMPFS_KEYS = {"host1": "host1/run-tmpfs", "host2": "host2/run-tmpfs"}


class TestbedError(RuntimeError):
    """The testbed could not be brought up or down; the message says which daemon and why."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class Host:
    name: str
    uri: str
    log_dir: Path
    pidfiles: dict[str, Path]


@dataclass
class UpResult:
    started: list[str] = field(default_factory=list)  # "host1/libvirtd", ...
    already_running: list[str] = field(default_factory=list)
    seconds: float = 0.0


def host1(dirs: StateDirs) -> Host:
    return Host("host1", HOST1_URI, dirs.host1_dir, dict(HOST1_PIDFILES))


def host2(dirs: StateDirs) -> Host:
    base = dirs.host2_dir
    return Host("host2", HOST2_URI, base / "log",
                {"virtlogd": base / "virtlogd.pid", "libvirtd": base / "libvirtd.pid"})


# --- processes ---------------------------------------------------------------

def read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def process_alive(pid: int | None, name: str) -> bool:
    """True if `pid` runs and is the program `name` (guards against reused pids)."""
    if not pid:
        return False
    try:
        if Path(f"/proc/{pid}/comm").read_text().strip() != name:
            return False
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie has exited, only its parent has not reaped it


def daemon_pid(host: Host, daemon: str) -> int | None:
    pid = read_pid(host.pidfiles[daemon])
    return pid if process_alive(pid, daemon) else None


def answers(uri: str) -> bool:
    """True if a libvirt client can open `uri` and the daemon replies."""
    import libvirt

    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # failures are expected here
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError:
        return False
    try:
        conn.getVersion()
        return True
    except libvirt.libvirtError:
        return False
    finally:
        conn.close()


def binary(name: str) -> str:
    """Absolute path of a daemon or tool; sbin directories count even if PATH lacks them."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin", "/bin"])
    found = shutil.which(name, path=search)
    if found is None:
        raise TestbedError(f"{name} is not installed (needs libvirt-daemon-system, libvirt-clients, "
                           "qemu-system-x86 and util-linux)")
    return found


def _log_tail(paths: list[Path], lines: int = 25) -> str:
    parts = []
    for path in paths:
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        if text:
            parts.append(f"--- {path} (last {len(text)} lines) ---\n" + "\n".join(text))
    return "\n".join(parts) or "(no log output)"


def _wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def _wait_answering(host: Host, timeout_s: float) -> None:
    if not _wait_until(lambda: answers(host.uri), timeout_s, 0.2):
        logs = sorted(host.log_dir.glob("*.log"))
        raise TestbedError(f"{host.name}: libvirtd does not answer on {host.uri} after {timeout_s:.0f} s\n"
                           + _log_tail(logs))


def _spawn(cmd: list[str], log: Path, what: str, env: dict[str, str] | None = None) -> None:
    """Run a command that daemonizes (`-d`): it returns once the daemon has forked."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run([binary(cmd[0]), *cmd[1:]], stdin=subprocess.DEVNULL, stdout=out,
                              stderr=out, env={**os.environ, **(env or {})}, timeout=START_TIMEOUT_S)
    if proc.returncode != 0:
        raise TestbedError(f"{what}: `{' '.join(cmd)}` exited with {proc.returncode}\n" + _log_tail([log]))


def _stop_pid(pid: int, name: str, timeout_s: float = 15.0) -> None:
    if not process_alive(pid, name):
        return
    os.kill(pid, signal.SIGTERM)
    if not _wait_until(lambda: not process_alive(pid, name), timeout_s):
        os.kill(pid, signal.SIGKILL)
        _wait_until(lambda: not process_alive(pid, name), 5.0)


# --- record of what we started -------------------------------------------------

def _load_started(dirs: StateDirs) -> dict[str, dict]:
    try:
        return json.loads(dirs.started_file.read_text())
    except (OSError, ValueError):
        return {}


def recorded(dirs: StateDirs | None = None) -> dict[str, dict]:
    """What the testbed started or changed and has not undone yet (key -> details)."""
    return _load_started(dirs or StateDirs.default())


def _save_started(dirs: StateDirs, started: dict[str, dict]) -> None:
    dirs.root.mkdir(parents=True, exist_ok=True)
    tmp = dirs.started_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(started, indent=2, sort_keys=True))
    os.replace(tmp, dirs.started_file)


def _record(dirs: StateDirs, host: Host, daemon: str) -> str:
    pid = daemon_pid(host, daemon)
    if pid is None:
        raise TestbedError(f"{host.name}: {daemon} started but its pid file {host.pidfiles[daemon]} "
                           "names no running process\n" + _log_tail(sorted(host.log_dir.glob("*.log"))))
    key = f"{host.name}/{daemon}"
    started = _load_started(dirs)
    started[key] = {"pid": pid, "name": daemon, "pidfile": str(host.pidfiles[daemon])}
    _save_started(dirs, started)
    return key


@contextmanager
def _locked(dirs: StateDirs) -> Iterator[None]:
    dirs.root.mkdir(parents=True, exist_ok=True)
    with dirs.lock_file.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- the machine -----------------------------------------------------------------

KVM_DEVICE = Path("/dev/kvm")


def _align_kvm_device(dirs: StateDirs) -> str | None:
    """Give /dev/kvm the owner and mode udev gives it on Debian (root:kvm 0660).

    Without udev it stays root:root 0600. libvirt then probes QEMU as root (KVM
    found) but sees that its QEMU user cannot open /dev/kvm, judges its
    capability cache stale and re-probes QEMU (~4 s) on every call that needs
    it: each connection check, capabilities query and guest start. The
    testbed's guests use TCG either way. The original owner and mode are
    recorded and put back by `down`.
    """
    if not KVM_DEVICE.exists():
        return None
    try:
        kvm_gid = grp.getgrnam("kvm").gr_gid
    except KeyError:
        return None
    st = KVM_DEVICE.stat()
    if st.st_gid == kvm_gid and st.st_mode & 0o060 == 0o060:
        return None
    started = _load_started(dirs)
    started.setdefault(KVM_KEY, {"uid": st.st_uid, "gid": st.st_gid, "mode": stat.S_IMODE(st.st_mode)})
    _save_started(dirs, started)
    os.chown(KVM_DEVICE, -1, kvm_gid)
    os.chmod(KVM_DEVICE, 0o660)
    return KVM_KEY


def _restore_kvm_device(entry: dict) -> None:
    if KVM_DEVICE.exists():
        os.chown(KVM_DEVICE, entry["uid"], entry["gid"])
        os.chmod(KVM_DEVICE, entry["mode"])


# --- runtime directories ---------------------------------------------------------

def _runtime_on_tmpfs(dirs: StateDirs, host_name: str, path: Path, result: UpResult) -> None:
    """Before a host's daemons start: its runtime directory on tmpfs, as on a systemd host."""
    try:
        mounted = runtime_fs.mount_tmpfs(path, dirs.root / "spare")
    except runtime_fs.RuntimeFsError as exc:
        raise TestbedError(f"{host_name}: {exc}") from None
    if mounted:
        key = RUN_TMPFS_KEYS[host_name]
        started = _load_started(dirs)
        started[key] = {"path": str(path)}
        _save_started(dirs, started)
        result.started.append(key)


def _release_runtime_tmpfs(dirs: StateDirs, started: dict[str, dict], only: list[str] | None,
                           result: DownResult) -> None:
    """Unmount the runtime tmpfs of each host whose daemons the testbed no longer runs."""
    for host_name, key in RUN_TMPFS_KEYS.items():
        entry = started.get(key)
        if entry is None or (only is not None and key not in only):
            continue
        if any(k in started for k in (f"{host_name}/libvirtd", f"{host_name}/virtlogd")):
            result.left_running[key] = f"{host_name}'s daemons still run"
            continue
        try:
            runtime_fs.unmount_tmpfs(Path(entry["path"]), dirs.root / "spare")
        except runtime_fs.RuntimeFsError as exc:
            result.left_running[key] = str(exc)
            continue
        del started[key]
        _save_started(dirs, started)
        result.stopped.append(key)


# --- host 1 -----------------------------------------------------------------

def _up_host1(dirs: StateDirs, result: UpResult) -> None:
    host = host1(dirs)
    if answers(host.uri):
        result.already_running.append(f"{host.name}/libvirtd")
        return
    if daemon_pid(host, "virtlogd") is None and daemon_pid(host, "libvirtd") is None:
        _runtime_on_tmpfs(dirs, "host1", HOST1_RUN_DIR, result)
    env = {}
    if daemon_pid(host, "virtlogd") is None:
        env = {"LIBVIRT_LOG_OUTPUTS": f"{LOG_LEVEL}:file:{host.log_dir / 'virtlogd.log'}"}
        _spawn(["virtlogd", "-d"], host.log_dir / "start.log", "host1: starting virtlogd", env)
        result.started.append(_record(dirs, host, "virtlogd"))
    if daemon_pid(host, "libvirtd") is None:
        env = {"LIBVIRT_LOG_OUTPUTS": f"{LOG_LEVEL}:file:{host.log_dir / 'libvirtd.log'}"}
        _spawn(["libvirtd", "-d"], host.log_dir / "start.log", "host1: starting libvirtd", env)
        result.started.append(_record(dirs, host, "libvirtd"))
    else:
        result.already_running.append(f"{host.name}/libvirtd")  # running, maybe still starting
    _wait_answering(host, START_TIMEOUT_S)


# --- host 2 -----------------------------------------------------------------

def _override_conf(source: Path, target: Path, settings: dict[str, str]) -> None:
    """Copy a libvirt .conf, dropping any line that sets one of `settings`, then append them."""
    kept = []
    for line in source.read_text().splitlines() if source.exists() else []:
        key = line.split("=", 1)[0].strip()
        if "=" in line and key in settings:
            continue
        kept.append(line)
    kept.append("")
    kept.append("# vmplacer testbed host 2")
    kept.extend(f"{key} = {value}" for key, value in settings.items())
    target.write_text("\n".join(kept) + "\n")


def _host2_uuid(dirs: StateDirs) -> str:
    path = dirs.host2_dir / "host_uuid"
    try:
        return str(uuid.UUID(path.read_text().strip()))
    except (OSError, ValueError):
        value = str(uuid.uuid4())
        path.write_text(value + "\n")
        return value


def _copy_libvirt_config(etc: Path) -> None:
    """A fresh copy of the machine's /etc/libvirt, except qemu/.

    /etc/libvirt/qemu holds host 1's domain and network definitions; host 2
    keeps its own there between runs (and starts no network: nothing slow).
    """
    for entry in Path("/etc/libvirt").iterdir():
        if entry.name == "qemu":
            continue
        target = etc / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, target, symlinks=True)
        else:
            shutil.copy2(entry, target, follow_symlinks=False)
    (etc / "qemu").mkdir(exist_ok=True)


def _seed_capability_cache(cache: Path) -> None:
    """Start host 2 with host 1's QEMU capability cache when it has none.

    Both daemons run the same QEMU binaries on the same kernel, so the cache is
    valid for both (libvirt re-probes if not); probing costs ~4 s per binary.
    """
    source = Path("/var/cache/libvirt/qemu/capabilities")
    target = cache / "qemu" / "capabilities"
    if not source.is_dir() or (target.is_dir() and any(target.glob("*.xml"))):
        return
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.glob("*.xml"):
        shutil.copyfile(entry, target / entry.name)
        (target / entry.name).chmod(0o600)


def _prepare_host2(dirs: StateDirs) -> Path:
    """Lay out host 2's private directories, configuration and cgroups; return its start script."""
    base = dirs.host2_dir
    for name in HOST2_PRIVATE_DIRS:
        (base / name).mkdir(parents=True, exist_ok=True)
    etc = base / "etc"
    _copy_libvirt_config(etc)
    low, high = HOST2_MIGRATION_PORTS
    _override_conf(Path("/etc/libvirt/libvirtd.conf"), etc / "libvirtd.conf", {
        "host_uuid": f'"{_host2_uuid(dirs)}"',
        "listen_tcp": "1",
        "listen_tls": "0",
        "tcp_port": f'"{HOST2_PORT}"',
        "listen_addr": '"127.0.0.1"',
        "auth_tcp": '"none"',
        "log_outputs": f'"{LOG_LEVEL}:file:/var/log/libvirt/libvirtd.log"',
    })
    _override_conf(Path("/etc/libvirt/qemu.conf"), etc / "qemu.conf", {
        "migration_port_min": str(low),
        "migration_port_max": str(high),
    })
    _override_conf(Path("/etc/libvirt/virtlogd.conf"), etc / "virtlogd.conf", {
        "log_outputs": f'"{LOG_LEVEL}:file:/var/log/libvirt/virtlogd.log"',
    })
    _seed_capability_cache(base / "cache")
    # Mount points must exist in the shared root filesystem before the namespace copies it.
    for mountpoint in HOST2_PRIVATE_DIRS.values():
        mountpoint.mkdir(parents=True, exist_ok=True)
    mounts = [f"mount --bind {shlex.quote(str(base / name))} {shlex.quote(str(path))}"
              for name, path in HOST2_PRIVATE_DIRS.items()]
    mounts += cgroups.mount_commands(cgroups.prepare())
    pid = {daemon: shlex.quote(str(path)) for daemon, path in host2(dirs).pidfiles.items()}
    script = base / "start.sh"
    script.write_text(
        "#!/bin/sh\n"
        "# Runs inside `unshare -m --propagation private`: these mounts are host 2's alone.\n"
        "set -eu\n"
        + "".join(line + "\n" for line in mounts)
        + f"{binary('virtlogd')} -d -p {pid['virtlogd']}\n"
        f"{binary('libvirtd')} --listen -d -p {pid['libvirtd']}\n"
    )
    return script


def _up_host2(dirs: StateDirs, result: UpResult) -> None:
    host = host2(dirs)
    if daemon_pid(host, "libvirtd") is not None:
        _wait_answering(host, START_TIMEOUT_S)
        result.already_running.append(f"{host.name}/libvirtd")
        return
    # A virtlogd left without its libvirtd sits in a dead namespace: a new
    # libvirtd could not reach it. It runs from our private pid file, so it is ours.
    stale = daemon_pid(host, "virtlogd")
    if stale is not None:
        _stop_pid(stale, "virtlogd")
    _runtime_on_tmpfs(dirs, "host2", dirs.host2_dir / "run", result)
    script = _prepare_host2(dirs)
    _spawn(["unshare", "-m", "--propagation", "private", "sh", str(script)],
           host.log_dir / "start.log", "host2: starting virtlogd + libvirtd in a mount namespace")
    result.started.append(_record(dirs, host, "virtlogd"))
    result.started.append(_record(dirs, host, "libvirtd"))
    _wait_answering(host, START_TIMEOUT_S)


def _check_distinct_hosts() -> None:
    import libvirt

    uuids = []
    for uri in (HOST1_URI, HOST2_URI):
        conn = libvirt.open(uri)
        try:
            uuids.append(conn.getCapabilities().split("<uuid>", 1)[1].split("</uuid>", 1)[0])
        finally:
            conn.close()
    if uuids[0] == uuids[1]:
        raise TestbedError(f"host1 and host2 report the same host UUID {uuids[0]}: "
                           "libvirt would refuse migrations between them")


def up(dirs: StateDirs | None = None) -> UpResult:
    """Make both hosts answer; start only what is not running. Idempotent."""
    dirs = dirs or StateDirs.default()
    begin = time.monotonic()
    result = UpResult()
    with _locked(dirs):
        changed = _align_kvm_device(dirs)
        if changed:
            result.started.append(changed)
        _up_host1(dirs, result)
        _up_host2(dirs, result)
        _check_distinct_hosts()
    result.seconds = time.monotonic() - begin
    return result


# --- down / status ------------------------------------------------------------

# Stop libvirtd before the virtlogd it writes through; host 2 before host 1.
_STOP_ORDER = ("host2/libvirtd", "host2/virtlogd", "host1/libvirtd", "host1/virtlogd")


@dataclass
class DownResult:
    stopped: list[str] = field(default_factory=list)
    left_running: dict[str, str] = field(default_factory=dict)  # key -> why


def _guests_in_use(uri: str) -> list[str]:
    """Running guests on `uri` someone still needs, after removing the testbed's orphans
    (another test run's guests and guests the testbed did not make count as needed)."""
    import libvirt

    from vmplacer.testbed.guests import cleanup_orphans

    conn = libvirt.open(uri)
    try:
        cleanup_orphans(conn)
        return sorted(d.name() for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE))
    finally:
        conn.close()


def down(dirs: StateDirs | None = None, only: list[str] | None = None) -> DownResult:
    """Stop the daemons `up` recorded (or just those in `only`); never any other.

    Testbed guests no live process owns are removed from a libvirtd about to
    stop, so no QEMU is left without its daemon. A libvirtd that still runs
    other guests (someone else's work, another test run) is left running, and
    so is its virtlogd.
    """
    dirs = dirs or StateDirs.default()
    result = DownResult()
    with _locked(dirs):
        started = _load_started(dirs)
        for key in _STOP_ORDER:
            entry = started.get(key)
            if entry is None or (only is not None and key not in only):
                continue
            host_name, daemon = key.split("/")
            uri = HOST1_URI if host_name == "host1" else HOST2_URI
            if daemon == "libvirtd" and process_alive(entry["pid"], daemon) and answers(uri):
                others = _guests_in_use(uri)
                if others:
                    result.left_running[key] = f"still runs guests in use: {', '.join(others)}"
                    continue
            if daemon == "virtlogd" and f"{host_name}/libvirtd" in result.left_running:
                result.left_running[key] = f"{host_name}/libvirtd still runs"
                continue
            if process_alive(entry["pid"], daemon):
                _stop_pid(entry["pid"], daemon)
                result.stopped.append(key)
            del started[key]
            _save_started(dirs, started)
        if "host2/libvirtd" not in started and "host2/libvirtd" not in result.left_running:
            cgroups.remove()
        _release_runtime_tmpfs(dirs, started, only, result)
        kvm = started.get(KVM_KEY)
        still_ours = [k for k in started if k.endswith("/libvirtd")]
        if kvm is not None and (only is None or KVM_KEY in only) and not still_ours:
            _restore_kvm_device(kvm)
            del started[KVM_KEY]
            _save_started(dirs, started)
            result.stopped.append(KVM_KEY)
    return result


def status(dirs: StateDirs | None = None) -> list[dict]:
    """One row per host daemon: pid, whether it answers, whether the testbed started it."""
    dirs = dirs or StateDirs.default()
    started = _load_started(dirs)
    rows = []
    for host in (host1(dirs), host2(dirs)):
        for daemon in ("virtlogd", "libvirtd"):
            key = f"{host.name}/{daemon}"
            pid = daemon_pid(host, daemon)
            ours = key in started and started[key]["pid"] == pid
            row = {"daemon": key, "pid": pid, "started_by_testbed": ours}
            if daemon == "libvirtd":
                row["uri"] = host.uri
                row["answers"] = answers(host.uri)
            rows.append(row)
    return rows
