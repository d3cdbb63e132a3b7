"""A real libvirtd (testbed host 2) that stops answering after vmplacer connected: the call in
flight fails once libvirt's keepalive gives up, instead of waiting forever. A relay between the
two stands for the network or the daemon going silent (the daemon itself keeps serving the
other tests)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from vmplacer.adapters.libvirt_host import LibvirtHost
from vmplacer.adapters.libvirt_open import KEEPALIVE_COUNT, KEEPALIVE_INTERVAL_S
from vmplacer.config import HostSettings
from vmplacer.ports import HypervisorError
from vmplacer.testbed import daemons

pytestmark = pytest.mark.integration


class SilencingRelay:
    """Forwards TCP connections to host 2's libvirtd until `silence()`; then drops every byte
    both ways while keeping the connections open (no reset the client could notice)."""

    def __init__(self) -> None:
        self.silent = threading.Event()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.uri = f"qemu+tcp://127.0.0.1:{self.listener.getsockname()[1]}/system"
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def silence(self) -> None:
        self.silent.set()

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", daemons.HOST2_PORT))
            self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if not self.silent.is_set():
                    sink.sendall(data)
        except OSError:
            pass


@pytest.fixture
def relay(testbed) -> Iterator[SilencingRelay]:
    relay = SilencingRelay()
    yield relay
    relay.close()


def test_a_call_to_a_daemon_gone_silent_fails_after_the_keepalive_instead_of_hanging(relay):
    host = LibvirtHost(HostSettings("h2", relay.uri, domain_type="qemu", domain_resync_s=0))
    try:
        assert host.ping()["driver"] == "QEMU"  # connected, keepalive on
        relay.silence()
        outcome: list[object] = []
        caller = threading.Thread(target=lambda: outcome.append(_ping(host)), daemon=True)
        caller.start()
        # keepalive closes the connection after interval x (count + 1) without a reply; four
        # times that leaves the machine's load room and still tells "fails" from "waits forever"
        caller.join(4 * KEEPALIVE_INTERVAL_S * (KEEPALIVE_COUNT + 1))
        assert outcome, "the call to the silent daemon is still waiting"
        failure = outcome[0]
        assert isinstance(failure, HypervisorError), failure
        assert "host h2" in str(failure) and "keepalive" in str(failure), failure
    finally:
        host.close()


def _ping(host: LibvirtHost) -> object:
    try:
        return host.ping()
    except HypervisorError as exc:
        return exc
