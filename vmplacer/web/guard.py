"""The web view's two defences on its only POSTs (sign in, sign out): the request must come
from a page of this very site (Origin, else Referer — a cross-site form is refused even where
a browser would send a SameSite cookie after all), and a client that keeps failing to sign in
is slowed down (a token cannot be guessed at request rate).

The client is the connection's peer. Only a peer inside `api.trusted_proxies` may name
another: then the right-most address of X-Forwarded-For that is not itself a trusted proxy
is the client (each proxy appends the address it saw, so everything left of that is the
client's own say and is never believed). An IPv6 client counts by its /64, the block one
machine is usually given, so hopping between its addresses buys no fresh quota."""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from urllib.parse import urlsplit

from fastapi import Request

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_HOPS = 32  # X-Forwarded-For entries read from the right; no proxy chain is longer
IPV6_CLIENT_PREFIX = 64

SIGN_IN_FAILURES = 5  # failed sign-ins a client may make per window ...
SIGN_IN_WINDOW_S = 60.0  # ... before it must wait; a success does not count
MAX_CLIENTS = 10_000  # clients remembered at once (the oldest is forgotten first)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else ""


def cross_site(request: Request) -> str:
    """Why this POST does not come from this site ("" when it does): its Origin, else its
    Referer, must be the origin the request was addressed to (scheme and Host, as uvicorn sees
    them behind a trusted proxy). A request with neither is refused: every browser sends Origin
    on a POST, so only a client that is not a browser sends none, and it has no use for /ui."""
    own = f"{request.url.scheme}://{request.url.netloc}".lower()
    origin = request.headers.get("origin")
    if origin is not None:
        return "" if origin.strip().lower() == own else f"Origin {origin[:100]!r} is not this site ({own})"
    referer = request.headers.get("referer")
    if referer is not None:
        return "" if _origin(referer) == own else f"Referer from another site (not {own})"
    return "neither Origin nor Referer says the form came from this site"


class SignInLimiter:
    """Failed sign-ins per client in a sliding window: `retry_after` says how long a client that
    used up its failures must wait (0: it may try). Thread-safe; memory bounded by MAX_CLIENTS."""

    def __init__(self, failures: int = SIGN_IN_FAILURES, window_s: float = SIGN_IN_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, max_clients: int = MAX_CLIENTS):
        self.failures = failures
        self.window_s = window_s
        self._clock = clock
        self._max = max_clients
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._seen.get(client)
        if times is None:
            return deque()
        while times and now - times[0] >= self.window_s:
            times.popleft()
        if not times:
            del self._seen[client]
        return times

    def retry_after(self, client: str) -> int:
        """Whole seconds until `client` may try again (0: now)."""
        with self._lock:
            now = self._clock()
            times = self._recent(client, now)
            if len(times) < self.failures:
                return 0
            return max(1, math.ceil(times[0] + self.window_s - now))

    def failed(self, client: str) -> None:
        with self._lock:
            now = self._clock()
            times = self._recent(client, now)
            if not times:
                self._seen[client] = times
            times.append(now)
            self._seen.move_to_end(client)
            while len(self._seen) > self._max:
                self._seen.popitem(last=False)


def trusted_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """`api.trusted_proxies` (checked when the config was read) as networks."""
    return tuple(ipaddress.ip_network(cidr) for cidr in cidrs)


def _address(text: str) -> Address | None:
    """An address as a peer or an X-Forwarded-For entry spells it (`198.51.100.7`,
    `198.51.100.7:4711`, `2001:db8::1`, `[2001:db8::1]:4711`), IPv4-mapped IPv6 as IPv4;
    None for anything else (`unknown`, an obfuscated name, garbage)."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _inside(address: Address, networks: Sequence[Network]) -> bool:
    return any(address.version == network.version and address in network for network in networks)


def client_address(peer: str, forwarded_for: Sequence[str], trusted: Sequence[Network]) -> str:
    """The client a request counts against: `peer` (the connection's), unless the peer is a
    trusted proxy; then the right-most X-Forwarded-For entry (of every such header, in order)
    that is not a trusted proxy. An entry that is no address stops the walk at the nearest
    proxy vouched for; a chain of trusted proxies only ends at its left-most entry."""
    nearest = _address(peer)
    if nearest is None or not _inside(nearest, trusted):
        return str(nearest) if nearest is not None else peer
    hops = [entry for header in forwarded_for for entry in header.split(",") if entry.strip()]
    for entry in reversed(hops[-MAX_HOPS:]):
        address = _address(entry)
        if address is None:
            break
        nearest = address
        if not _inside(address, trusted):
            break
    return str(nearest)


def limit_key(client: str) -> str:
    """What failed sign-ins are counted by: an IPv4 address, an IPv6 address's /64, or the
    peer's name as the server gave it (a Unix socket, a test client)."""
    address = _address(client)
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{address}/{IPV6_CLIENT_PREFIX}", strict=False))
    return client if address is None else str(address)
