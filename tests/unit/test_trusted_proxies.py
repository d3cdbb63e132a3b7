"""Whom a failed sign-in counts against: the connection's peer, unless it is a configured
trusted proxy, and then the right-most X-Forwarded-For address that is not one; and the
config's `api.trusted_proxies`, refused entry by entry with the rule broken."""

from __future__ import annotations

import pytest

from vmplacer.config import ConfigError, settings_from_mapping, settings_to_mapping
from vmplacer.web.guard import MAX_HOPS, client_address, limit_key, trusted_networks

PROXIES = trusted_networks(["10.0.0.0/8", "2001:db8:1::/48"])


def test_without_trusted_proxies_the_peer_is_the_client_whatever_the_headers_say():
    for forwarded in ([], ["198.51.100.7"], ["198.51.100.7, 203.0.113.9"], ["garbage"]):
        assert client_address("127.0.0.1", forwarded, ()) == "127.0.0.1"
        assert client_address("10.1.2.3", forwarded, ()) == "10.1.2.3"


def test_an_untrusted_peer_cannot_name_another_client():
    assert client_address("198.51.100.20", ["203.0.113.9"], PROXIES) == "198.51.100.20"
    assert client_address("2001:db8:2::5", ["203.0.113.9"], PROXIES) == "2001:db8:2::5"


def test_a_trusted_peer_names_the_right_most_address_that_is_not_a_proxy():
    assert client_address("10.0.0.1", ["203.0.113.9"], PROXIES) == "203.0.113.9"
    # the client's own claim (left of what the proxy appended) is never believed
    assert client_address("10.0.0.1", ["6.6.6.6, 203.0.113.9"], PROXIES) == "203.0.113.9"
    # a chain of proxies: the hops they vouch for are skipped
    assert client_address("10.0.0.1", ["6.6.6.6, 203.0.113.9, 10.9.9.9"], PROXIES) == "203.0.113.9"
    # several headers read as one list, in order
    assert client_address("10.0.0.1", ["6.6.6.6", "203.0.113.9, 10.9.9.9"], PROXIES) == "203.0.113.9"
    assert client_address("2001:db8:1::1", ["2001:db8:9::7"], PROXIES) == "2001:db8:9::7"


def test_ports_brackets_and_mapped_addresses_are_read_as_addresses():
    assert client_address("10.0.0.1", ["203.0.113.9:4711"], PROXIES) == "203.0.113.9"
    assert client_address("10.0.0.1", ["[2001:db8:9::7]:4711"], PROXIES) == "2001:db8:9::7"
    assert client_address("::ffff:10.0.0.1", ["::ffff:203.0.113.9"], PROXIES) == "203.0.113.9"


def test_what_is_no_address_stops_at_the_nearest_proxy_vouched_for():
    assert client_address("10.0.0.1", ["unknown"], PROXIES) == "10.0.0.1"
    assert client_address("10.0.0.1", ["203.0.113.9, _hidden, 10.9.9.9"], PROXIES) == "10.9.9.9"
    assert client_address("10.0.0.1", [], PROXIES) == "10.0.0.1"
    assert client_address("10.0.0.1", [" , "], PROXIES) == "10.0.0.1"


def test_only_trusted_hops_end_at_the_left_most_one():
    assert client_address("10.0.0.1", ["10.7.7.7, 10.8.8.8"], PROXIES) == "10.7.7.7"


def test_a_long_header_is_read_only_so_far_from_the_right():
    hops = ", ".join(["203.0.113.1"] + ["10.0.0.2"] * MAX_HOPS)
    assert client_address("10.0.0.1", [hops], PROXIES) == "10.0.0.2"


def test_a_peer_that_is_no_address_is_its_own_key():
    assert client_address("testclient", ["203.0.113.9"], PROXIES) == "testclient"
    assert limit_key("testclient") == "testclient"


def test_an_ipv6_client_counts_by_its_64():
    assert limit_key("2001:db8:9::7") == limit_key("2001:db8:9::8") == "2001:db8:9::/64"
    assert limit_key("2001:db8:9:1::7") != limit_key("2001:db8:9::7")
    assert limit_key("203.0.113.9") == "203.0.113.9"


def _problems(value: object) -> list[str]:
    try:
        settings_from_mapping({"api": {"trusted_proxies": value}}, "t.yaml", environ={})
    except ConfigError as exc:
        return list(exc.problems)
    return []


@pytest.mark.parametrize("value, where, rule", [
    (["10.0.0.1/8"], "api.trusted_proxies[0]", "host bits set"),
    (["10.0.0.0/8", "proxy.example"], "api.trusted_proxies[1]", "CIDR"),
    (["10.0.0.0/33"], "api.trusted_proxies[0]", "CIDR"),
    ([8], "api.trusted_proxies[0]", "CIDR"),
    ([""], "api.trusted_proxies[0]", "CIDR"),
    ("10.0.0.0/8", "api.trusted_proxies", "must be a list"),
    (["10.0.0.0/8"] * 65, "api.trusted_proxies", "at most 64"),
])
def test_a_bad_trusted_proxy_is_refused_naming_the_entry_and_the_rule(value, where, rule):
    problems = _problems(value)
    assert len(problems) == 1 and f"key '{where}'" in problems[0] and rule in problems[0], problems


def test_trusted_proxies_are_read_normalised_and_read_back_the_same():
    settings = settings_from_mapping({"api": {"trusted_proxies": ["127.0.0.1", " 10.0.0.0/8 ", "::1", "127.0.0.1/32"]}},
                                     "t.yaml", environ={})
    assert settings.api.trusted_proxies == ("127.0.0.1/32", "10.0.0.0/8", "::1/128")
    assert settings_from_mapping(settings_to_mapping(settings), "t.yaml", environ={}) == settings
    assert settings_from_mapping(None, "t", environ={}).api.trusted_proxies == ()
    assert settings_from_mapping({"api": {"trusted_proxies": None}}, "t", environ={}).api.trusted_proxies == ()
