"""The web view's two defences on its only POSTs (sign in, sign out): the request must come
from a page of this very site (Origin, else Referer — a cross-site form is refused even where
a browser would send a SameSite cookie after all), and a client that keeps failing to sign in
is slowed down (a token cannot be guessed at request rate)."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from urllib.parse import urlsplit

from fastapi import Request

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
