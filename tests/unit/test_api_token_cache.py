"""The token check answers from its cache on the event loop; only a miss asks the database."""

from __future__ import annotations

from vmplacer.api.auth import CACHE_TTL_S, MAX_TOKEN_LENGTH, Principal, TokenVerifier
from vmplacer.ports import TokenInfo


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _verifier(clock: Clock, looked_up: list[str]) -> TokenVerifier:
    def lookup(token: str) -> TokenInfo | None:
        looked_up.append(token)
        return TokenInfo("ops", "admin", 0.0, None, 7) if token == "good" else None

    return TokenVerifier(lookup, clock=clock)


def test_a_token_is_a_cache_hit_only_after_the_database_said_yes_and_for_the_ttl():
    clock, looked_up = Clock(), []
    verifier = _verifier(clock, looked_up)
    assert verifier.cached("good") is None and looked_up == []  # never asks the database itself
    assert verifier.verify("good") == Principal("ops", "admin", 7) and looked_up == ["good"]
    clock.now += CACHE_TTL_S - 0.1
    assert verifier.cached("good") == Principal("ops", "admin", 7) and looked_up == ["good"]
    clock.now += 0.2
    assert verifier.cached("good") is None  # stale: a revoked token stops within the TTL


def test_unknown_empty_and_oversized_tokens_are_never_hits():
    clock, looked_up = Clock(), []
    verifier = _verifier(clock, looked_up)
    assert verifier.verify("bad") is None
    assert verifier.cached("bad") is None and verifier.cached("") is None
    assert verifier.cached("x" * (MAX_TOKEN_LENGTH + 1)) is None
    verifier.verify("good")
    verifier.forget_all()
    assert verifier.cached("good") is None
